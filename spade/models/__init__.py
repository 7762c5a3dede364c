"""Model architectures for the Megatron backend: HF config reading, GPTModel building and the
HF <-> Megatron weight map (one declarative table per architecture)."""

from .hf_config import SUPPORTED_ARCHITECTURES, ModelSpec, MoESpec, read_model_spec
from .layout import ParallelLayout, RankCoords

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "ModelSpec",
    "MoESpec",
    "ParallelLayout",
    "RankCoords",
    "read_model_spec",
]
