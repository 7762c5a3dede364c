"""Small object collectives over the trainer's ``torch.distributed`` world (each a no-op in a world
of one), and ``in_thread`` to run a blocking collective without stalling the event loop.

Used by the trainer loop (rank 0's commands), the checkpoint code and the SGLang deployment.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without an initialised process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def broadcast_object(value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    if world()[1] == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_object(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank."""
    if world()[1] == 1:
        return [value]
    out: list[Any] = [None] * world()[1]
    dist.all_gather_object(out, value)
    return out


def gather_object_to_0(value: Any) -> Optional[list[Any]]:
    """Every rank's ``value`` in rank order on rank 0; None elsewhere."""
    rank, size = world()
    if size == 1:
        return [value]
    out: Optional[list[Any]] = [None] * size if rank == 0 else None
    dist.gather_object(value, out, dst=0)
    return out


def barrier() -> None:
    if world()[1] > 1:
        dist.barrier()


async def in_thread(device: torch.device, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker thread bound to ``device``: CUDA's current device is per thread,
    and a collective (NCCL) or a gather run from a fresh thread would otherwise use GPU 0."""

    def call() -> Any:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        with torch.no_grad():
            return fn(*args)

    return await asyncio.to_thread(call)
