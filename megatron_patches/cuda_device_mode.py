"""``cpu_device_mode()``: run CUDA-hard-coded Megatron code (optimizer, DDP, clip-grad) on the CPU.

The Megatron optimizer (``megatron.core.optimizer``), the DDP grad buffers
(``megatron.core.distributed.param_and_grad_buffer``), ``clip_grads`` and several collective
helpers in ``megatron.core.tensor_parallel`` (``mappings._gather_along_*``,
``utils.gather_split_1d_tensor``, the sequence-parallel backward in ``layers``) create tensors
with ``device='cuda'`` or ``device=torch.cuda.current_device()``, call ``.cuda()``, and check
``param.type()`` against ``'torch.cuda.FloatTensor'`` and friends: about sixty places.
Replacing each function would mean owning a fork of those files, so instead this context manager
does two things, only while it is open and only when CUDA is unavailable:

1. It pushes a ``TorchFunctionMode`` that rewrites any CUDA device handed to a torch function
   (``device=`` keyword, ``Tensor.to(...)``/``Tensor.cuda(...)``) to the CPU, makes ``.cuda()`` a
   no-op, and reports CPU tensors' ``Tensor.type()`` under the ``torch.cuda.*`` names the optimizer
   asserts on (and maps ``torch.cuda.*`` type names given to ``Tensor.type(name)`` back).
2. It makes ``torch.cuda.current_device()`` return ``0`` and ``torch.cuda.synchronize()`` a no-op;
   device 0 is then rewritten to the CPU by the mode.

3. It runs the ``backward`` of custom ``autograd.Function``s under the same mode: the autograd
   engine does not carry torch-function modes into them, and Megatron's tensor- and
   sequence-parallel backward passes allocate on ``torch.cuda.current_device()``. This wraps
   ``torch.autograd.function.BackwardCFunction.apply``, what the engine calls for such a backward.

Choice: a context manager, not something ``apply_all()`` installs for the whole process, because
(a) function modes are per thread, so a global install would silently not cover other threads;
(b) the mode costs a Python call per torch operation; and (c) the in-process rollout engine
(transformers) must not see ``torch.cuda.current_device()`` succeed or CPU tensors claim to be
``torch.cuda.*``. The trainer opens it around DDP/optimizer construction and around each train
step (forward, backward, ``finalize_model_grads``, ``optimizer.step``) and checkpoint save/load.
Forward passes at TP=1 do not need it: the per-site patches cover them.

The swap of ``torch.cuda.current_device``/``synchronize`` is process-wide while any thread has the
context open; nesting is fine.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch
from torch.autograd.function import BackwardCFunction
from torch.overrides import TorchFunctionMode

from ._util import cuda_available

NAME = "cuda_device_mode"

_CPU = torch.device("cpu")


def _is_cuda_device(value: Any) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    if isinstance(value, str):
        return value == "cuda" or value.startswith("cuda:")
    return False


def _to_cpu_device(value: Any, *, ints_are_devices: bool) -> Any:
    """The CPU device if ``value`` names a CUDA device, else ``value`` unchanged."""
    if _is_cuda_device(value):
        return _CPU
    if ints_are_devices and isinstance(value, int) and not isinstance(value, bool):
        return _CPU
    return value


def _cuda_type_name(cpu_name: str) -> str:
    """'torch.FloatTensor' -> 'torch.cuda.FloatTensor'."""
    return cpu_name if ".cuda." in cpu_name else cpu_name.replace("torch.", "torch.cuda.", 1)


class CudaToCpuMode(TorchFunctionMode):
    """Torch function mode that sends every CUDA placement to the CPU (see module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _to_cpu_device(kwargs["device"], ints_are_devices=True)

        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to:
            # Tensor.to(device, dtype, non_blocking, copy) or Tensor.to(dtype) or Tensor.to(tensor)
            args = (args[0], *(_to_cpu_device(a, ints_are_devices=True) for a in args[1:]))
        elif func is torch.Tensor.type:
            if len(args) == 1 and not kwargs:
                name = func(*args)
                return _cuda_type_name(name) if args[0].device.type == "cpu" else name
            target = args[1] if len(args) > 1 else kwargs.pop("dtype", None)
            if isinstance(target, str) and ".cuda." in target:
                target = target.replace("torch.cuda.", "torch.", 1)
            return func(args[0], target, **kwargs)
        return func(*args, **kwargs)


_swap_lock = threading.Lock()
_swap_depth = 0
_saved: dict[str, Any] = {}


def _current_device_is_zero() -> int:
    return 0


def _synchronize_nothing(device: Any = None) -> None:
    return None


_original_backward_apply = BackwardCFunction.apply


def _backward_apply_in_cpu_mode(self: Any, *args: Any) -> Any:
    with CudaToCpuMode():
        return _original_backward_apply(self, *args)


@contextlib.contextmanager
def _cuda_queries_answered_by_cpu() -> Iterator[None]:
    global _swap_depth
    with _swap_lock:
        if _swap_depth == 0:
            _saved["current_device"] = torch.cuda.current_device
            _saved["synchronize"] = torch.cuda.synchronize
            torch.cuda.current_device = _current_device_is_zero
            torch.cuda.synchronize = _synchronize_nothing
            BackwardCFunction.apply = _backward_apply_in_cpu_mode
        _swap_depth += 1
    try:
        yield
    finally:
        with _swap_lock:
            _swap_depth -= 1
            if _swap_depth == 0:
                torch.cuda.current_device = _saved.pop("current_device")
                torch.cuda.synchronize = _saved.pop("synchronize")
                BackwardCFunction.apply = _original_backward_apply


@contextlib.contextmanager
def cpu_device_mode() -> Iterator[None]:
    """Run the body with CUDA placements redirected to the CPU; a no-op when CUDA is available."""
    if cuda_available():
        yield
        return
    with _cuda_queries_answered_by_cpu(), CudaToCpuMode():
        yield
