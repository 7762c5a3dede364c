"""Log-probabilities of sampled tokens computed from the final hidden states, chunk by chunk.

The naive route materialises fp32 logits ``[tokens, vocab]`` (about 20 GB for 32k tokens and a
151,936-token vocabulary), then a log-softmax of the same size, then gradients of the same size.
``token_logprobs`` instead walks over the tokens ``chunk_size`` at a time: the forward keeps only
each token's log-sum-exp, and the backward recomputes each chunk's logits to form its gradient, so
at most one chunk of logits is alive at a time.

Layout follows Megatron: ``hidden`` is sequence-first ``[T, B, H]``, ``targets`` (labels) are
``[B, T]`` and the result is ``[B, T]``.

Temperature: the log-probs are those of ``softmax(logits / T)``. ``T`` is one number for every
token, or a tensor broadcastable to ``[B, T]`` (e.g. ``[B, 1]``: one temperature per sequence, the
one its tokens were sampled with; ``[B, T]``: one per token, e.g. a packed row holding several
sequences). Each token's logits are divided by its own ``T`` in the forward and in the backward.

Tensor parallelism: ``output_weight`` may be this rank's vocabulary shard ``[V / tp, H]``, rank
``r`` owning ids ``[r * V/tp, (r + 1) * V/tp)`` (Megatron's vocab-parallel layout). The max and
the sum of exponentials are all-reduced over ``tp_group``, and the target logit comes from the
rank that owns the id (an all-reduce sum of picks that are zero elsewhere). ``hidden`` must be
identical on every rank of the group.

Padded vocabulary: Megatron pads the output layer to a multiple of ``128 * tp`` rows. With
``vocab_size`` (the true, unpadded size) the rows from that id on get a logit of -inf, so they
take no probability mass and no gradient, and the result matches a model without the padding.
"""

from __future__ import annotations

from typing import Any, Union

import torch
import torch.distributed as dist
from torch import Tensor


def logprobs_from_logits(logits: Tensor, targets: Tensor) -> Tensor:
    """Reference path: ``log_softmax(logits)`` gathered at ``targets``; logits ``[..., V]``,
    targets ``[...]``. Computed in at least fp32; materialises everything."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    logp = torch.log_softmax(logits.to(dtype), dim=-1)
    return logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def token_logprobs(
    hidden: Tensor,
    output_weight: Tensor,
    targets: Tensor,
    *,
    chunk_size: int = 1024,
    temperature: Union[float, Tensor] = 1.0,
    tp_group: Any = None,
    reduce_hidden_grad: bool = True,
    vocab_size: int | None = None,
) -> Tensor:
    """Log-probs ``[B, T]`` of ``targets`` under ``softmax(hidden @ output_weight.T / temperature)``
    (``temperature``: a number, or a tensor broadcastable to ``[B, T]``; see the module docstring).

    ``hidden`` is ``[T, B, H]``, ``output_weight`` ``[V_local, H]``, ``targets`` ``[B, T]`` with
    global vocabulary ids. ``chunk_size`` counts tokens (rows of the flattened ``[T * B, H]``).
    The result is fp32 (fp64 for fp64 inputs) and differentiable with respect to ``hidden`` and
    ``output_weight``.

    Under tensor parallelism the gradient of ``output_weight`` is the gradient of this rank's
    shard. With ``reduce_hidden_grad`` (default) the hidden gradient is summed over the group,
    so every rank receives the full gradient, as after Megatron's copy-to-TP-region; pass False
    when the surrounding code reduces it itself (e.g. a sequence-parallel gather whose backward
    is a reduce-scatter). ``vocab_size`` keeps padded vocabulary rows out of the softmax.
    """
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be [T, B, H], got shape {tuple(hidden.shape)}")
    seq_len, batch, hidden_size = hidden.shape
    if targets.shape != (batch, seq_len):
        raise ValueError(f"targets must be [B, T] = {(batch, seq_len)}, got {tuple(targets.shape)}")
    if output_weight.dim() != 2 or output_weight.shape[1] != hidden_size:
        raise ValueError(f"output_weight must be [V, {hidden_size}], got shape {tuple(output_weight.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    temperature = _token_temperatures(temperature, batch, seq_len, hidden.device)
    if tp_group is not None and dist.get_world_size(group=tp_group) == 1:
        tp_group = None

    vocab_local = output_weight.shape[0]
    vocab_start = 0 if tp_group is None else dist.get_rank(group=tp_group) * vocab_local
    vocab_total = vocab_local if tp_group is None else vocab_local * dist.get_world_size(group=tp_group)
    if vocab_size is not None:
        if not 0 < vocab_size <= vocab_total:
            raise ValueError(f"vocab_size must be in [1, {vocab_total}], got {vocab_size}")
        vocab_total = vocab_size
    real_local = max(0, min(vocab_local, vocab_total - vocab_start))
    flat_targets = targets.transpose(0, 1).reshape(-1).long()
    if flat_targets.numel() and (int(flat_targets.min()) < 0 or int(flat_targets.max()) >= vocab_total):
        raise ValueError(f"targets must be vocabulary ids in [0, {vocab_total})")

    flat = _ChunkedTokenLogprobs.apply(
        hidden.reshape(seq_len * batch, hidden_size),
        output_weight,
        flat_targets,
        chunk_size,
        temperature,
        vocab_start,
        real_local,
        tp_group,
        reduce_hidden_grad,
    )
    return flat.view(seq_len, batch).transpose(0, 1)


def _token_temperatures(temperature: Union[float, Tensor], batch: int, seq_len: int,
                        device: torch.device) -> Union[float, Tensor]:
    """A float, or the flattened per-token temperatures ``[T * B]`` in the ``hidden`` row order."""
    if not isinstance(temperature, Tensor):
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        return float(temperature)
    try:
        per_token = torch.broadcast_to(temperature.detach(), (batch, seq_len))
    except RuntimeError:
        raise ValueError(f"temperature must broadcast to [B, T] = {(batch, seq_len)}, got shape "
                         f"{tuple(temperature.shape)}") from None
    if per_token.numel() and not bool((per_token > 0).all()):
        raise ValueError("every temperature must be > 0")
    return per_token.transpose(0, 1).reshape(-1).to(device=device, dtype=torch.float64)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _chunk_temperature(temperature: Union[float, Tensor], start: int, stop: int) -> Union[float, Tensor]:
    return temperature if isinstance(temperature, float) else temperature[start:stop]


def _chunk_logits(hidden: Tensor, weight: Tensor, temperature: Union[float, Tensor], real_local: int) -> Tensor:
    logits = torch.matmul(hidden, weight.t()).to(_compute_dtype(hidden.dtype))
    if isinstance(temperature, Tensor):
        logits.div_(temperature.to(logits.dtype).unsqueeze(1))
    elif temperature != 1.0:
        logits.div_(temperature)
    if real_local < logits.shape[1]:
        logits[:, real_local:] = float("-inf")  # padded vocabulary rows
    return logits


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """Forward saves only hidden, weight, targets and per-token log-sum-exp; the backward
    recomputes each chunk's logits."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        chunk_size: int,
        temperature: Union[float, Tensor],
        vocab_start: int,
        real_local: int,
        tp_group: Any,
        reduce_hidden_grad: bool,
    ) -> Tensor:
        num_tokens = hidden.shape[0]
        vocab_local = weight.shape[0]
        dtype = _compute_dtype(hidden.dtype)
        logprobs = torch.empty(num_tokens, dtype=dtype, device=hidden.device)
        logsumexp = torch.empty(num_tokens, dtype=dtype, device=hidden.device)
        for start in range(0, num_tokens, chunk_size):
            stop = min(start + chunk_size, num_tokens)
            logits = _chunk_logits(hidden[start:stop], weight, _chunk_temperature(temperature, start, stop),
                                   real_local)
            local_ids = targets[start:stop] - vocab_start
            owned = (local_ids >= 0) & (local_ids < vocab_local)
            picked = logits.gather(1, local_ids.clamp(0, vocab_local - 1).unsqueeze(1)).squeeze(1)
            picked = torch.where(owned, picked, torch.zeros((), dtype=dtype, device=picked.device))
            row_max = logits.max(dim=1).values
            if tp_group is not None:
                dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=tp_group)
            sum_exp = logits.sub_(row_max.unsqueeze(1)).exp_().sum(dim=1)
            del logits
            if tp_group is not None:
                both = torch.stack([sum_exp, picked])
                dist.all_reduce(both, op=dist.ReduceOp.SUM, group=tp_group)
                sum_exp, picked = both[0], both[1]
            lse = row_max + torch.log(sum_exp)
            logsumexp[start:stop] = lse
            logprobs[start:stop] = picked - lse
        ctx.save_for_backward(hidden, weight, targets, logsumexp)
        ctx.chunk_size = chunk_size
        ctx.temperature = temperature
        ctx.vocab_start = vocab_start
        ctx.real_local = real_local
        ctx.tp_group = tp_group
        ctx.reduce_hidden_grad = reduce_hidden_grad
        return logprobs

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, targets, logsumexp = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        num_tokens = hidden.shape[0]
        vocab_local = weight.shape[0]
        dtype = logsumexp.dtype
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        # Accumulate the weight gradient over chunks in at least fp32, cast once at the end.
        grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_weight else None
        temperature = ctx.temperature
        if isinstance(temperature, Tensor):
            scale = grad_output.to(dtype) / temperature.to(dtype)
        else:
            scale = grad_output.to(dtype) / temperature
        for start in range(0, num_tokens, ctx.chunk_size):
            stop = min(start + ctx.chunk_size, num_tokens)
            h = hidden[start:stop]
            # d logp / d raw_logits = (onehot(target) - softmax) / temperature, times grad_output.
            grad_logits = _chunk_logits(h, weight, _chunk_temperature(temperature, start, stop), ctx.real_local)
            grad_logits.sub_(logsumexp[start:stop].unsqueeze(1)).exp_()
            grad_logits.mul_(-scale[start:stop].unsqueeze(1))
            local_ids = targets[start:stop] - ctx.vocab_start
            owned = (local_ids >= 0) & (local_ids < vocab_local)
            rows = torch.nonzero(owned).squeeze(1)
            grad_logits.index_put_((rows, local_ids[rows]), scale[start:stop][rows], accumulate=True)
            grad_logits = grad_logits.to(weight.dtype)
            if grad_hidden is not None:
                torch.matmul(grad_logits, weight, out=grad_hidden[start:stop])
            if grad_weight is not None:
                if grad_weight.dtype == weight.dtype:
                    grad_weight.addmm_(grad_logits.t(), h)
                else:
                    grad_weight.add_(torch.matmul(grad_logits.t(), h).to(grad_weight.dtype))
            del grad_logits
        if grad_hidden is not None and ctx.tp_group is not None and ctx.reduce_hidden_grad:
            dist.all_reduce(grad_hidden, op=dist.ReduceOp.SUM, group=ctx.tp_group)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None, None
