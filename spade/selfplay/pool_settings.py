"""``selfplay.pool``: how the Fixed-env GRPO baseline draws its sets from a pool directory
(:mod:`spade.selfplay.pool`).

* ``draw: shuffle`` (default, the released trainer's rule: ``--spade-static-game-pool
  --spade-no-replacement`` in ``cmd/games/_train_fixed_gpt55.sh``): one ``random.Random(seed)``
  shuffles the sorted names once per pass and each set is the next ``envs_per_set`` of that order;
  skills play no part.
* ``draw: balanced`` (this project's variant): slot ``i`` gets an environment of the curriculum's
  skill for that slot, as in a SPADE set, falling back to any skill when the pass has none left.

``seed``: the released ``--spade-fixed-pool-seed`` default 42, fixed whatever the run's seed;
null takes ``run.seed`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..config import require

PoolDraw = Literal["shuffle", "balanced"]
POOL_DRAWS: tuple[str, ...] = ("shuffle", "balanced")
RELEASED_POOL_SEED = 42


@dataclass(frozen=True)
class PoolSettings:
    draw: PoolDraw = "shuffle"
    seed: int | None = RELEASED_POOL_SEED

    def __post_init__(self) -> None:
        require(self.draw in POOL_DRAWS, "selfplay.pool.draw",
                f"{self.draw!r} is not allowed; choose one of: {', '.join(POOL_DRAWS)}")
        require(self.seed is None or (isinstance(self.seed, int) and not isinstance(self.seed, bool)),
                "selfplay.pool.seed", f"must be an integer or null (the run seed), got {self.seed!r}")
