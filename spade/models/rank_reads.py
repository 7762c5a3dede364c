"""Build one rank's Megatron shards by reading only the HF tensor rows / columns that rank holds.

``hf_to_megatron`` needs every HF tensor of a rank's parameters in memory, in full, and then cuts
out the rank's part. For a large checkpoint that means every rank holds (at least) its pipeline
stage's full tensors, and a caller that does not pass names holds the whole checkpoint. Here a
``SliceReader`` (e.g. safetensors' ``safe_open(...).get_slice``) is asked for exactly the part of
each tensor that ``split_for_rank`` would keep, so a rank reads its stage's layers, its experts
and its tensor-parallel rows or columns, and nothing else:

* column-parallel (dim 0) and row-parallel (dim 1) weights: one contiguous block of that dim;
* SwiGLU ``[gate; up]``: the rank's block of gate rows and of up rows;
* fused QKV: query groups are contiguous in q, k and v, so the rank reads its groups' rows of each
  and interleaves them; with fewer groups than ranks it reads the rows of its block of its group;
* the vocabulary: the rank's block of the padded rows, of which only the real rows are read.

The result is the same tensor ``split_for_rank`` gives on the full tensors (the tests check
this for TP, PP and EP layouts).
"""

from __future__ import annotations

from typing import Optional, Protocol, Sequence

import torch
from torch import Tensor

from .hf_config import ModelSpec
from .layout import ParallelLayout, RankCoords
from .weight_map import Binding, Fuse, MegatronNaming, Split, bindings, split_for_rank


class SliceReader(Protocol):
    """Reads parts of named HF tensors without loading the rest."""

    def shape(self, name: str) -> tuple[int, ...]:
        ...

    def read(self, name: str, dim: Optional[int] = None, start: int = 0, stop: Optional[int] = None) -> Tensor:
        """The whole tensor (``dim`` None) or the block ``start:stop`` of dimension ``dim`` (0 or 1)."""
        ...


def needed_names(spec: ModelSpec, layout: ParallelLayout, coords: RankCoords,
                 naming: MegatronNaming = MegatronNaming()) -> set[str]:
    """The HF tensors (some only in part) a rank at ``coords`` reads."""
    return {name for binding in bindings(spec, layout, coords, naming) for name in binding.hf}


def read_rank_state(reader: SliceReader, spec: ModelSpec, layout: ParallelLayout, coords: RankCoords,
                    naming: MegatronNaming = MegatronNaming()) -> dict[str, Tensor]:
    """This rank's Megatron state dict (parameters only), read part by part through ``reader``."""
    return {binding.megatron: read_shard(reader, binding, spec, layout, coords)
            for binding in bindings(spec, layout, coords, naming)}


def read_shard(reader: SliceReader, binding: Binding, spec: ModelSpec, layout: ParallelLayout,
               coords: RankCoords) -> Tensor:
    """One parameter's shard for the rank at ``coords``."""
    rule = binding.rule
    parts, index = (layout.expert_tp, coords.etp) if binding.group == "etp" else (layout.tp, coords.tp)
    if parts == 1 or rule.split is Split.REPLICATED:
        return split_for_rank(rule, [reader.read(name) for name in binding.hf], spec, layout, 1, 0)
    if rule.fuse is Fuse.QKV:
        return _qkv_shard(reader, binding.hf, spec, parts, index)
    if rule.fuse is Fuse.GATE_UP:
        return torch.cat([_block(reader, name, 0, parts, index) for name in binding.hf], dim=0)
    (name,) = binding.hf
    if rule.split is Split.VOCAB:
        return _vocab_block(reader, name, layout.padded_vocab_size(spec.vocab_size), parts, index)
    return _block(reader, name, 0 if rule.split is Split.COLUMN else 1, parts, index)


def _block(reader: SliceReader, name: str, dim: int, parts: int, index: int) -> Tensor:
    size = reader.shape(name)[dim]
    if size % parts:
        raise ValueError(f"{name}: dim {dim} of shape {reader.shape(name)} does not split in {parts}")
    step = size // parts
    return reader.read(name, dim, index * step, (index + 1) * step)


def _vocab_block(reader: SliceReader, name: str, padded_rows: int, parts: int, index: int) -> Tensor:
    if padded_rows % parts:
        raise ValueError(f"{name}: {padded_rows} padded vocabulary rows do not split in {parts}")
    shape = reader.shape(name)
    step = padded_rows // parts
    start, stop = index * step, (index + 1) * step
    real_stop = min(stop, shape[0])
    if start >= real_stop:  # the whole block is padding
        return torch.zeros((step, *shape[1:]), dtype=reader.read(name, 0, 0, 0).dtype)
    rows = reader.read(name, 0, start, real_stop)
    if real_stop == stop:
        return rows
    return torch.cat((rows, rows.new_zeros((stop - real_stop, *shape[1:]))), dim=0)


def _qkv_shard(reader: SliceReader, names: Sequence[str], spec: ModelSpec, parts: int, index: int) -> Tensor:
    q_name, k_name, v_name = names
    groups, per_group, head_dim = spec.num_query_groups, spec.heads_per_group, spec.head_dim
    if groups % parts == 0:  # whole query groups per rank
        count = groups // parts
        first = index * count
        return _interleave(reader, q_name, k_name, v_name, first, count, per_group, head_dim)
    if parts % groups:
        raise ValueError(f"{groups} query groups do not split over {parts} tensor-parallel ranks")
    ranks_per_group = parts // groups  # several ranks share one group: read the rank's rows of it
    group, block = divmod(index, ranks_per_group)
    size = (per_group + 2) * head_dim // ranks_per_group
    start, stop = block * size, (block + 1) * size  # within the group's [query heads; key; value] rows
    pieces = []
    for name, offset, rows in ((q_name, 0, per_group * head_dim), (k_name, per_group * head_dim, head_dim),
                               (v_name, (per_group + 1) * head_dim, head_dim)):
        lo, hi = max(start, offset), min(stop, offset + rows)
        if lo < hi:  # the tensor's rows of this group start at group * rows
            pieces.append(reader.read(name, 0, group * rows + lo - offset, group * rows + hi - offset))
    return torch.cat(pieces, dim=0)


def _interleave(reader: SliceReader, q_name: str, k_name: str, v_name: str, first: int, count: int,
                per_group: int, head_dim: int) -> Tensor:
    """Rows of query groups ``first .. first + count``: per group its query heads, key, value."""
    q_rows = per_group * head_dim
    q = reader.read(q_name, 0, first * q_rows, (first + count) * q_rows)
    k = reader.read(k_name, 0, first * head_dim, (first + count) * head_dim)
    v = reader.read(v_name, 0, first * head_dim, (first + count) * head_dim)
    columns = q.shape[1:]
    blocks = (q.reshape(count, q_rows, *columns), k.reshape(count, head_dim, *columns),
              v.reshape(count, head_dim, *columns))
    return torch.cat(blocks, dim=1).reshape(-1, *columns)
