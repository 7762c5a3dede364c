"""CPU replacements in the MoE all-to-all token dispatcher
(``megatron.core.transformer.moe.token_dispatcher.MoEAlltoAllTokenDispatcher``).

Three upstream pieces assume CUDA:

* ``MoEAlltoAllTokenDispatcher.__init__`` creates a class-wide ``torch.cuda.Stream`` for
  device-to-host copies when ``cuda_dtoh_stream`` is still ``None``. We set that class attribute to
  a placeholder so no stream is created.
* ``_maybe_dtoh_and_synchronize`` copies the split sizes to the host on that stream and waits on a
  CUDA event. The replacement does the host conversion directly, no stream, no event.
* ``moe_utils.maybe_move_tensor_to_cpu`` only converts CUDA tensors, so on a CPU machine the split
  sizes stayed tensors instead of becoming host arrays. The replacement converts any tensor (and
  turns it into numpy when asked), matching what the GPU path hands on.
"""

from __future__ import annotations

from typing import Optional

import torch
from megatron.core.transformer.moe import moe_utils
from megatron.core.transformer.moe import token_dispatcher

from ._util import cuda_available, replace

NAME = "moe_dispatcher"


class _NoStream:
    """Placeholder for the dispatcher's device-to-host stream on a CPU machine."""

    def __repr__(self) -> str:
        return "<no cuda stream: CPU>"


def move_tensor_to_host(tensor, as_numpy: bool = False, record_stream: bool = False):
    """Tensor on the CPU (numpy if asked); anything that is not a tensor passes through."""
    if not torch.is_tensor(tensor):
        return tensor
    tensor = tensor.detach().to("cpu")
    return tensor.numpy() if as_numpy else tensor


def dtoh_without_streams(
    self: token_dispatcher.MoEAlltoAllTokenDispatcher,
    point: str,
    tokens_per_expert: Optional[torch.Tensor] = None,
) -> Optional[torch.Tensor]:
    """At the dispatcher's host-copy point, turn the routing metadata into host values."""
    if self.drop_and_pad or point != self.cuda_dtoh_point:
        return tokens_per_expert
    tokens_per_expert = move_tensor_to_host(tokens_per_expert)
    self.input_splits = move_tensor_to_host(self.input_splits, as_numpy=True)
    self.output_splits = move_tensor_to_host(self.output_splits, as_numpy=True)
    self.output_splits_tp = move_tensor_to_host(self.output_splits_tp, as_numpy=True)
    self.num_out_tokens = move_tensor_to_host(self.num_out_tokens)
    if self.num_local_experts > 1 and not self.config.moe_permute_fusion:
        self.num_global_tokens_per_local_expert = move_tensor_to_host(
            self.num_global_tokens_per_local_expert
        )
    return tokens_per_expert


def apply() -> bool:
    if cuda_available():
        return False
    dispatcher = token_dispatcher.MoEAlltoAllTokenDispatcher
    changed = False
    if dispatcher.cuda_dtoh_stream is None:
        dispatcher.cuda_dtoh_stream = _NoStream()
        changed = True
    changed |= replace(dispatcher, "_maybe_dtoh_and_synchronize", dtoh_without_streams)
    for module in (moe_utils, token_dispatcher):
        changed |= replace(module, "maybe_move_tensor_to_cpu", move_tensor_to_host)
    return changed
