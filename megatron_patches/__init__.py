"""Patches that let megatron-core 0.16.1 run on CPU with the gloo backend, and fix its bugs without TE.

``apply_all()`` is the one call a process makes, before building any Megatron model. It checks the
installed megatron-core version (the patches replace specific upstream functions and are only
known to be right for the pinned version), then applies every patch module in ``PATCHES``. The CPU
patches are no-ops when CUDA is available; four fix upstream bugs that do not depend on the device
(``moe_gemm``: a name missing without TE; ``norm_sequence_parallel``: the torch norm of the local
spec refuses sequence parallelism; ``distrib_optimizer_steps``: the distributed optimizer's
torch-Adam ``step`` without Apex/TE; ``parallel_state_teardown``: groups that
``destroy_model_parallel`` leaves held) and apply on GPUs too. The CPU-only ones replace upstream
code that is right on a GPU with or without Transformer Engine: it places tensors on the current
CUDA device, uses CUDA streams, events or generators, or hands NCCL split sizes it accepts.
Calling ``apply_all()`` again changes nothing.

Two helpers are not applied globally and are exported for the trainer:

* ``cpu_device_mode()`` (``cuda_device_mode.py``): a context manager to open around DDP/optimizer
  construction and each train step; it covers the ~60 ``device='cuda'`` sites in the optimizer,
  DDP buffers, clip-grad and the TP>1 collective helpers. Why it is scoped and not global is
  explained in that module.
* ``seed_model_parallel_rng(seed)`` (``rng.py``): seeds Megatron's named RNG streams after
  ``initialize_model_parallel``, on CPU and GPU.

The CUDA-only sites themselves are listed in ``notes/megatron_cpu.md``; each module's docstring
names the upstream function it replaces and why.
"""

from __future__ import annotations

from types import ModuleType

from .deferred_compile import import_megatron_core

import_megatron_core()  # before the patch modules below import megatron.core

from . import (  # noqa: E402
    all_to_all,
    causal_mask,
    distrib_optimizer_steps,
    memory_buffer,
    moe_dispatcher,
    moe_gemm,
    moe_router,
    norm_sequence_parallel,
    parallel_state_teardown,
    rng,
    rotary,
)
from .cuda_device_mode import CudaToCpuMode, cpu_device_mode  # noqa: E402
from .rng import seed_model_parallel_rng  # noqa: E402

EXPECTED_MEGATRON_CORE_VERSION = "0.16.1"

PATCHES: tuple[ModuleType, ...] = (
    rotary,
    memory_buffer,
    causal_mask,
    rng,
    moe_router,
    moe_gemm,
    moe_dispatcher,
    all_to_all,
    norm_sequence_parallel,
    distrib_optimizer_steps,
    parallel_state_teardown,
)

__all__ = [
    "EXPECTED_MEGATRON_CORE_VERSION",
    "PATCHES",
    "CudaToCpuMode",
    "apply_all",
    "check_megatron_version",
    "cpu_device_mode",
    "installed_megatron_version",
    "seed_model_parallel_rng",
]


def installed_megatron_version() -> str:
    """The version string of the megatron-core package that is importable."""
    from megatron.core import package_info

    return package_info.__version__


def check_megatron_version() -> None:
    """Raise RuntimeError unless the installed megatron-core is the version these patches target."""
    installed = installed_megatron_version()
    if installed != EXPECTED_MEGATRON_CORE_VERSION:
        raise RuntimeError(
            f"megatron_patches targets megatron-core {EXPECTED_MEGATRON_CORE_VERSION}, but "
            f"megatron-core {installed} is installed. Install megatron-core=="
            f"{EXPECTED_MEGATRON_CORE_VERSION}, or re-check every patched call site against "
            f"{installed} (see notes/megatron_cpu.md) and update EXPECTED_MEGATRON_CORE_VERSION."
        )


def apply_all() -> dict[str, bool]:
    """Check the version and apply every patch; returns {patch name: changed something now}."""
    check_megatron_version()
    return {patch.NAME: patch.apply() for patch in PATCHES}
