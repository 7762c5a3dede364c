"""Stop-gap: extend ``megatron_patches.cpu_device_mode()`` into custom autograd backward passes.

``cpu_device_mode()`` redirects CUDA placements with a ``TorchFunctionMode``. The autograd engine
does not carry torch-function modes into the ``backward`` of custom ``autograd.Function``s, so
Megatron's tensor-parallel backward passes that allocate with
``device=torch.cuda.current_device()`` (``mappings._reduce_scatter_along_first_dim`` behind
``gather_from_sequence_parallel_region``, ``_gather_along_first_dim`` behind the sequence-parallel
reduce-scatter, the sequence-parallel linear backward) still fail on a CPU machine with "Cannot
access accelerator device when none is available" (``torch.cuda.current_device`` is answered with
0 while the context is open, but device 0 is no longer rewritten). Forward passes are unaffected.

``backward_in_cpu_device_mode()`` wraps ``torch.autograd.function.BackwardCFunction.apply`` (what
the engine calls to run a custom Function's backward) so that each such backward runs under
``CudaToCpuMode`` while the context is open. It is a no-op when CUDA is available. This belongs
in ``megatron_patches.cuda_device_mode`` (open it as part of ``cpu_device_mode()``); once it is
there, this module can go.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch
from torch.autograd.function import BackwardCFunction

_lock = threading.Lock()
_depth = 0
_original_apply = BackwardCFunction.apply


def _apply_in_cpu_mode(self, *args):
    from megatron_patches import CudaToCpuMode

    with CudaToCpuMode():
        return _original_apply(self, *args)


@contextlib.contextmanager
def backward_in_cpu_device_mode() -> Iterator[None]:
    """Run custom-Function backward passes under ``CudaToCpuMode`` (CPU machines only)."""
    global _depth
    if torch.cuda.is_available():
        yield
        return
    with _lock:
        if _depth == 0:
            BackwardCFunction.apply = _apply_in_cpu_mode
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                BackwardCFunction.apply = _original_apply
