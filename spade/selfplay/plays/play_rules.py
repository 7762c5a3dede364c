"""How plays are run where spade and the paper's released code differ (``selfplay.plays``).

Every key defaults to spade's behaviour; the other value does what the released trainer
(spade-rl/spade at 9b2b813) does, so a reproduction recipe can select it by name. The released
file and line of each is in the comment beside it and in docs/fidelity.md ("Plays, environments,
admission").

- ``reset_seeds``: ``paired`` (spade): play ``i`` of the hinted and of the no-hint arm reset their
  environment with one seed, so the regret compares the same draws. ``independent`` (the paper's
  Figure 4 and the released code: the no-hint arm calls ``reset()`` without a seed,
  ``core/orchestrator.py:342``, the hinted arm ``reset(seed=hash(file + str(i)) % 2**31)``,
  ``core/orchestrator.py:1950-1974``): each arm draws its own seeds.
- ``env_faults``: what happens to a play whose environment raises or times out in load, reset or
  step. ``score_zero`` (spade): the play ends with return 0 and is scored like any other.
  ``retry_then_drop`` (released ``play_games_async``, ``core/orchestrator.py:1492-1631``): a raising
  play is played once more, then dropped; a timed-out play is dropped at once and its environment
  is hung: the environment's first no-hint play of a step runs before its others (the released
  canary), a hung environment's plays not yet started are skipped and it is not played again
  until the next regeneration (``core/orchestrator.py:2355-2369``); the surviving no-hint samples
  are repeated in turn until the step has as many as it asked for (``upsample_trajectories``,
  ``core/orchestrator.py:2607-2620``), whole episodes with ``per_turn`` samples. The hinted arm keeps scoring a fault 0 (released
  ``_play_game_with_hint_async`` returns 0.0, ``core/orchestrator.py:1826-1836``).
- ``hint_arm_budgets``: ``like_nohint`` (spade): the hinted arm ends on the same context budget and
  the same cut-off reply rule as the no-hint arm. ``released`` (games; released
  ``_play_game_with_hint_async``, ``core/orchestrator.py:1861-1905``): the hinted arm has only the
  turn budget: no context-budget stop, every reply asks for the full ``sampling.agent.max_tokens``, and a
  reply cut by its token limit is played as an action instead of ending the episode.
- ``tool_mask_scope``: which malformed tool-use replies lose their loss when
  ``selfplay.tool_mask_malformed_calls`` is on. ``any_format_error`` (spade): every reply the
  runner reads as a format error. ``tool_call_block`` (released, ``core/orchestrator.py:924-931``):
  only a reply that holds a ``<tool_call>`` block; prose without a call keeps its loss.
- ``released_loader_names``: designed games (admission and plays) are loaded with the released
  loader's pre-bound standard-library names (``core/envs/synthetic_game_env.py:43-104``;
  :mod:`spade.envs.sandbox.runtime.loader_names`); numpy among them only where the sandbox offers
  it (``sandbox.offer_numpy``). False (spade): a game imports what it uses.
- ``hint_turn_timeout_s`` (games): a bound in seconds on each reply of a hinted play; a reply that
  runs over ends the play unfinished (return 0), and it is scored (released ``ACTOR_TURN_TIMEOUT``
  300 s, ``core/orchestrator.py:28``, used at ``:1866-1884``: the turn loop breaks and the play's
  return is that of an episode that did not terminate). Tool use's hinted plays had no bound.
- ``nohint_play_timeout_s``: a bound in seconds on each attempt of a no-hint play, environment and
  replies together; a play that runs over is dropped, not retried and never scored (released
  ``per_game_timeout`` 300 s, ``core/orchestrator.py:1521-1541``); with ``retry_then_drop`` the
  step's samples are filled up as for a fault. null (spade, both): no bound beyond the engine's own
  request timeout (:mod:`.play_bounds`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence, TypeVar

from ...config import require

ResetSeeds = Literal["paired", "independent"]
EnvFaults = Literal["score_zero", "retry_then_drop"]
HintArmBudgets = Literal["like_nohint", "released"]
ToolMaskScope = Literal["any_format_error", "tool_call_block"]
RESET_SEEDS: tuple[str, ...] = ("paired", "independent")
ENV_FAULTS: tuple[str, ...] = ("score_zero", "retry_then_drop")
HINT_ARM_BUDGETS: tuple[str, ...] = ("like_nohint", "released")
TOOL_MASK_SCOPES: tuple[str, ...] = ("any_format_error", "tool_call_block")
# released play_games_async(max_attempts=2): one retry of a play that raised (core/orchestrator.py:1498)
RELEASED_FAULT_RETRIES = 1

_WHERE = "selfplay.plays"
T = TypeVar("T")


@dataclass(frozen=True)
class PlayRules:
    reset_seeds: ResetSeeds = "paired"
    env_faults: EnvFaults = "score_zero"
    hint_arm_budgets: HintArmBudgets = "like_nohint"
    tool_mask_scope: ToolMaskScope = "any_format_error"
    released_loader_names: bool = False
    hint_turn_timeout_s: float | None = None
    nohint_play_timeout_s: float | None = None

    def __post_init__(self) -> None:
        for name, choices in (("reset_seeds", RESET_SEEDS), ("env_faults", ENV_FAULTS),
                              ("hint_arm_budgets", HINT_ARM_BUDGETS), ("tool_mask_scope", TOOL_MASK_SCOPES)):
            value = getattr(self, name)
            require(value in choices, f"{_WHERE}.{name}",
                    f"{value!r} is not allowed; choose one of: {', '.join(choices)}")
        require(isinstance(self.released_loader_names, bool), f"{_WHERE}.released_loader_names",
                f"must be true or false, got {self.released_loader_names!r}")
        for name in ("hint_turn_timeout_s", "nohint_play_timeout_s"):
            bound = getattr(self, name)
            require(bound is None or (isinstance(bound, (int, float)) and not isinstance(bound, bool) and bound > 0),
                    f"{_WHERE}.{name}", f"must be a number of seconds > 0 or null (no bound), got {bound!r}")

    @property
    def drops_faults(self) -> bool:
        return self.env_faults == "retry_then_drop"


def fill_round_robin(samples: Sequence[T], target: int) -> list[T]:
    """``samples`` repeated in turn, from the first, until there are ``target`` of them (as many as
    there are when already enough, none when there are none): the released
    ``upsample_trajectories`` (``core/utils/trajectory_build.py:125-160``), which fills the batch
    after dropped plays with copies that keep their rewards and advantages."""
    out = list(samples)
    for i in range(max(0, target - len(out)) if out else 0):
        out.append(samples[i % len(samples)])
    return out
