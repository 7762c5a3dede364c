"""Run one model chunk on a micro-batch and turn the last stage's hidden states into log-probs.

``stage_forward`` calls the (DDP-wrapped) GPTModel through its ordinary forward, with the
GPTModel's ``post_process`` flag lowered for the duration of the call. ``GPTModel._postprocess``
then returns the decoder output instead of applying the output layer; the decoder of the last
stage has already applied the final norm. So the last stage yields final hidden states
``[S, B, H]`` (``[S / tp, B, H]`` under sequence parallelism) and never materialises
``[S, B, V]`` logits; other stages yield the activations they send on. The flag is restored
afterwards (the trainer is single-threaded).

``micro_batch_logprobs`` feeds those hidden states to ``spade.rl.logprobs.token_logprobs`` with
this rank's output-weight shard (the embedding weight when input and output embeddings are tied)
and the tensor-parallel group. Two details:

* Tensor parallelism. Without sequence parallelism the hidden states enter through
  ``copy_to_tensor_model_parallel_region`` (backward: all-reduce), as they would enter the output
  layer; under sequence parallelism they are all-gathered with
  ``gather_from_sequence_parallel_region`` (backward: reduce-scatter). Either way
  ``token_logprobs`` runs with ``reduce_hidden_grad=False``.
* Padded vocabulary. Megatron allocates ``layout.padded_vocab_size`` rows; rows past the true
  vocabulary must not enter the softmax (HF loading pads with zero rows, whose logit 0 would
  otherwise add ``exp(0)`` to the normaliser). ``token_logprobs(..., vocab_size=...)`` gives them
  a logit of -inf, so their softmax weight and gradients are exactly 0.
  Targets are real token ids and never point at a padded row.

Temperature: every target's log-prob is taken at the temperature of its sample
(``MicroBatch.temperatures``, the one its tokens were sampled with), never at a separate setting.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Union

import torch
from torch import Tensor

from .batching import MicroBatch
from .model_provider import true_vocab_size



def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside DDP / Float16Module wrappers."""
    from megatron.core.utils import unwrap_model

    return unwrap_model(model)


def is_last_stage(model: torch.nn.Module) -> bool:
    """Whether this chunk holds the final norm and output layer."""
    return bool(unwrap(model).post_process)


def supports_packed_sequences(model: torch.nn.Module) -> bool:
    """True when the attention modules accept THD packed input (Transformer Engine attention)."""
    gpt = unwrap(model)
    for module in gpt.modules():
        if type(module).__name__ in ("TEDotProductAttention",):
            return True
    return False


@contextlib.contextmanager
def _hidden_states_out(gpt: torch.nn.Module) -> Iterator[None]:
    saved = gpt.post_process
    gpt.post_process = False
    try:
        yield
    finally:
        gpt.post_process = saved


def stage_forward(model: torch.nn.Module, micro_batch: MicroBatch) -> Tensor:
    """Final hidden states on the last stage, outgoing activations on the others."""
    gpt = unwrap(model)
    with _hidden_states_out(gpt):
        return model(
            micro_batch.input_ids,
            micro_batch.position_ids,
            None,  # causal mask built by the attention; batches are right-padded
            packed_seq_params=micro_batch.packed_seq_params,
        )


def output_weight(model: torch.nn.Module) -> Tensor:
    """This rank's output-layer weight shard ``[V_padded / tp, H]`` (embedding if tied)."""
    gpt = unwrap(model)
    if gpt.share_embeddings_and_output_weights:
        return gpt.shared_embedding_or_output_weight()
    return gpt.output_layer.weight


def hidden_to_logprobs(
    model: torch.nn.Module,
    hidden: Tensor,
    targets: Tensor,
    *,
    temperature: Union[float, Tensor] = 1.0,
    chunk_size: int = 1024,
) -> Tensor:
    """Log-probs ``[B, S]`` of ``targets`` (``[B, S]``) from last-stage ``hidden`` ``[S(/tp), B, H]``
    at ``temperature`` (a number or a tensor broadcastable to ``[B, S]``)."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import (
        copy_to_tensor_model_parallel_region,
        gather_from_sequence_parallel_region,
    )

    from spade.rl.logprobs import token_logprobs

    gpt = unwrap(model)
    weight = output_weight(model)
    tp_group = ps.get_tensor_model_parallel_group()
    tp_size = ps.get_tensor_model_parallel_world_size()
    if tp_size > 1:
        if gpt.config.sequence_parallel:
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=True)
        else:
            hidden = copy_to_tensor_model_parallel_region(hidden)
    hidden = hidden.to(weight.dtype)
    return token_logprobs(
        hidden,
        weight,
        targets,
        chunk_size=chunk_size,
        temperature=temperature,
        tp_group=tp_group if tp_size > 1 else None,
        reduce_hidden_grad=False,
        vocab_size=true_vocab_size(gpt),
    )


def micro_batch_logprobs(
    model: torch.nn.Module,
    hidden: Tensor,
    micro_batch: MicroBatch,
    *,
    chunk_size: int = 1024,
) -> Tensor:
    """Target log-probs in the loss-side ``[B, S]`` layout (unpacked for packed micro-batches),
    each at the temperature of its sample."""
    logprobs = hidden_to_logprobs(
        model, hidden, micro_batch.targets, temperature=batch_temperature(micro_batch), chunk_size=chunk_size
    )
    if micro_batch.unpack_index is not None:
        logprobs = logprobs[0][micro_batch.unpack_index]
    return logprobs


def batch_temperature(micro_batch: MicroBatch) -> Union[float, Tensor]:
    """The micro-batch's temperatures for ``token_logprobs``: one number when every target shares
    it (the common case, and the same arithmetic as before per-token temperatures), else the
    per-target tensor on the targets' device."""
    temperatures = micro_batch.temperatures
    if temperatures is None:
        return 1.0
    first = temperatures.reshape(-1)[:1]
    if temperatures.numel() == 0 or bool((temperatures == first).all()):
        return float(first.item()) if temperatures.numel() else 1.0
    return temperatures.to(micro_batch.targets.device)
