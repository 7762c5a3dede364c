"""Small object collectives over the trainer's ``torch.distributed`` world (each a no-op in a world
of one), and ``in_thread`` to run a blocking collective without stalling the event loop.

Used by the trainer loop (rank 0's commands), the checkpoint code and the SGLang deployment.

These are control messages, and a rank may wait in one for as long as rank 0 runs rollouts and
evaluation. They go over the *control group*: a gloo group of every rank with a long timeout
(``CONTROL_TIMEOUT``), made once by ``init_control_group`` (``training.parallel.init_parallel``
calls it). On GPUs the default group is NCCL, whose watchdog tears a waiting collective down after
the group's timeout and whose waiting kernel would sit on a GPU a colocated SGLang server is using;
gloo waits on the host. Tensors of the model (gathers, weight broadcasts) stay on NCCL groups.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

# Longer than any rollout phase plus evaluation; a rank that dies ends the job through torchrun
# long before it.
CONTROL_TIMEOUT = datetime.timedelta(hours=24)

_control: Optional[tuple[Any, "ProcessGroup"]] = None  # (the default group it was made in, the group)


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without an initialised process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_control_group(timeout: datetime.timedelta = CONTROL_TIMEOUT) -> Optional["ProcessGroup"]:
    """Make the control group (every rank at the same point: torch creates groups collectively, in
    the same order on every rank). Once per world: later calls return the group made first. None
    in a world of one."""
    global _control
    if world()[1] == 1:
        return None
    default = dist.group.WORLD
    if _control is None or _control[0] is not default:
        _control = (default, dist.new_group(backend="gloo", timeout=timeout))
    return _control[1]


def forget_control_group() -> None:
    """Let go of the control group (before the world is destroyed: a group something still holds
    keeps its threads after ``destroy_process_group``, into interpreter exit)."""
    global _control
    _control = None


def control_group() -> Optional["ProcessGroup"]:
    """The control group; made here on first use when the world was joined without
    ``init_parallel`` (every rank reaches its first control collective at the same point)."""
    return init_control_group()


def broadcast_object(value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    if world()[1] == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=control_group())
    return box[0]


def all_gather_object(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank."""
    if world()[1] == 1:
        return [value]
    out: list[Any] = [None] * world()[1]
    dist.all_gather_object(out, value, group=control_group())
    return out


def gather_object_to_0(value: Any) -> Optional[list[Any]]:
    """Every rank's ``value`` in rank order on rank 0; None elsewhere."""
    rank, size = world()
    if size == 1:
        return [value]
    out: Optional[list[Any]] = [None] * size if rank == 0 else None
    dist.gather_object(value, out, dst=0, group=control_group())
    return out


def barrier() -> None:
    if world()[1] > 1:
        dist.barrier(group=control_group())


async def in_thread(device: torch.device, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker thread bound to ``device``: CUDA's current device is per thread,
    and a CUDA-IPC serialization, a gather of model tensors (NCCL) or a weight bucket made in a
    fresh thread would otherwise use GPU 0."""

    def call() -> Any:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        with torch.no_grad():
            return fn(*args)

    return await asyncio.to_thread(call)
