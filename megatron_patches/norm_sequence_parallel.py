"""Sequence-parallel support for ``megatron.core.transformer.torch_norm.WrappedTorchNorm``.

``WrappedTorchNorm.__new__`` (the norm of the local, non-TE layer spec) asserts
``not config.sequence_parallel``. Sequence parallelism is required for MoE with tensor parallelism,
and a norm needs nothing special under it: each rank normalises its own slice of the sequence with
the same weights. What does need care is the gradient: each rank only sees part of the sequence,
so the norm weights' gradients must be summed over the tensor-parallel group. Megatron's
``finalize_model_grads`` does exactly that for parameters tagged ``sequence_parallel=True`` (what
TE's norms do themselves).

The replacement builds the norm through the upstream ``__new__`` with a view of the config that
reports ``sequence_parallel=False``, then tags the parameters.

The assertion does not depend on the device, so this patch applies with CUDA too: a GPU machine
without Transformer Engine (the local spec's RMSNorm is always this torch norm) would otherwise
fail to build any sequence-parallel model. With Transformer Engine the TE spec's norms are used and
this replacement is never called.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.transformer.torch_norm import WrappedTorchNorm

from ._util import original_of, replace

NAME = "norm_sequence_parallel"


class _WithoutSequenceParallel:
    """Read-only view of a TransformerConfig that hides ``sequence_parallel``."""

    def __init__(self, config: Any):
        self._config = config

    def __getattr__(self, name: str) -> Any:
        if name == "sequence_parallel":
            return False
        return getattr(self._config, name)


def new_with_sequence_parallel(
    cls, config, hidden_size: int, eps: float = 1e-5, **kwargs
) -> torch.nn.Module:
    """Build the torch norm; under sequence parallelism tag its parameters for the TP all-reduce."""
    upstream_new = original_of(WrappedTorchNorm, "__new__")
    upstream_new = getattr(upstream_new, "__func__", upstream_new)
    if not config.sequence_parallel:
        return upstream_new(cls, config, hidden_size, eps, **kwargs)
    norm = upstream_new(cls, _WithoutSequenceParallel(config), hidden_size, eps, **kwargs)
    for param in norm.parameters():
        param.sequence_parallel = True
    return norm


def apply() -> bool:
    return replace(WrappedTorchNorm, "__new__", staticmethod(new_with_sequence_parallel))
