"""The weight map applied to a live Megatron model: load HF tensors in, stream HF tensors out.

``load_hf_state`` copies this rank's shards (``weight_map.hf_to_megatron``) into a model and
insists that every parameter was covered. ``hf_weights`` reads a model's local parameters and
yields ``(hf_name, full tensor)`` through ``weight_map.iter_hf_weights``; ``group_gather`` builds
the all-gather that needs, from Megatron's TP / expert-TP process groups. DDP and Float16Module
wrappers are unwrapped first.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Optional

import torch
from torch import Tensor

from .hf_config import ModelSpec
from .layout import ParallelLayout, RankCoords
from .weight_map import Gather, GroupKind, MegatronNaming, hf_to_megatron, iter_hf_weights


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
    model = _unwrap(model)
    shards = hf_to_megatron(hf_state, spec, layout, coords, naming)
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
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    def gather(shard: Tensor, group: GroupKind) -> list[Tensor]:
        if group == "tp":
            pg = ps.get_tensor_model_parallel_group()
        else:
            pg = ps.get_expert_tensor_parallel_group()
        shards = [torch.empty_like(shard) for _ in range(dist.get_world_size(pg))]
        dist.all_gather(shards, shard.contiguous(), group=pg)
        return shards

    return gather


@torch.no_grad()
def hf_weights(
    model: torch.nn.Module,
    spec: ModelSpec,
    layout: ParallelLayout = ParallelLayout(),
    coords: RankCoords = RankCoords(),
    gather: Optional[Gather] = None,
    naming: MegatronNaming = MegatronNaming(),
) -> Iterator[tuple[str, Tensor]]:
    """(HF name, full tensor) for the parameters this rank's stage / expert rank owns."""
    local = {name: param.detach() for name, param in _unwrap(model).named_parameters()}
    yield from iter_hf_weights(local, spec, layout, coords, gather, naming)
