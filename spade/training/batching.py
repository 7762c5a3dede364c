"""The micro-batches the Megatron train step consumes, built from ``spade.rl.samples.TrainSample``.

A ``TrainSample`` (defined in ``spade.rl.samples``) is one token sequence. Everything per token in it is aligned with the
*targets*: entry ``i`` of ``loss_mask``, of a per-token ``advantages`` array and of the log-prob
arrays describes ``token_ids[i + 1]`` (the token predicted at position ``i``), so those arrays are
one shorter than ``token_ids``. ``TrainSample.from_token_mask`` converts a mask over the tokens
themselves (1 = the policy produced this token) to that convention.

``make_micro_batches`` groups samples under a token budget, in one of two forms:

* **padded** (every attention backend): right-padded ``[B, S]`` inputs. Right padding matters:
  Megatron's RoPE ignores ``position_ids`` and numbers positions 0..S-1, and with a causal mask
  no real token attends to the padding after it, so padding never changes a real token's output.
  The budget counts ``B * S``, the tokens actually computed.
* **packed** (THD, only with the Transformer Engine attention, i.e. on GPU): all sequences of a
  micro-batch concatenated into ``[1, T]`` with ``PackedSeqParams`` (``cu_seqlens``) so attention
  stays within each sequence. Megatron's local (CPU) attention rejects packed inputs, so packing is
  chosen automatically only when TE is usable. The budget counts ``T``.

Either way the loss-side tensors (mask, advantages, log-probs) are laid out ``[B, S]`` with column
``t`` belonging to the target at position ``t``; for packed micro-batches ``unpack_index`` maps
that layout into the packed token axis. The loss therefore does not depend on the form.

Temperatures: ``temperatures`` holds, in the model-side layout of ``targets``, the temperature of
the sample each target belongs to (``TrainSample.temperature``, the one its tokens were drawn
with), so one micro-batch may mix samples of different roles and temperatures and
each gets the log-probs of its own ``softmax(logits / T)``. Padding positions carry the
temperature of the sequence they pad (they take no loss), so a micro-batch whose samples share one
temperature holds a single value.

``data_parallel_shard`` splits a batch's samples over data-parallel ranks, balancing tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from ..rl.samples import TrainSample


@dataclass
class MicroBatch:
    """Tensors for one forward/backward pass (see the module docstring for the two forms).

    Model side: ``input_ids``/``position_ids``/``targets`` are ``[B, S]`` (padded) or ``[1, T]``
    (packed, with ``packed_seq_params``). Loss side, always ``[B, S]``: ``loss_mask``,
    ``advantages`` (``[B]`` or ``[B, S]``) and the optional log-prob tensors. ``lengths`` are the
    sequence lengths, ``sample_indices`` the positions of the samples in the list given to
    ``make_micro_batches`` (empty for a filler micro-batch). ``temperatures`` (shaped like
    ``targets``): the log-prob temperature of each target's sample; None means 1.0 everywhere.
    """

    input_ids: Tensor
    position_ids: Tensor
    targets: Tensor
    loss_mask: Tensor
    advantages: Tensor
    lengths: Tensor
    sample_indices: tuple[int, ...]
    old_logprobs: Optional[Tensor] = None
    rollout_logprobs: Optional[Tensor] = None
    ref_logprobs: Optional[Tensor] = None
    packed_seq_params: Optional[object] = None  # megatron.core.packed_seq_params.PackedSeqParams
    unpack_index: Optional[Tensor] = None  # [B, S] -> position in the packed token axis
    temperatures: Optional[Tensor] = None  # like targets: each target's sampling temperature
    # routing replay: like input_ids plus [layers, top_k], the rollout's experts of each input
    # token (int32, -1 where not recorded); None when no sample has a record
    routed_experts: Optional[Tensor] = None
    # [B] each sample's TrainSample.loss_weight and count_weight (float, int64); None: all 1 (and
    # always for a filler micro-batch, whose one row is no sample)
    loss_weights: Optional[Tensor] = None
    count_weights: Optional[Tensor] = None

    @property
    def is_packed(self) -> bool:
        return self.packed_seq_params is not None

    @property
    def batch_size(self) -> int:
        return int(self.loss_mask.shape[0])

    @property
    def seq_len(self) -> int:
        """Width of the loss-side ``[B, S]`` layout (the padded length)."""
        return int(self.loss_mask.shape[1])

    @property
    def computed_tokens(self) -> int:
        """Tokens the model computes on: ``B * S`` padded, ``T`` packed (what the budget counts)."""
        return int(self.input_ids.numel())

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens."""
        return int(self.lengths.sum())

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def sample_count(self) -> int:
        """The samples a ``sample_mean`` loss counts: the sum of their count weights."""
        if self.count_weights is None:
            return len(self.sample_indices)
        return int(self.count_weights.sum())

    @property
    def num_loss_sequences(self) -> int:
        """Sequences with at least one loss token."""
        return int((self.loss_mask.sum(dim=1) > 0).sum())

    def to(self, device: Union[str, torch.device]) -> "MicroBatch":
        def move(value):
            return value.to(device, non_blocking=True) if isinstance(value, Tensor) else value

        changes = {f.name: move(getattr(self, f.name)) for f in dataclasses.fields(self)}
        params = self.packed_seq_params
        if params is not None:
            changes["packed_seq_params"] = dataclasses.replace(
                params,
                cu_seqlens_q=move(params.cu_seqlens_q),
                cu_seqlens_kv=move(params.cu_seqlens_kv),
                cu_seqlens_q_padded=move(params.cu_seqlens_q_padded),
                cu_seqlens_kv_padded=move(params.cu_seqlens_kv_padded),
            )
        return dataclasses.replace(self, **changes)


def default_packing() -> bool:
    """Pack (THD) exactly when the model builder picks the Transformer Engine spec by default."""
    from spade.models.builder import transformer_engine_usable

    return transformer_engine_usable()


def _ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _group_padded(lengths: Sequence[int], budget: int, multiple: int) -> list[list[int]]:
    """Longest first; a micro-batch takes samples while ``rows * padded_longest <= budget``."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    width = 0
    for index in order:
        padded = _ceil_to(lengths[index], multiple)
        if groups and (len(groups[-1]) + 1) * width <= budget:
            groups[-1].append(index)
        else:
            groups.append([index])
            width = padded
    return groups


def _group_packed(lengths: Sequence[int], budget: int, multiple: int) -> list[list[int]]:
    """First-fit decreasing on padded lengths."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    used: list[int] = []
    for index in order:
        size = _ceil_to(lengths[index], multiple)
        for slot, total in enumerate(used):
            if total + size <= budget:
                groups[slot].append(index)
                used[slot] += size
                break
        else:
            groups.append([index])
            used.append(size)
    return groups


def _optional_stack(samples: Sequence[TrainSample], name: str, width: int) -> Optional[Tensor]:
    present = [getattr(s, name) is not None for s in samples]
    if not any(present):
        return None
    if not all(present):
        raise ValueError(f"{name} is given for some samples of the batch but not all")
    out = torch.zeros(len(samples), width)
    for row, sample in enumerate(samples):
        values = getattr(sample, name)
        out[row, : values.numel()] = values
    return out


def _loss_side(samples: Sequence[TrainSample], width: int) -> dict:
    mask = torch.zeros(len(samples), width)
    for row, sample in enumerate(samples):
        mask[row, : sample.num_targets] = sample.loss_mask
    if all(isinstance(s.advantages, float) for s in samples):
        advantages = torch.tensor([s.advantages for s in samples], dtype=torch.float32)
    else:
        advantages = torch.zeros(len(samples), width)
        for row, sample in enumerate(samples):
            advantages[row, : sample.num_targets] = sample.advantages  # a float broadcasts
    weighted = any(s.loss_weight != 1.0 or s.count_weight != 1 for s in samples)
    return dict(
        loss_mask=mask,
        advantages=advantages,
        loss_weights=torch.tensor([s.loss_weight for s in samples]) if weighted else None,
        count_weights=torch.tensor([s.count_weight for s in samples], dtype=torch.long) if weighted else None,
        old_logprobs=_optional_stack(samples, "old_logprobs", width),
        rollout_logprobs=_optional_stack(samples, "rollout_logprobs", width),
        ref_logprobs=_optional_stack(samples, "ref_logprobs", width),
    )


def _routed_experts(samples: Sequence[TrainSample], shape: tuple[int, int],
                    starts: Sequence[tuple[int, int]]) -> Optional[Tensor]:
    """The samples' routing records in the model-side layout ``shape + (layers, top_k)``; sample
    ``i``'s rows start at ``starts[i]`` (row, column)."""
    records = [s.routed_experts for s in samples if s.routed_experts is not None]
    if not records:
        return None
    layers_k = tuple(records[0].shape[1:])
    if any(tuple(r.shape[1:]) != layers_k for r in records):
        raise ValueError("routed_experts of one batch must share [layers, top_k]")
    out = torch.full((*shape, *layers_k), -1, dtype=torch.int32)
    for sample, (row, column) in zip(samples, starts):
        if sample.routed_experts is not None:
            out[row, column: column + sample.routed_experts.shape[0]] = sample.routed_experts.to(torch.int32)
    return out


def _padded_micro_batch(
    samples: Sequence[TrainSample], indices: Sequence[int], multiple: int, pad_token_id: int
) -> MicroBatch:
    lengths = torch.tensor([s.length for s in samples], dtype=torch.long)
    width = _ceil_to(int(lengths.max()), multiple)
    input_ids = torch.full((len(samples), width), pad_token_id, dtype=torch.long)
    targets = torch.full((len(samples), width), pad_token_id, dtype=torch.long)
    temperatures = torch.ones((len(samples), width), dtype=torch.float64)
    for row, sample in enumerate(samples):
        input_ids[row, : sample.length] = sample.token_ids
        targets[row, : sample.num_targets] = sample.token_ids[1:]
        temperatures[row] = sample.temperature  # the padding too: it takes no loss
    return MicroBatch(
        input_ids=input_ids,
        position_ids=torch.arange(width).expand(len(samples), width).contiguous(),
        targets=targets,
        temperatures=temperatures,
        lengths=lengths,
        sample_indices=tuple(indices),
        routed_experts=_routed_experts(samples, (len(samples), width), [(row, 0) for row in range(len(samples))]),
        **_loss_side(samples, width),
    )


def _packed_micro_batch(
    samples: Sequence[TrainSample], indices: Sequence[int], multiple: int, pad_token_id: int
) -> MicroBatch:
    from megatron.core.packed_seq_params import PackedSeqParams

    lengths = torch.tensor([s.length for s in samples], dtype=torch.long)
    padded = [_ceil_to(s.length, multiple) for s in samples]
    total = sum(padded)
    width = max(padded)
    input_ids = torch.full((1, total), pad_token_id, dtype=torch.long)
    targets = torch.full((1, total), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((1, total), dtype=torch.long)
    temperatures = torch.ones((1, total), dtype=torch.float64)
    unpack_index = torch.zeros((len(samples), width), dtype=torch.long)
    starts = [0]
    for row, sample in enumerate(samples):
        start = starts[-1]
        input_ids[0, start : start + sample.length] = sample.token_ids
        targets[0, start : start + sample.num_targets] = sample.token_ids[1:]
        temperatures[0, start : start + padded[row]] = sample.temperature  # its padding too
        position_ids[0, start : start + padded[row]] = torch.arange(padded[row])
        unpack_index[row, : padded[row]] = torch.arange(start, start + padded[row])
        starts.append(start + padded[row])
    # Each sequence occupies its padded slot; its padding comes after its real tokens, so the
    # causal mask keeps it out of every real token's context.
    cu_seqlens = torch.tensor(starts, dtype=torch.int32)
    params = PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        cu_seqlens_q_padded=cu_seqlens,
        cu_seqlens_kv_padded=cu_seqlens,
        max_seqlen_q=width,
        max_seqlen_kv=width,
    )
    return MicroBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        targets=targets,
        temperatures=temperatures,
        lengths=lengths,
        sample_indices=tuple(indices),
        packed_seq_params=params,
        unpack_index=unpack_index,
        routed_experts=_routed_experts(samples, (1, total), [(0, start) for start in starts[:-1]]),
        **_loss_side(samples, width),
    )


def make_micro_batches(
    samples: Sequence[TrainSample],
    max_tokens_per_micro_batch: int,
    *,
    packed: Optional[bool] = None,
    pad_to_multiple_of: int = 1,
    pad_token_id: int = 0,
) -> list[MicroBatch]:
    """Group ``samples`` into micro-batches of at most ``max_tokens_per_micro_batch`` computed
    tokens (``B * S`` padded, ``T`` packed; a sample longer than the budget forms a micro-batch of
    its own). ``packed=None`` packs exactly when TE attention is in use (``default_packing``).
    ``pad_to_multiple_of`` rounds sequence lengths up: use the TP size under sequence
    parallelism. Samples are ordered longest first to keep padding low; ``sample_indices`` say
    which samples each micro-batch holds. The same ``old``/``rollout``/``ref`` log-prob fields
    must be present on all samples or on none.
    """
    if max_tokens_per_micro_batch < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be >= 1, got {max_tokens_per_micro_batch}")
    if pad_to_multiple_of < 1:
        raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
    if packed is None:
        packed = default_packing()
    lengths = [s.length for s in samples]
    group = _group_packed if packed else _group_padded
    build = _packed_micro_batch if packed else _padded_micro_batch
    present = {n: sum(getattr(s, n) is not None for s in samples) for n in
               ("old_logprobs", "rollout_logprobs", "ref_logprobs")}
    for name, count in present.items():
        if 0 < count < len(samples):
            raise ValueError(f"{name} is given for {count} of {len(samples)} samples: give it for all or none")
    groups = group(lengths, max_tokens_per_micro_batch, pad_to_multiple_of)
    return [build([samples[i] for i in g], g, pad_to_multiple_of, pad_token_id) for g in groups]


def filler_micro_batch(seq_len: int, pad_token_id: int = 0) -> MicroBatch:
    """A one-row micro-batch with no loss token, for ranks that ran out of samples (every rank
    of a data-parallel group must run the same number of micro-batches: expert-parallel
    all-to-alls span them). Always padded form; ``seq_len`` >= 2."""
    seq_len = max(seq_len, 2)
    zeros_long = torch.full((1, seq_len), pad_token_id, dtype=torch.long)
    return MicroBatch(
        input_ids=zeros_long,
        position_ids=torch.arange(seq_len).unsqueeze(0),
        targets=zeros_long.clone(),
        loss_mask=torch.zeros(1, seq_len),
        advantages=torch.zeros(1),
        lengths=torch.zeros(1, dtype=torch.long),
        sample_indices=(),
    )


def data_parallel_shard(samples: Sequence[TrainSample], dp_size: int, dp_rank: int) -> list[int]:
    """Indices of the samples data-parallel rank ``dp_rank`` trains on, in increasing order.

    Longest first, each sample goes to the rank with the fewest tokens so far (ties: lowest
    rank), so every rank computes the same split without communication. A rank may get no
    sample when there are fewer samples than ranks.
    """
    if dp_size < 1 or not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank must be in [0, {dp_size}), got {dp_rank}")
    load = [0] * dp_size
    mine: list[int] = []
    for index in sorted(range(len(samples)), key=lambda i: (-samples[i].length, i)):
        rank = min(range(dp_size), key=lambda r: (load[r], r))
        load[rank] += samples[index].length
        if rank == dp_rank:
            mine.append(index)
    return sorted(mine)
