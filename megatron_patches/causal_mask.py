"""CPU replacements for ``megatron.core.transformer.utils.get_default_causal_mask`` and
``get_sliding_window_causal_mask``.

When the model is called with ``attention_mask=None`` the unfused softmax
(``megatron.core.fusions.fused_softmax.FusedScaleMaskSoftmax.forward_torch_softmax``) builds a
causal mask with ``device="cuda"``. The replacements build the same boolean masks (True = masked)
on the CPU. ``fused_softmax`` imported both functions by name, so both module namespaces are
patched.
"""

from __future__ import annotations

import torch
from megatron.core.fusions import fused_softmax
from megatron.core.transformer import utils as transformer_utils

from ._util import cuda_available, replace

NAME = "causal_mask"


def causal_mask_on_cpu(sq: int) -> torch.Tensor:
    """``[sq, sq]`` mask that hides every key after the query position."""
    return torch.ones(sq, sq, dtype=torch.bool).triu(diagonal=1)


def sliding_window_mask_on_cpu(sq: int, skv: int, window_size) -> torch.Tensor:
    """``[sq, skv]`` mask that hides keys outside ``(left, right)`` of the aligned diagonal."""
    left, right = window_size
    allowed = torch.ones(sq, skv, dtype=torch.bool)
    allowed = allowed.triu(diagonal=skv - sq - left).tril(diagonal=skv - sq + right)
    return ~allowed


def apply() -> bool:
    if cuda_available():
        return False
    changed = False
    for module in (transformer_utils, fused_softmax):
        changed |= replace(module, "get_default_causal_mask", causal_mask_on_cpu)
        changed |= replace(module, "get_sliding_window_causal_mask", sliding_window_mask_on_cpu)
    return changed
