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
