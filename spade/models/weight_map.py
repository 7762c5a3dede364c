"""One weight map per architecture between Megatron parameters and Hugging Face tensors.

The table (``ARCHITECTURES``) is declarative: each ``Rule`` names a Megatron parameter, the HF
tensors it is made of, how they are fused and how the result is sharded. Everything else here is a
small engine that applies the table, so import (HF -> this rank's shards), export (all ranks'
shards -> HF) and live weight sync (a rank's shards + collectives -> (HF name, full tensor)) read
the same rules.

HF names are the checkpoint names (one tensor per expert and projection), which is what
safetensors files and SGLang use; ``transformers_state`` converts to and from the fused in-memory
layout of transformers 5 MoE models.

Layouts, checked against megatron-core 0.16.1:

* ``linear_qkv`` (``SelfAttention.get_query_key_value_tensors``): rows are grouped per query group
  ``g``: the ``heads_per_group`` query heads of that group, then key head ``g``, then value head
  ``g`` (``head_dim`` rows each). Tensor parallelism splits this interleaved tensor into equal
  row blocks, also when there are fewer query groups than TP ranks.
* ``linear_fc1`` (SwiGLU): each rank's shard is ``[gate rows of the rank; up rows of the rank]``,
  since ``MLP.forward`` chunks the local output in two. The rank-order concatenation of shards is
  therefore not ``[gate; up]``; merging goes shard by shard.
* Column-parallel weights split dim 0, row-parallel dim 1 (over TP, or over expert-TP for experts).
  The vocabulary (embedding and output layer) is padded with zero rows to
  ``layout.padded_vocab_size`` and split on dim 0; export drops the padding.
* Layers: ``decoder.layers.{local}`` on pipeline stage ``p`` is HF layer
  ``layout.layer_offset(p) + local``. Experts: ``local_experts.{i}`` on expert rank ``e`` is HF
  expert ``layout.expert_offset(e) + i``.
* Norms: the local spec has ``input_layernorm`` / ``pre_mlp_layernorm``; the TE spec fuses them
  into ``linear_qkv.layer_norm_weight`` / ``linear_fc1.layer_norm_weight`` (MoE layers keep a
  separate ``pre_mlp_layernorm`` there).
* Tied embeddings: no ``output_layer.weight`` with one pipeline stage; with several, the last
  stage holds a copy that is imported from ``model.embed_tokens.weight`` and skipped on export.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterator, Literal, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

from .hf_config import LLAMA, QWEN3, QWEN3_MOE, ModelSpec
from .layout import ParallelLayout, RankCoords


class Fuse(Enum):
    """How several HF tensors become one Megatron tensor."""

    NONE = "none"  # one HF tensor
    QKV = "qkv"  # q, k, v interleaved per query group
    GATE_UP = "gate_up"  # [gate; up], per shard


class Split(Enum):
    """How a Megatron tensor is sharded over its tensor-parallel group."""

    REPLICATED = "replicated"
    COLUMN = "column"  # dim 0
    ROW = "row"  # dim 1
    VOCAB = "vocab"  # dim 0, after padding the vocabulary


@dataclass(frozen=True)
class Rule:
    """One Megatron parameter and the HF tensors it is made of.

    Names are templates relative to their scope: ``{expert}`` is the local expert index on the
    Megatron side and the global one on the HF side. ``te`` is the Megatron name in the TE layer
    spec when it differs; ``grouped`` the name under TE grouped-GEMM experts. ``tied`` names the
    HF tensor this parameter copies when input and output embeddings are tied.
    """

    megatron: str
    hf: tuple[str, ...]
    fuse: Fuse = Fuse.NONE
    split: Split = Split.REPLICATED
    te: Optional[str] = None
    grouped: Optional[str] = None
    tied: Optional[tuple[str, ...]] = None


@dataclass(frozen=True)
class ArchitectureTable:
    """Rules of one architecture, by scope."""

    first_stage: tuple[Rule, ...]  # full names, on the first pipeline stage
    last_stage: tuple[Rule, ...]  # full names, on the last pipeline stage
    layer: tuple[Rule, ...]  # under decoder.layers.{i} / model.layers.{i}
    expert: tuple[Rule, ...] = ()  # under the layer, once per expert


# ---------------------------------------------------------------------------- the table

_EMBEDDING = Rule(
    "embedding.word_embeddings.weight", ("model.embed_tokens.weight",), split=Split.VOCAB
)
_FINAL_NORM = Rule("decoder.final_layernorm.weight", ("model.norm.weight",))
_OUTPUT = Rule(
    "output_layer.weight",
    ("lm_head.weight",),
    split=Split.VOCAB,
    tied=("model.embed_tokens.weight",),
)

_ATTENTION = (
    Rule(
        "input_layernorm.weight",
        ("input_layernorm.weight",),
        te="self_attention.linear_qkv.layer_norm_weight",
    ),
    Rule(
        "self_attention.linear_qkv.weight",
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        fuse=Fuse.QKV,
        split=Split.COLUMN,
    ),
    Rule("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",), split=Split.ROW),
)
_QK_NORM = (
    Rule("self_attention.q_layernorm.weight", ("self_attn.q_norm.weight",)),
    Rule("self_attention.k_layernorm.weight", ("self_attn.k_norm.weight",)),
)
_DENSE_MLP = (
    Rule(
        "pre_mlp_layernorm.weight",
        ("post_attention_layernorm.weight",),
        te="mlp.linear_fc1.layer_norm_weight",
    ),
    Rule(
        "mlp.linear_fc1.weight",
        ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
        fuse=Fuse.GATE_UP,
        split=Split.COLUMN,
    ),
    Rule("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), split=Split.ROW),
)
_MOE_MLP = (
    Rule("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",)),
    Rule("mlp.router.weight", ("mlp.gate.weight",)),
)
_EXPERTS = (
    Rule(
        "mlp.experts.local_experts.{expert}.linear_fc1.weight",
        ("mlp.experts.{expert}.gate_proj.weight", "mlp.experts.{expert}.up_proj.weight"),
        fuse=Fuse.GATE_UP,
        split=Split.COLUMN,
        grouped="mlp.experts.linear_fc1.weight{expert}",
    ),
    Rule(
        "mlp.experts.local_experts.{expert}.linear_fc2.weight",
        ("mlp.experts.{expert}.down_proj.weight",),
        split=Split.ROW,
        grouped="mlp.experts.linear_fc2.weight{expert}",
    ),
)

_FIRST, _LAST = (_EMBEDDING,), (_FINAL_NORM, _OUTPUT)

ARCHITECTURES: dict[str, ArchitectureTable] = {
    LLAMA: ArchitectureTable(_FIRST, _LAST, _ATTENTION + _DENSE_MLP),
    QWEN3: ArchitectureTable(_FIRST, _LAST, _ATTENTION + _QK_NORM + _DENSE_MLP),
    QWEN3_MOE: ArchitectureTable(_FIRST, _LAST, _ATTENTION + _QK_NORM + _MOE_MLP, _EXPERTS),
}


# ---------------------------------------------------------------------------- bindings


@dataclass(frozen=True)
class MegatronNaming:
    """Which Megatron layer spec the names come from."""

    backend: Literal["local", "te"] = "local"
    grouped_experts: bool = False  # TE grouped GEMM (TEGroupedMLP) expert parameter names

    def __post_init__(self) -> None:
        if self.grouped_experts and self.backend != "te":
            raise ValueError("grouped expert names exist only in the TE spec (TEGroupedMLP)")


GroupKind = Literal["tp", "etp"]


@dataclass(frozen=True)
class Binding:
    """A rule made concrete for one rank: full names on both sides."""

    megatron: str
    hf: tuple[str, ...]
    rule: Rule
    group: GroupKind  # the tensor-parallel group the split runs over
    export: bool = True  # False for copies (tied output layer on the last stage)


def bindings(
    spec: ModelSpec,
    layout: ParallelLayout,
    coords: RankCoords = RankCoords(),
    naming: MegatronNaming = MegatronNaming(),
) -> list[Binding]:
    """Every parameter this rank holds, in a fixed order (the same on ranks of one TP group)."""
    table = ARCHITECTURES[spec.architecture]
    found: list[Binding] = []
    if coords.is_first_stage():
        found += [Binding(r.megatron, r.hf, r, "tp") for r in table.first_stage]
    offset = layout.layer_offset(spec.num_layers, coords.pp)
    for local in range(layout.layers_per_stage(spec.num_layers)):
        found += _layer_bindings(table, spec, layout, coords, naming, local, offset + local)
    if coords.is_last_stage(layout):
        found += _last_stage_bindings(table, spec, coords)
    return found


def _megatron_name(rule: Rule, naming: MegatronNaming) -> str:
    if naming.backend == "te" and rule.te:
        return rule.te
    if naming.grouped_experts and rule.grouped:
        return rule.grouped
    return rule.megatron


def _layer_bindings(table, spec, layout, coords, naming, local: int, global_: int) -> list[Binding]:
    m_prefix, h_prefix = f"decoder.layers.{local}.", f"model.layers.{global_}."
    found = [
        Binding(m_prefix + _megatron_name(r, naming), tuple(h_prefix + h for h in r.hf), r, "tp")
        for r in table.layer
    ]
    if spec.moe is None:
        return found
    first_expert = layout.expert_offset(spec.moe.num_experts, coords.ep)
    for i in range(layout.local_experts(spec.moe.num_experts)):
        for r in table.expert:
            m_name = m_prefix + _megatron_name(r, naming).format(expert=i)
            h_names = tuple(h_prefix + h.format(expert=first_expert + i) for h in r.hf)
            found.append(Binding(m_name, h_names, r, "etp"))
    return found


def _last_stage_bindings(table, spec: ModelSpec, coords: RankCoords) -> list[Binding]:
    found = []
    for r in table.last_stage:
        if r.tied and spec.tie_embeddings:
            if coords.is_first_stage():
                continue  # one stage: the output layer reuses the embedding parameter
            found.append(Binding(r.megatron, r.tied, r, "tp", export=False))
        else:
            found.append(Binding(r.megatron, r.hf, r, "tp"))
    return found


# ---------------------------------------------------------------------------- split and merge


def _interleave_qkv(q: Tensor, k: Tensor, v: Tensor, spec: ModelSpec) -> Tensor:
    groups, per_group, head_dim = spec.num_query_groups, spec.heads_per_group, spec.head_dim
    columns = q.shape[1:]
    q = q.reshape(groups, per_group * head_dim, *columns)
    k = k.reshape(groups, head_dim, *columns)
    v = v.reshape(groups, head_dim, *columns)
    return torch.cat((q, k, v), dim=1).reshape(-1, *columns)


def _deinterleave_qkv(qkv: Tensor, spec: ModelSpec) -> tuple[Tensor, Tensor, Tensor]:
    groups, per_group, head_dim = spec.num_query_groups, spec.heads_per_group, spec.head_dim
    columns = qkv.shape[1:]
    blocks = qkv.reshape(groups, (per_group + 2) * head_dim, *columns)
    q, k, v = blocks.split((per_group * head_dim, head_dim, head_dim), dim=1)
    return (q.reshape(-1, *columns), k.reshape(-1, *columns), v.reshape(-1, *columns))


def _chunk(tensor: Tensor, dim: int, parts: int, index: int) -> Tensor:
    if tensor.shape[dim] % parts:
        raise ValueError(f"dim {dim} of shape {tuple(tensor.shape)} does not split in {parts}")
    return tensor.chunk(parts, dim=dim)[index]


def _pad_rows(tensor: Tensor, rows: int) -> Tensor:
    if tensor.shape[0] == rows:
        return tensor
    padding = tensor.new_zeros((rows - tensor.shape[0], *tensor.shape[1:]))
    return torch.cat((tensor, padding), dim=0)


def split_for_rank(
    rule: Rule,
    tensors: Sequence[Tensor],
    spec: ModelSpec,
    layout: ParallelLayout,
    parts: int,
    index: int,
) -> Tensor:
    """Megatron shard ``index`` of ``parts`` built from the full HF tensors of ``rule``."""
    if rule.fuse is Fuse.QKV:
        return _chunk(_interleave_qkv(*tensors, spec), 0, parts, index).contiguous()
    if rule.fuse is Fuse.GATE_UP:
        gate, up = tensors
        return torch.cat((_chunk(gate, 0, parts, index), _chunk(up, 0, parts, index)), dim=0)
    (tensor,) = tensors
    if rule.split is Split.REPLICATED:
        return tensor
    if rule.split is Split.VOCAB:
        return _chunk(_pad_rows(tensor, layout.padded_vocab_size(spec.vocab_size)), 0, parts, index)
    dim = 0 if rule.split is Split.COLUMN else 1
    return _chunk(tensor, dim, parts, index).contiguous()


def merge_shards(
    rule: Rule, shards: Sequence[Tensor], spec: ModelSpec
) -> tuple[Tensor, ...]:
    """Full HF tensors of ``rule`` from its Megatron shards in rank order."""
    if rule.fuse is Fuse.QKV:
        return _deinterleave_qkv(torch.cat(tuple(shards), dim=0), spec)
    if rule.fuse is Fuse.GATE_UP:
        halves = [shard.chunk(2, dim=0) for shard in shards]
        gate = torch.cat([h[0] for h in halves], dim=0)
        up = torch.cat([h[1] for h in halves], dim=0)
        return gate, up
    if rule.split is Split.REPLICATED:
        return (shards[0],)
    if rule.split is Split.VOCAB:
        return (torch.cat(tuple(shards), dim=0)[: spec.vocab_size],)
    dim = 0 if rule.split is Split.COLUMN else 1
    return (torch.cat(tuple(shards), dim=dim),)


def _group_size_and_rank(
    binding: Binding, layout: ParallelLayout, coords: RankCoords
) -> tuple[int, int]:
    if binding.group == "etp":
        return layout.expert_tp, coords.etp
    return layout.tp, coords.tp


# ---------------------------------------------------------------------------- the three uses


def hf_to_megatron(
    hf_state: Mapping[str, Tensor],
    spec: ModelSpec,
    layout: ParallelLayout = ParallelLayout(),
    coords: RankCoords = RankCoords(),
    naming: MegatronNaming = MegatronNaming(),
) -> dict[str, Tensor]:
    """This rank's Megatron state dict (parameters only) from a full HF checkpoint state."""
    found = bindings(spec, layout, coords, naming)
    missing = sorted({h for b in found for h in b.hf} - hf_state.keys())
    if missing:
        raise KeyError(f"HF state lacks {len(missing)} tensors, e.g. {missing[:5]}")
    out: dict[str, Tensor] = {}
    for binding in found:
        parts, index = _group_size_and_rank(binding, layout, coords)
        tensors = [hf_state[name] for name in binding.hf]
        out[binding.megatron] = split_for_rank(binding.rule, tensors, spec, layout, parts, index)
    return out


RankStates = Mapping[RankCoords, Mapping[str, Tensor]]


def megatron_to_hf(
    states: Union[RankStates, Mapping[str, Tensor]],
    spec: ModelSpec,
    layout: ParallelLayout = ParallelLayout(),
    naming: MegatronNaming = MegatronNaming(),
) -> dict[str, Tensor]:
    """Full HF checkpoint state from the Megatron state dicts of all ranks.

    ``states`` maps each rank's ``RankCoords`` to its state dict (replicas, e.g. data-parallel
    copies or dense weights on several expert ranks, may be given or left out). A single plain
    state dict is accepted when the layout has one rank per model copy.
    """
    if states and all(isinstance(key, str) for key in states):
        states = {RankCoords(): states}
    pieces: dict[tuple[str, ...], dict[int, Tensor]] = {}
    rules: dict[tuple[str, ...], tuple[Rule, int]] = {}
    for coords, state in states.items():
        for binding in bindings(spec, layout, coords, naming):
            if not binding.export:
                continue
            parts, index = _group_size_and_rank(binding, layout, coords)
            pieces.setdefault(binding.hf, {}).setdefault(index, state[binding.megatron])
            rules[binding.hf] = (binding.rule, parts)
    out: dict[str, Tensor] = {}
    for hf_names, by_index in pieces.items():
        rule, parts = rules[hf_names]
        if sorted(by_index) != list(range(parts)):
            raise ValueError(f"{hf_names[0]}: have shards {sorted(by_index)} of {parts}")
        merged = merge_shards(rule, [by_index[i] for i in range(parts)], spec)
        out.update(zip(hf_names, merged))
    return out


Gather = Callable[[Tensor, GroupKind], list[Tensor]]


def iter_hf_weights(
    local_state: Mapping[str, Tensor],
    spec: ModelSpec,
    layout: ParallelLayout,
    coords: RankCoords,
    gather: Optional[Gather] = None,
    naming: MegatronNaming = MegatronNaming(),
) -> Iterator[tuple[str, Tensor]]:
    """(HF name, full tensor) for every tensor this rank's pipeline stage / expert rank owns.

    ``gather(shard, group)`` must return the shards of all ranks of the named group ("tp" or
    "etp") in rank order, e.g. an all-gather over Megatron's TP / expert-TP process group; every
    rank of a group calls it for the same bindings in the same order. It may be omitted when both
    groups have size one. Live weight sync pairs this with a bucketed sender.
    """
    for binding in bindings(spec, layout, coords, naming):
        if not binding.export:
            continue
        shard = local_state[binding.megatron]
        parts, _ = _group_size_and_rank(binding, layout, coords)
        if binding.rule.split is Split.REPLICATED or parts == 1:
            shards = [shard]
        elif gather is None:
            raise ValueError(f"{binding.megatron} is split over {parts} ranks: pass gather")
        else:
            shards = gather(shard, binding.group)
        yield from zip(binding.hf, merge_shards(binding.rule, shards, spec))
