"""CPU replacement for ``megatron.core.utils.GlobalMemoryBuffer.get_tensor``.

The shared scratch buffer (used by sequence-parallel all-gathers among others) is always
allocated on ``torch.cuda.current_device()`` upstream. Without CUDA the replacement keeps the same
reuse rule (grow when too small, hand out a view of the front) but allocates on the CPU.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Callable, Optional

import torch
from megatron.core.utils import GlobalMemoryBuffer

from ._util import cuda_available, replace

NAME = "memory_buffer"


def get_tensor_on_cpu(
    self: GlobalMemoryBuffer,
    tensor_shape,
    dtype: torch.dtype,
    name: str,
    mem_alloc_context: Optional[Callable] = None,
) -> torch.Tensor:
    """A ``tensor_shape`` view of the named CPU scratch buffer, growing it when needed."""
    needed = math.prod(tensor_shape)
    key = (name, dtype)
    buffer = self.buffer.get(key)
    if buffer is None or buffer.numel() < needed:
        with (mem_alloc_context or nullcontext)():
            buffer = torch.empty(needed, dtype=dtype, device="cpu", requires_grad=False)
        self.buffer[key] = buffer
    return buffer[:needed].view(*tensor_shape)


def apply() -> bool:
    if cuda_available():
        return False
    return replace(GlobalMemoryBuffer, "get_tensor", get_tensor_on_cpu)
