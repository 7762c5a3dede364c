"""``selfplay.pool``: how the Fixed-env GRPO baseline draws its sets from a pool directory
(:mod:`spade.selfplay.sources.fixed_pool`).

* ``draw: shuffle`` (default, the released trainer's rule: ``--spade-static-game-pool
  --spade-no-replacement`` in ``cmd/games/_train_fixed_gpt55.sh``): one ``random.Random(seed)``
  shuffles the sorted names once per pass and each set is the next ``envs_per_set`` of that order;
  skills play no part.
* ``draw: balanced`` (this project's variant): slot ``i`` gets an environment of the curriculum's
  skill for that slot, as in a SPADE set, falling back to any skill when the pass has none left.

``seed``: the released ``--spade-fixed-pool-seed`` default 42, fixed whatever the run's seed;
null takes ``run.seed`` instead.

``released_loader_names`` (default false; the baseline recipe turns it on): load each pool game as
the released trainer loads it, with the common standard-library names its loader binds in every
game's module (``deque``, ``math``, ``random``, ``Counter``, the typing names, ...) bound before the
game runs, by the sandboxed child itself (:mod:`spade.envs.sandbox.runtime.loader_names`). Off, a
pool game loads as a designed environment does: it must import what it uses (the paper's rule for
designed games). numpy, also in the released table, is not importable in the sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...config import require

PoolDraw = Literal["shuffle", "balanced"]
POOL_DRAWS: tuple[str, ...] = ("shuffle", "balanced")
RELEASED_POOL_SEED = 42


@dataclass(frozen=True)
class PoolSettings:
    draw: PoolDraw = "shuffle"
    seed: int | None = RELEASED_POOL_SEED
    released_loader_names: bool = False

    def __post_init__(self) -> None:
        require(self.draw in POOL_DRAWS, "selfplay.pool.draw",
                f"{self.draw!r} is not allowed; choose one of: {', '.join(POOL_DRAWS)}")
        require(self.seed is None or (isinstance(self.seed, int) and not isinstance(self.seed, bool)),
                "selfplay.pool.seed", f"must be an integer or null (the run seed), got {self.seed!r}")
        require(isinstance(self.released_loader_names, bool), "selfplay.pool.released_loader_names",
                f"must be true or false, got {self.released_loader_names!r}")
