"""The weight map applied to a live Megatron model: load HF tensors in, stream HF tensors out.

``load_hf_state`` copies this rank's shards (``weight_map.hf_to_megatron``) into a model and
insists that every parameter was covered. ``hf_weights`` reads a model's local parameters and
yields ``(hf_name, full tensor)`` through ``weight_map.iter_hf_weights`` (the rank's place and
gather in a :class:`RankExport`); ``group_gather`` builds
the all-gather that needs, from Megatron's TP / expert-TP process groups. DDP and Float16Module
wrappers are unwrapped first.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Optional

import torch
from torch import Tensor

from .hf_config import ModelSpec
from .layout import ParallelLayout, RankCoords
from .weight_map import Gather, GroupKind, MegatronNaming, bindings, hf_to_megatron, iter_hf_weights


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    from megatron.core.utils import unwrap_model

    return unwrap_model(model)


@torch.no_grad()
def load_hf_state(
    model: torch.nn.Module,
    hf_state: Mapping[str, Tensor],
    spec: ModelSpec,
    layout: ParallelLayout = ParallelLayout(),
    coords: RankCoords = RankCoords(),
    naming: MegatronNaming = MegatronNaming(),
) -> None:
    """Copy HF checkpoint tensors into this rank's model; every parameter must be covered."""
    load_rank_state(model, hf_to_megatron(hf_state, spec, layout, coords, naming))


@torch.no_grad()
def load_rank_state(model: torch.nn.Module, shards: Mapping[str, Tensor]) -> None:
    """Copy this rank's Megatron-named shards into its model; every parameter must be covered."""
    model = _unwrap(model)
    params = dict(model.named_parameters())
    uncovered = sorted(params.keys() - shards.keys())
    unknown = sorted(shards.keys() - params.keys())
    if uncovered or unknown:
        raise KeyError(
            f"weight map mismatch: parameters not mapped {uncovered[:5]}, "
            f"mapped names not in the model {unknown[:5]}"
        )
    for name, param in params.items():
        shard = shards[name]
        if shard.shape != param.shape:
            raise ValueError(
                f"{name}: shard {tuple(shard.shape)} vs parameter {tuple(param.shape)}"
            )
        param.copy_(shard)


def group_gather() -> Gather:
    """All-gather over Megatron's tensor-parallel ("tp") or expert-tensor-parallel ("etp") group."""
    from megatron.core import parallel_state as ps

    def gather(shard: Tensor, group: GroupKind) -> list[Tensor]:
        if group == "tp":
            return _all_gather(shard, ps.get_tensor_model_parallel_group())
        return _all_gather(shard, ps.get_expert_tensor_parallel_group())

    return gather


def _all_gather(tensor: Tensor, group) -> list[Tensor]:
    import torch.distributed as dist

    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, tensor.contiguous(), group=group)
    return out


@dataclass(frozen=True)
class RankExport:
    """How one rank's parameters become HF tensors: the model's parallel layout, this rank's
    coordinates in it, the all-gather over its TP / expert-TP groups (``group_gather``; may be
    omitted when both sizes are 1) and the model's Megatron naming."""

    layout: ParallelLayout = ParallelLayout()
    coords: RankCoords = RankCoords()
    gather: Optional[Gather] = None
    naming: MegatronNaming = MegatronNaming()


@torch.no_grad()
def hf_weights(model: torch.nn.Module, spec: ModelSpec,
               rank: RankExport = RankExport()) -> Iterator[tuple[str, Tensor]]:
    """(HF name, full tensor) for the parameters this rank's stage / expert rank owns."""
    local = {name: param.detach() for name, param in _unwrap(model).named_parameters()}
    yield from iter_hf_weights(local, spec, rank.layout, rank.coords, rank.gather, rank.naming)


def ep_all_gather() -> "EPGather":
    """All-gather over Megatron's expert-model-parallel group (one tensor per EP rank, in rank order)."""
    from megatron.core import parallel_state as ps

    def gather(tensor: Tensor) -> list[Tensor]:
        return _all_gather(tensor, ps.get_expert_model_parallel_group())

    return gather


EPGather = Callable[[Tensor], list[Tensor]]


class StageBroadcast:
    """Pipeline-parallel hand-over for ``all_hf_weights``: stage ``s``'s tensors broadcast to the
    ranks of the other stages (over Megatron's pipeline group, whose rank ``s`` is stage ``s``).
    Each tensor goes as a small header (name, shape, dtype) and then its data; ``None`` ends a
    stage."""

    def __init__(self, device: torch.device):
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        self.group = ps.get_pipeline_model_parallel_group()
        self.sources = [dist.get_global_rank(self.group, s) for s in range(dist.get_world_size(self.group))]
        self.device = device

    def header(self, value: Optional[tuple], stage: int) -> Optional[tuple]:
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=self.sources[stage], group=self.group)
        return box[0]

    def tensor(self, tensor: Optional[Tensor], stage: int, shape: tuple, dtype: torch.dtype) -> Tensor:
        import torch.distributed as dist

        if tensor is None:
            tensor = torch.empty(shape, dtype=dtype, device=self.device)
        else:
            tensor = tensor.contiguous()
        dist.broadcast(tensor, src=self.sources[stage], group=self.group)
        return tensor


@torch.no_grad()
def all_hf_weights(
    model: torch.nn.Module,
    spec: ModelSpec,
    rank: RankExport = RankExport(),
    ep_gather: Optional[EPGather] = None,
    stages: Optional[StageBroadcast] = None,
) -> Iterator[tuple[str, Tensor]]:
    """Every HF tensor of the model on every rank, in the same order everywhere.

    Like ``hf_weights``, but each rank also receives what other ranks own: under expert
    parallelism the experts of the other expert-parallel ranks (``ep_gather``), under pipeline
    parallelism the other stages' tensors (``stages``), so that a rollout server worker fed by
    any one rank gets the whole model. The experts of EP rank ``e`` follow each other in ``e``
    order at the place the local experts would have been; stages follow each other in order.
    Every rank of the world must iterate to the end.
    """
    layout = rank.layout
    if layout.pp == 1:
        yield from _stage_weights(model, spec, rank, ep_gather)
        return
    if stages is None:
        raise ValueError(f"pipeline parallelism pp={layout.pp}: pass stages (StageBroadcast)")
    for stage in range(layout.pp):
        if stage == rank.coords.pp:
            for name, tensor in _stage_weights(model, spec, rank, ep_gather):
                stages.header((name, tuple(tensor.shape), tensor.dtype), stage)
                yield name, stages.tensor(tensor, stage, tensor.shape, tensor.dtype)
            stages.header(None, stage)
            continue
        while (header := stages.header(None, stage)) is not None:
            name, shape, dtype = header
            yield name, stages.tensor(None, stage, shape, dtype)


def _stage_weights(model: torch.nn.Module, spec: ModelSpec, rank: RankExport,
                   ep_gather: Optional[EPGather]) -> Iterator[tuple[str, Tensor]]:
    """This stage's tensors with every expert-parallel rank's experts."""
    layout, coords = rank.layout, rank.coords
    stream = hf_weights(model, spec, rank)
    if layout.ep == 1:
        yield from stream
        return
    if ep_gather is None:
        raise ValueError(f"expert parallelism ep={layout.ep}: pass ep_gather")
    names_by_rank = [
        [name for b in bindings(spec, layout, dataclasses.replace(coords, ep=e), rank.naming) if b.export
         for name in b.hf]
        for e in range(layout.ep)
    ]
    for index, (name, tensor) in enumerate(stream):
        per_rank = [names[index] for names in names_by_rank]
        if per_rank[coords.ep] != name:
            raise RuntimeError(f"weight stream out of step with the bindings at {index}: {name} vs {per_rank[coords.ep]}")
        if len(set(per_rank)) == 1:
            yield name, tensor
            continue
        for other, gathered in zip(per_rank, ep_gather(tensor)):
            yield other, gathered
