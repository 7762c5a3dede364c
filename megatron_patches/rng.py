"""CPU versions of the CUDA RNG tracker in ``megatron.core.tensor_parallel.random``.

Megatron keeps named generator streams (``data-parallel-rng``, ``model-parallel-rng``,
``expert-parallel-rng``) in ``CudaRNGStatesTracker``; dropout inside tensor-parallel regions runs
under ``tracker.fork()``. Upstream ``CudaRNGStatesTracker.add`` and ``.fork`` and the module
helpers ``_get_cuda_rng_state`` / ``_set_cuda_rng_state`` (also used by activation recompute) read
and write CUDA generator state, so a CPU forward fails with "cuda rng state model-parallel-rng is
not added" or a CUDA assertion.

Without CUDA this module swaps those four for versions that keep the same named streams as CPU
generator states and swap them in and out of the default CPU generator, which is what the CUDA
version does with the default CUDA generator. The streams therefore keep their meaning (per-TP-rank
dropout, reproducible recompute), unlike the inference tracker, whose ``fork`` does nothing.

``seed_model_parallel_rng`` is the one call a trainer makes after ``initialize_model_parallel``;
it works with and without CUDA.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from megatron.core.tensor_parallel import random as tp_random

from ._util import cuda_available, replace

NAME = "rng"


def _get_state_on_cpu(device=None, clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    """Stand-in for ``_get_cuda_rng_state``: the default CPU generator's state (a copy)."""
    return torch.get_rng_state()


def _set_state_on_cpu(new_state: torch.Tensor, device=-1, graph_safe: bool = False) -> None:
    """Stand-in for ``_set_cuda_rng_state``."""
    torch.set_rng_state(new_state)


def _add_on_cpu(self: tp_random.CudaRNGStatesTracker, name: str, seed: int) -> None:
    """Register stream ``name`` seeded with ``seed`` without touching the default generator."""
    self._is_initialized = True
    if seed in self.seeds_:
        raise Exception(f"seed {seed} already exists")
    if name in self.states_:
        raise Exception(f"rng state {name} already exists")
    self.seeds_.add(seed)
    self.states_[name] = torch.Generator().manual_seed(seed).get_state()


@contextlib.contextmanager
def _fork_on_cpu(
    self: tp_random.CudaRNGStatesTracker, name: str = tp_random._MODEL_PARALLEL_RNG_TRACKER_NAME
) -> Iterator[None]:
    """Run the body on stream ``name``; its progress is kept, the outer stream is restored."""
    if name not in self.states_:
        raise Exception(f"rng state {name} is not added")
    outer_state = torch.get_rng_state()
    outer_name = self._current_state_name
    torch.set_rng_state(self.states_[name])
    self._current_state_name = name
    try:
        yield
    finally:
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(outer_state)
        self._current_state_name = outer_name


def apply() -> bool:
    if cuda_available():
        return False
    changed = replace(tp_random, "_get_cuda_rng_state", _get_state_on_cpu)
    changed |= replace(tp_random, "_set_cuda_rng_state", _set_state_on_cpu)
    changed |= replace(tp_random.CudaRNGStatesTracker, "add", _add_on_cpu)
    changed |= replace(tp_random.CudaRNGStatesTracker, "fork", _fork_on_cpu)
    return changed


def seed_model_parallel_rng(
    seed: int,
    *,
    tp_rank: Optional[int] = None,
    ep_rank: Optional[int] = None,
    etp_rank: Optional[int] = None,
) -> None:
    """Seed the default generators and Megatron's named streams, on CPU or GPU.

    Call after ``parallel_state.initialize_model_parallel`` (ranks default to the ones it set up).
    On a CPU machine ``apply_all()`` must have run first, so that the tracker keeps CPU streams.
    """
    torch.manual_seed(seed)
    tp_random.model_parallel_cuda_manual_seed(
        seed, tp_rank=tp_rank, ep_rank=ep_rank, etp_rank=etp_rank, force_reset_rng=True
    )
