"""Fix for ``megatron.core.transformer.moe.moe_utils.RouterGatingLinearFunction``.

``RouterGatingLinearFunction.forward/backward`` test ``te_general_gemm is not None``, but the name
is only bound when transformer-engine imports successfully; without TE the router fails with a
NameError. That is an upstream bug that hits GPU machines without TE as well, so unlike the other
patches this one does not depend on CUDA: it binds the name to ``None`` exactly when it is missing,
which selects the plain ``torch.mm`` path that was intended.
"""

from __future__ import annotations

from megatron.core.transformer.moe import moe_utils

NAME = "moe_gemm"


def apply() -> bool:
    if hasattr(moe_utils, "te_general_gemm"):
        return False
    moe_utils.te_general_gemm = None
    return True
