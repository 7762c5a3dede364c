"""CPU replacement for ``megatron.core.transformer.moe.router.Router.gating``.

Upstream ``gating`` moves the router weight (and bias) to ``torch.cuda.current_device()`` whenever
it finds them on the CPU (the router is always created on the CPU). The replacement leaves the
parameters where they are and computes the same logits through ``router_gating_linear`` in the
configured router dtype.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.moe import router as router_module

from ._util import cuda_available, replace

NAME = "moe_router"

_ROUTER_DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


def gating_in_place(self: router_module.Router, input: torch.Tensor) -> torch.Tensor:
    """Router logits ``input @ weight.T (+ bias)`` without moving the parameters."""
    dtype = _ROUTER_DTYPES.get(self.config.moe_router_dtype, input.dtype)
    return router_module.router_gating_linear(input, self.weight, self.bias, dtype)


def apply() -> bool:
    if cuda_available():
        return False
    return replace(router_module.Router, "gating", gating_in_place)
