"""Drive Megatron's forward/backward schedule over a list of micro-batches.

``run_schedule`` is shared by the train step and the no-grad log-prob pass. It

* makes every data-parallel rank run the same number of micro-batches (a rank with fewer gets
  ``filler_micro_batch``es that carry no loss token): expert-parallel all-to-alls and pipeline
  p2p traffic need every rank to take part in every micro-batch;
* checks the micro-batches against the model (sequence length a multiple of TP under sequence
  parallelism, packed input only with an attention that supports it);
* moves them to the device and runs ``get_forward_backward_func()`` (the pipeline schedule when
  pp > 1) inside ``cpu_device_mode()``.

``step_fn(model, micro_batch)`` returns what Megatron's ``forward_step_func`` returns:
``(output_tensor, loss_func)``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist

from .batching import MicroBatch, filler_micro_batch
from .forward_logprobs import supports_packed_sequences


def device() -> torch.device:
    """The device training tensors live on: the current CUDA device, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def agree_on_count(micro_batches: Sequence[MicroBatch], seq_multiple: int) -> list[MicroBatch]:
    """Pad with filler micro-batches up to the largest count over the data-parallel group."""
    from megatron.core import parallel_state as ps

    count = torch.tensor([len(micro_batches)], dtype=torch.long, device=device())
    group = ps.get_data_parallel_group()
    if dist.get_world_size(group) > 1:
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
    fillers = [filler_micro_batch(seq_multiple) for _ in range(int(count.item()) - len(micro_batches))]
    return list(micro_batches) + fillers


def check_micro_batches(model: torch.nn.Module, micro_batches: Sequence[MicroBatch], seq_multiple: int) -> None:
    for index, micro_batch in enumerate(micro_batches):
        length = micro_batch.input_ids.shape[1]
        if length % seq_multiple:
            raise ValueError(
                f"micro-batch {index} has sequence length {length}, not a multiple of {seq_multiple} "
                f"(sequence parallelism over tp={seq_multiple}): build micro-batches with "
                f"make_micro_batches(..., pad_to_multiple_of={seq_multiple})"
            )
        if micro_batch.is_packed and not supports_packed_sequences(model):
            raise ValueError(
                "packed (THD) micro-batches need the Transformer Engine attention; this model uses "
                "Megatron's local attention: build micro-batches with packed=False"
            )


def sequence_multiple(model: torch.nn.Module) -> int:
    """The sequence length every micro-batch must be a multiple of for this model."""
    from megatron.core import parallel_state as ps
    from megatron.core.utils import get_model_config

    config = get_model_config(model)
    return ps.get_tensor_model_parallel_world_size() if config.sequence_parallel else 1


def _reset_moe_aux_loss_scale() -> None:
    """Let the schedule install a fresh MoE aux-loss scale.

    ``MoEAuxLossAutoScaler.main_loss_backward_scale`` is a class-wide tensor: a MoE backward run
    outside a schedule creates it 0-d, after which the schedule's ``set_loss_scale`` (a ``[1]``
    tensor, copied in place) fails with "output with shape [] doesn't match the broadcast shape
    [1]". Clearing it makes the schedule assign its own tensor.
    """
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    MoEAuxLossAutoScaler.main_loss_backward_scale = None


def run_schedule(
    model_chunks: Sequence[torch.nn.Module],
    micro_batches: Sequence[MicroBatch],
    step_fn: Callable[[torch.nn.Module, MicroBatch], tuple],
    *,
    forward_only: bool,
) -> list[MicroBatch]:
    """Run the schedule; returns the micro-batches actually run (fillers included, on device)."""
    import megatron_patches
    from megatron.core.pipeline_parallel import get_forward_backward_func

    chunks = list(model_chunks)
    multiple = sequence_multiple(chunks[0])
    check_micro_batches(chunks[0], micro_batches, multiple)
    batches = [mb.to(device()) for mb in agree_on_count(micro_batches, multiple)]
    if not batches:
        return batches

    def forward_step(data_iterator, model):
        return step_fn(model, next(data_iterator))

    _reset_moe_aux_loss_scale()
    iterators = [iter(batches) for _ in chunks]
    forward_backward = get_forward_backward_func()
    with megatron_patches.cpu_device_mode():
        forward_backward(
            forward_step_func=forward_step,
            data_iterator=iterators if len(chunks) > 1 else iterators[0],
            model=chunks if len(chunks) > 1 else chunks[0],
            num_microbatches=len(batches),
            seq_length=max(mb.input_ids.shape[1] for mb in batches),
            micro_batch_size=max(mb.input_ids.shape[0] for mb in batches),
            forward_only=forward_only,
        )
    return batches
