"""How plays are run (``selfplay.plays``): how many at a time and how often retried, what a play
becomes for training, which samples the stabilisers leave out, and where spade and the paper's
released code differ.

The keys of the first kind carry their comments at their fields below; they were flat ``selfplay``
keys before this section (:data:`MOVED_PLAY_KEYS`: a config that still uses one loads with a
warning naming the new key). The keys where spade and the released code differ default to spade's
behaviour; the other value does what the released trainer (spade-rl/spade at 9b2b813) does, so a
reproduction recipe can select it by name. The released file and line of each is below and in
docs/fidelity.md ("Plays, environments, admission").

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
  ``selfplay.plays.tool_mask_malformed_calls`` is on. ``any_format_error`` (spade): every reply the
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
from typing import Any, Literal, Sequence, TypeVar

from ...config import require

ResetSeeds = Literal["paired", "independent"]
EnvFaults = Literal["score_zero", "retry_then_drop"]
HintArmBudgets = Literal["like_nohint", "released"]
ToolMaskScope = Literal["any_format_error", "tool_call_block"]
RESET_SEEDS: tuple[str, ...] = ("paired", "independent")
ENV_FAULTS: tuple[str, ...] = ("score_zero", "retry_then_drop")
HINT_ARM_BUDGETS: tuple[str, ...] = ("like_nohint", "released")
TOOL_MASK_SCOPES: tuple[str, ...] = ("any_format_error", "tool_call_block")
AgentSampleForm = Literal["sequence", "per_turn"]
AGENT_SAMPLE_FORMS: tuple[str, ...] = ("sequence", "per_turn")
# released play_games_async(max_attempts=2): one retry of a play that raised (core/orchestrator.py:1498)
RELEASED_FAULT_RETRIES = 1

_WHERE = "selfplay.plays"
T = TypeVar("T")


@dataclass(frozen=True)
class PlayRules:
    # Plays running at once (with rollout shards: per shard)
    max_concurrent: int = 64
    # retries of a play (or an admission) after an InfrastructureFault
    max_retries: int = 3
    # episodes kept on disk per arm per env per step (0: returns only)
    keep_trajectories: int = 4
    # What a no-hint play becomes for training (spade.selfplay.plays.turn_samples): "sequence" (one
    # token-exact sample per episode, every turn's reasoning kept) or "per_turn" (the released 8B
    # thinking actor: each turn's prompt is the template's rendering of the messages so far, earlier
    # reasoning dropped, one sample per turn, each with the episode's advantage). Games only.
    sample_form: AgentSampleForm = "sequence"
    # Stabilisers (off in the paper's games recipes): leave out the agent samples of an environment
    # whose no-hint returns are all equal (zero advantage, nothing to learn); mask_truncated below
    # is the other.
    drop_equal_return_groups: bool = False
    refill_equal_groups: int = 0      # extra rounds of g_nohint plays for an all-equal group before it is dropped
    # Stabiliser: a sample whose episode was cut by the token or turn budget gets no loss (the
    # paper's tool-use runs did)
    mask_truncated: bool = False
    # Tool use: whether the tokens of a malformed tool call carry loss. Default True = masked
    # (mask 0), as the paper's code did: the -0.1 format penalty still reaches the episode's return
    # only through the return rule, and the garbled call itself is not reinforced or punished.
    tool_mask_malformed_calls: bool = True
    reset_seeds: ResetSeeds = "paired"
    env_faults: EnvFaults = "score_zero"
    hint_arm_budgets: HintArmBudgets = "like_nohint"
    tool_mask_scope: ToolMaskScope = "any_format_error"
    released_loader_names: bool = False
    hint_turn_timeout_s: float | None = None
    nohint_play_timeout_s: float | None = None

    def __post_init__(self) -> None:
        for name, minimum in (("max_concurrent", 1), ("max_retries", 0), ("keep_trajectories", 0),
                              ("refill_equal_groups", 0)):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum, f"{_WHERE}.{name}",
                    f"must be an integer >= {minimum}, got {value!r}")
        require(self.refill_equal_groups == 0 or self.drop_equal_return_groups, f"{_WHERE}.refill_equal_groups",
                "refills only the groups drop_equal_return_groups would drop: switch that on too")
        for name in ("drop_equal_return_groups", "mask_truncated", "tool_mask_malformed_calls"):
            require(isinstance(getattr(self, name), bool), f"{_WHERE}.{name}",
                    f"must be true or false, got {getattr(self, name)!r}")
        for name, choices in (("sample_form", AGENT_SAMPLE_FORMS), ("reset_seeds", RESET_SEEDS), ("env_faults", ENV_FAULTS),
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


# The flat selfplay keys the first fields of this section replaced, with where each value goes now
# (paths relative to selfplay). spade.config.from_mapping applies this table (SelfPlaySettings.MOVED_KEYS).
MOVED_PLAY_KEYS: dict[str, Any] = {
    "max_concurrent_episodes": "plays.max_concurrent",
    "max_play_retries": "plays.max_retries",
    "keep_trajectories": "plays.keep_trajectories",
    "agent_sample_form": "plays.sample_form",
    "drop_equal_return_groups": "plays.drop_equal_return_groups",
    "refill_equal_groups": "plays.refill_equal_groups",
    "mask_truncated": "plays.mask_truncated",
    "tool_mask_malformed_calls": "plays.tool_mask_malformed_calls",
}


def fill_round_robin(samples: Sequence[T], target: int) -> list[T]:
    """``samples`` repeated in turn, from the first, until there are ``target`` of them (as many as
    there are when already enough, none when there are none): the released
    ``upsample_trajectories`` (``core/utils/trajectory_build.py:125-160``), which fills the batch
    after dropped plays with copies that keep their rewards and advantages."""
    out = list(samples)
    for i in range(max(0, target - len(out)) if out else 0):
        out.append(samples[i % len(samples)])
    return out
