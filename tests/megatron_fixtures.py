"""A single-process world with Megatron's parallel state, for tests that build Megatron models:
gloo on CPU, NCCL where CUDA is (the GPU tests), as ``spade.training.parallel`` joins worlds.

``megatron_world`` is a session fixture; test modules import it by name. Setting up is idempotent
(a second module importing the fixture, or a world someone else already started, is reused), and
the process group is torn down when the interpreter exits.
"""

from __future__ import annotations

import atexit
import socket

import pytest
import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure_megatron_world(seed: int = 1234) -> None:
    """World of size 1, megatron-core patched, model parallel state (1, 1), RNG seeded."""
    import megatron_patches
    from megatron.core import parallel_state as ps

    from spade.training.parallel import default_backend

    megatron_patches.apply_all()
    if not dist.is_initialized():
        backend = default_backend()
        if backend == "nccl":
            torch.cuda.set_device(0)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        atexit.register(_teardown)
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(1, 1)
    megatron_patches.seed_model_parallel_rng(seed)


def _teardown() -> None:
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def megatron_world() -> None:
    ensure_megatron_world()
