"""CPU replacement for ``megatron.core.tensor_parallel.mappings._AllToAll.forward``.

The MoE dispatcher passes its split sizes as numpy arrays (or tensors), which NCCL accepts but
gloo's ``all_to_all_single`` does not: it wants plain lists of ints. Upstream also allocates the
output of an uneven all-to-all on ``torch.cuda.current_device()``. The replacement converts the
split sizes to lists and allocates on the input's device. Backward still goes through
``_AllToAll.apply`` with the splits swapped, so it gets the same treatment.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist
from megatron.core.tensor_parallel import mappings

from ._util import cuda_available, replace

NAME = "all_to_all"


def as_split_list(sizes) -> Optional[list[int]]:
    """Split sizes as a list of Python ints (None stays None: an even split)."""
    if sizes is None:
        return None
    if torch.is_tensor(sizes):
        return [int(s) for s in sizes.tolist()]
    return [int(s) for s in sizes]


def all_to_all_forward(
    ctx,
    group: dist.ProcessGroup,
    input: torch.Tensor,
    output_split_sizes: Optional[Sequence[int]],
    input_split_sizes: Optional[Sequence[int]],
) -> torch.Tensor:
    """Forward of the autograd all-to-all with gloo-friendly split sizes."""
    output_split_sizes = as_split_list(output_split_sizes)
    input_split_sizes = as_split_list(input_split_sizes)
    ctx.group = group
    ctx.output_split_sizes = output_split_sizes
    ctx.input_split_sizes = input_split_sizes
    if group.size() == 1:
        return input
    input = input.contiguous()
    if output_split_sizes is None:
        output = torch.empty_like(input)
    else:
        output = input.new_empty((sum(output_split_sizes), *input.shape[1:]))
    dist.all_to_all_single(
        output,
        input,
        output_split_sizes=output_split_sizes,
        input_split_sizes=input_split_sizes,
        group=group,
    )
    return output


def apply() -> bool:
    if cuda_available():
        return False
    return replace(mappings._AllToAll, "forward", staticmethod(all_to_all_forward))
