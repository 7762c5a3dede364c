"""The ``engine`` config section: which rollout engine serves the policy, and its settings.

Beside the rollout code that reads it; the config tree (``spade.train_config``) imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..config import require
from .sglang.settings import SGLangSection

# Padded prompt tokens per hf prefill forward: 4 rows of a 2,000-token designer prompt (on
# SmolLM2-135M such a forward takes about 0.7 GB besides the KV cache; all 16 at once took 3 GB).
DEFAULT_PREFILL_CHUNK_TOKENS = 8192


@dataclass(frozen=True)
class EngineSection:
    kind: Literal["hf", "sglang"] = "hf"  # hf: in-process transformers (CPU, one GPU); sglang: servers
    max_batch_size: int = 8  # hf only
    batch_wait_ms: float = 2.0  # hf only
    device: Literal["auto", "cpu", "cuda"] = "auto"  # hf only
    prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS  # hf only: padded prompt tokens per prefill forward; 0: all rows at once
    sglang: SGLangSection = field(default_factory=SGLangSection)

    def __post_init__(self) -> None:
        require(self.max_batch_size >= 1, "engine.max_batch_size", f"must be >= 1, got {self.max_batch_size}")
        require(self.batch_wait_ms >= 0, "engine.batch_wait_ms", f"must be >= 0, got {self.batch_wait_ms}")
        require(self.prefill_chunk_tokens >= 0, "engine.prefill_chunk_tokens",
                f"must be >= 0 (0: all rows at once), got {self.prefill_chunk_tokens}")
