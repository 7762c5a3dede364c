"""How a step's batch is sized and assembled where spade and the released code differ (config
section ``selfplay.batch``). The defaults keep spade's behaviour; the other values are the released
code's (``spade-rl/spade@9b2b813``; docs/fidelity.md, "Training signal (issue 39)").

* ``nohint_plays``: ``g_nohint`` (spade) plays every environment ``selfplay.g_nohint`` times per
  step; ``global_batch`` (released, ``core/orchestrator.py:2382``) plays it
  ``ceil(global_batch / admitted environments)`` times, so a set with fewer admitted environments
  gets more plays each.
* ``cut_to_global_batch``: false (spade) trains every sample of the step, agent samples first;
  true (released, ``slime/spade_rollout.py:666`` and ``:836-842``) puts the released designer
  samples first and cuts the step's samples to ``global_batch``, so the surplus agent samples at
  the end are not trained (their group's advantages are computed before the cut). The
  orchestrator hands it episodes, so the turn samples of a ``per_turn`` episode are kept or cut
  together and the cut counts episodes (released: the cut comes before the thinking fan-out).
* ``release_at_final_step``: false (spade) leaves the designer samples still waiting when the run
  ends untrained; true (released, ``slime/spade_rollout.py:557-561``) releases every waiting
  designer sample at the run's last step, the set generated at that step too, scored on the plays
  seen so far and centred per skill together.
* ``global_batch``: the released global batch (192, ``--global-batch-size``,
  ``cmd/games/train_spade_4b.sh:78``); read only by the two rules above.

Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence, TypeVar

from ..config import require

NohintPlays = Literal["g_nohint", "global_batch"]
NOHINT_PLAYS: tuple[str, ...] = ("g_nohint", "global_batch")
T = TypeVar("T")


@dataclass(frozen=True)
class BatchRules:
    global_batch: int = 192
    nohint_plays: NohintPlays = "g_nohint"
    cut_to_global_batch: bool = False
    release_at_final_step: bool = False

    def __post_init__(self) -> None:
        require(self.nohint_plays in NOHINT_PLAYS, "selfplay.batch.nohint_plays",
                f"{self.nohint_plays!r} is not allowed; choose one of: {', '.join(NOHINT_PLAYS)}")
        require(isinstance(self.global_batch, int) and not isinstance(self.global_batch, bool)
                and self.global_batch >= 1, "selfplay.batch.global_batch",
                f"must be an integer >= 1, got {self.global_batch!r}")
        for name in ("cut_to_global_batch", "release_at_final_step"):
            require(isinstance(getattr(self, name), bool), f"selfplay.batch.{name}",
                    f"must be true or false, got {getattr(self, name)!r}")

    def plays_per_env(self, g_nohint: int, n_envs: int) -> int:
        """No-hint plays of each environment of a set of ``n_envs`` (``g_nohint`` for an empty set)."""
        if self.nohint_plays == "g_nohint" or n_envs < 1:
            return g_nohint
        return math.ceil(self.global_batch / n_envs)

    def assemble(self, agents: Sequence[T], designers: Sequence[T]) -> list[T]:
        """The step's samples in training order: agents then designers (spade), or designers first
        and cut to ``global_batch`` (released)."""
        if not self.cut_to_global_batch:
            return [*agents, *designers]
        return [*designers, *agents][: self.global_batch]
