"""The ``engine`` config section: which rollout engine serves the policy, and its settings.

Beside the rollout code that reads it; the config tree (``spade.train_config``) imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..config import require
from .sglang.settings import SGLangSection


@dataclass(frozen=True)
class EngineSection:
    kind: Literal["hf", "sglang"] = "hf"  # hf: in-process transformers (CPU, one GPU); sglang: servers
    max_batch_size: int = 8  # hf only
    batch_wait_ms: float = 2.0  # hf only
    device: Literal["auto", "cpu", "cuda"] = "auto"  # hf only
    sglang: SGLangSection = field(default_factory=SGLangSection)

    def __post_init__(self) -> None:
        require(self.max_batch_size >= 1, "engine.max_batch_size", f"must be >= 1, got {self.max_batch_size}")
        require(self.batch_wait_ms >= 0, "engine.batch_wait_ms", f"must be >= 0, got {self.batch_wait_ms}")
