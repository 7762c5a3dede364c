"""The seeds every random choice of the self-play step comes from (corpus documents, sampling,
plays, pool draws): one stable hash of the choice's coordinates, the same in every process and run,
so a resumed run draws what the straight run would."""

from __future__ import annotations

import hashlib
from typing import Any


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from ``parts`` (same in every process and Python run)."""
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF


def reset_seed(seed: int, step: int, env_id: str, index: int, *, hinted: bool, paired: bool = True) -> int:
    """The reset seed of play ``index`` of ``env_id`` at ``step``. ``paired`` (spade's default): the
    hinted and the no-hint arm's play ``index`` share it, so the regret compares like with like.
    Not paired (``selfplay.plays.reset_seeds: independent``, the paper's Figure 4 and its released
    code, where the no-hint arm resets unseeded and the hinted arm from a hash of the file name and
    ``index``, ``core/orchestrator.py:342`` and ``1950-1974``): the hinted arm draws from its own
    stream, and the no-hint arm keeps the paired seed."""
    if hinted and not paired:
        return derive_seed(seed, "reset", "hint", step, env_id, index)
    return derive_seed(seed, "reset", step, env_id, index)
