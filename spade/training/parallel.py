"""Process group and Megatron parallel state for one ``ParallelLayout``.

``init_parallel`` is the first call of a training process. It joins (or creates) the
torch.distributed world: from torchrun's environment (``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/
``MASTER_PORT``) when present, otherwise as a world of one; gloo on CPU, nccl with CUDA. It then
applies ``megatron_patches`` (CPU support), initialises ``megatron.core.parallel_state`` for the
layout (data parallelism is what is left of the world) and seeds torch and Megatron's named RNG
streams. It also makes the world's control group (``collectives.init_control_group``: gloo, timeout
``control_timeout_minutes``), over which ranks exchange objects and wait at barriers for as long as
rank 0 runs rollouts; ``timeout_minutes`` is the timeout of the default group and of Megatron's
groups, whose collectives carry tensors and never wait on rank 0's rollouts. Calling it again with the same layout reuses everything; with another layout the model
parallel groups are rebuilt inside the same world (tests use that to run several layouts in one
launch). ``teardown_parallel`` undoes it. ``parallel_session`` is both around a block, for tools
that run inside a caller's world as well as on their own (``spade score``, the converters): it
destroys the process group afterwards only if it created it.

Sequence parallelism is not part of the parallel state (it is a model config flag); the layout
carries it to the model builder.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import socket
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from spade.collectives import CONTROL_TIMEOUT, forget_control_group, init_control_group
from spade.models import ParallelLayout, RankCoords

CONTROL_TIMEOUT_MINUTES = CONTROL_TIMEOUT.total_seconds() / 60


@dataclass(frozen=True)
class ParallelContext:
    """Where this process sits: world, data-parallel and model-parallel coordinates."""

    layout: ParallelLayout
    world_size: int
    rank: int
    local_rank: int
    dp_size: int
    dp_rank: int
    coords: RankCoords
    device: torch.device
    backend: str

    @property
    def is_last_stage(self) -> bool:
        return self.coords.is_last_stage(self.layout)


def data_parallel_size(layout: ParallelLayout, world_size: int) -> int:
    """World size divided by ``tp * pp``; raises ValueError when a layout does not fit the world."""
    model_parallel = layout.tp * layout.pp
    if world_size % model_parallel:
        raise ValueError(
            f"world size {world_size} is not a multiple of tp * pp = {layout.tp} * {layout.pp}"
        )
    expert_parallel = layout.ep * layout.expert_tp * layout.pp
    if world_size % expert_parallel:
        raise ValueError(
            f"world size {world_size} is not a multiple of ep * etp * pp = "
            f"{layout.ep} * {layout.expert_tp} * {layout.pp}"
        )
    if layout.sequence_parallel and layout.tp == 1:
        raise ValueError("sequence_parallel needs tensor parallelism (tp > 1)")
    return world_size // model_parallel


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def default_backend() -> str:
    """NCCL where CUDA is: Megatron's DDP issues coalesced collectives on CUDA tensors, which gloo
    refuses (all-reduce) or has no CUDA path for (all-gather)."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def join_world(backend: Optional[str] = None, timeout_minutes: float = 30) -> None:
    """Join the world torchrun describes, or make a world of one; ``default_backend()`` unless
    ``backend`` is given. Nothing happens when this process is in a world already."""
    if dist.is_initialized():
        return
    backend = backend or default_backend()
    timeout = datetime.timedelta(minutes=timeout_minutes)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    else:
        if torch.cuda.is_available():
            torch.cuda.set_device(0)
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
            timeout=timeout,
        )


def _current_sizes() -> tuple[int, int, int, int]:
    from megatron.core import parallel_state as ps

    return (
        ps.get_tensor_model_parallel_world_size(),
        ps.get_pipeline_model_parallel_world_size(),
        ps.get_expert_model_parallel_world_size(),
        ps.get_expert_tensor_parallel_world_size(),
    )


def init_parallel(
    layout: ParallelLayout = ParallelLayout(),
    *,
    seed: int = 1234,
    backend: Optional[str] = None,
    timeout_minutes: float = 30,
    control_timeout_minutes: float = CONTROL_TIMEOUT_MINUTES,
) -> ParallelContext:
    """Join the world, make its control group, set up Megatron's parallel state for ``layout`` and
    seed the RNGs."""
    import megatron_patches
    from megatron.core import parallel_state as ps

    megatron_patches.apply_all()
    join_world(backend, timeout_minutes)
    init_control_group(datetime.timedelta(minutes=control_timeout_minutes))
    world_size = dist.get_world_size()
    dp_size = data_parallel_size(layout, world_size)

    wanted = (layout.tp, layout.pp, layout.ep, layout.expert_tp)
    if ps.model_parallel_is_initialized() and _current_sizes() != wanted:
        ps.destroy_model_parallel()
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(
            tensor_model_parallel_size=layout.tp,
            pipeline_model_parallel_size=layout.pp,
            expert_model_parallel_size=layout.ep,
            expert_tensor_parallel_size=layout.expert_tp,
            distributed_timeout_minutes=timeout_minutes,
        )
    megatron_patches.seed_model_parallel_rng(seed)

    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    return ParallelContext(
        layout=layout,
        world_size=world_size,
        rank=dist.get_rank(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        dp_size=dp_size,
        dp_rank=ps.get_data_parallel_rank(),
        coords=RankCoords.current(),
        device=device,
        backend=dist.get_backend(),
    )


def teardown_parallel(*, destroy_process_group: bool = True) -> None:
    """Destroy Megatron's parallel state and (by default) every process group of the world.

    A group is torn down (its gloo threads joined, its NCCL communicators freed) only when nothing
    holds it any more: the caller drops its models, optimizers and autograd graphs first, and
    garbage in reference cycles (a trainer's) is collected here. A group that outlives this call
    is torn down during interpreter exit instead, where a gloo thread that still has to release a
    tensor can abort the process after a run that succeeded."""
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if destroy_process_group and dist.is_initialized():
        gc.collect()
        forget_control_group()
        dist.destroy_process_group()


@contextlib.contextmanager
def parallel_session(
    layout: ParallelLayout = ParallelLayout(),
    *,
    seed: int = 1234,
    backend: Optional[str] = None,
    timeout_minutes: float = 30,
    control_timeout_minutes: float = CONTROL_TIMEOUT_MINUTES,
) -> Iterator[ParallelContext]:
    """``init_parallel`` for the body; afterwards Megatron's parallel state is destroyed, and the
    process group too if this session created it (a caller's group is left alone)."""
    created = not dist.is_initialized()
    ctx = init_parallel(layout, seed=seed, backend=backend, timeout_minutes=timeout_minutes,
                        control_timeout_minutes=control_timeout_minutes)
    try:
        yield ctx
    finally:
        teardown_parallel(destroy_process_group=created)
