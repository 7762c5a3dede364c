"""``selfplay.partial_rollouts``: partial rollouts (issue 26), the design and its setting.

Status: built for the games domain (``carried_plays.py``, ``Player.play_groups`` in ``player.py``,
``partial_plays.py``, all in ``spade/selfplay/plays/``; docs/partial_rollouts.md). ``enabled: false`` (the
default) is today's synchronous schedule bit for bit. ``enabled: true`` is refused with a
:class:`~spade.config.ConfigError` naming this key for ``selfplay.domain: tool_use`` (a tool episode's
calls are not replayed) and with ``selfplay.plays.refill_equal_groups`` > 0. A stopped play is carried from its last
turn boundary: the reply the engine was writing when the step stopped is cancelled and sampled again
(same seed, newer weights) when the play continues.

Design
------
*Group.* In spade a group is every play of one environment in one arm of a step: the ``g_nohint``
no-hint plays of an environment (their GRPO advantages are normalised over all of them, SPEC 2) and,
on a regeneration step, its ``g_hint`` hinted plays (the designer's regret compares the two arms'
mean returns over all of them, SPEC 1). A group trains or scores only when all of its plays are done;
a group is never trained on a subset of its plays.

*Over-sampling, and why not the other way.* slime's APRIL (``--partial-rollout``,
``--over-sampling-batch-size``) starts generation for more prompt groups than the step needs, stops
("aborts") the engine once enough groups are complete, and puts the unfinished samples back into the
data buffer with their tokens so far, so the next step continues them. Its prompts are independent
draws from a dataset, so which groups finish first does not change what a group means. In spade the
step's environments are a fixed set of ``envs_per_set`` (the designer's set, SPEC 1): finishing only
the fastest environments' groups would bias training towards environments with short episodes and
break the per-set curriculum. So spade's over-sampling is within the set, not across it: every
environment of the set starts its groups; the step ends when ``ceil(complete_fraction * envs_per_set)``
no-hint groups are complete; the unfinished plays of the remaining groups are carried into the next
step from their exact token state and their groups train there, whole, when their last play ends.
An environment is never dropped for being slow, only delayed, at most ``max_carry_steps`` steps (an
episode still unfinished then is dropped as ``aborted`` with its whole group, logged).

*Regeneration steps.* The designer rewards of a regeneration step need every play, hinted and
no-hint, of every environment of the ending set (SPEC 1's regret and its admission statistics). A
regeneration step therefore waits for all of its plays (no carry out of it), and carried plays of the
ending set must finish before the step's designer rewards are computed; carrying across a set change
is refused.

*Carried state.* A carried play keeps its prompt, the tokens generated so far with their per-token
behaviour log-probs and the weight version that sampled each token; it finishes under newer weights
and the trainer's TIS correction uses those per-token log-probs. The environment is rebuilt in a
fresh sandbox instance by replaying the episode's actions from its reset seed; the replayed
observations must equal the recorded ones, else the play is dropped as ``aborted``. Carried plays
are part of the orchestrator's checkpoint so a kill and resume continues them exactly.

*Metrics.* ``rollout/carried_over`` (plays carried out of the step), ``rollout/aborted`` (plays
dropped), ``rollout/carried_groups`` (groups carried out), ``rollout/completed`` (plays of the groups
that completed in the step, carried ones included), and the policy-lag histogram of the trained tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import ConfigError, require

_KEY = "selfplay.partial_rollouts"


@dataclass(frozen=True)
class PartialRolloutSettings:
    enabled: bool = False
    # The step ends once this fraction of the set's no-hint groups is complete (1.0 = wait for all).
    complete_fraction: float = 0.75
    # A play carried more than this many steps is dropped as aborted, with its group.
    max_carry_steps: int = 1

    def __post_init__(self) -> None:
        require(isinstance(self.enabled, bool), f"{_KEY}.enabled", f"must be true or false, got {self.enabled!r}")
        fraction = self.complete_fraction
        require(isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0.0 < fraction <= 1.0,
                f"{_KEY}.complete_fraction", f"must be a number in (0, 1], got {fraction!r}")
        require(isinstance(self.max_carry_steps, int) and not isinstance(self.max_carry_steps, bool)
                and self.max_carry_steps >= 1, f"{_KEY}.max_carry_steps",
                f"must be an integer >= 1, got {self.max_carry_steps!r}")


def refuse_unsupported(settings: PartialRolloutSettings, *, domain: str, refill_equal_groups: int) -> None:
    """The orchestrator calls this: partial rollouts carry game plays only (a tool episode's calls
    are not replayed), and not with the refill of flat groups (a refill round needs its group's
    returns, which a carried group does not have yet)."""
    if not settings.enabled:
        return
    if domain != "games":
        raise ConfigError(f"{_KEY}.enabled: true needs selfplay.domain: games (got {domain!r}): tool episodes "
                          "are not carried across steps; allowed with tool_use: false")
    if refill_equal_groups:
        raise ConfigError(f"{_KEY}.enabled: true needs selfplay.plays.refill_equal_groups: 0 (got "
                          f"{refill_equal_groups}); allowed: false, or plays.refill_equal_groups 0")
