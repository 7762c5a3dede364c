"""The RNG state a checkpoint carries: capture, restore, and the reseed when it cannot be restored.

The state is python's, numpy's, torch's CPU generator, CUDA's when present, and Megatron's named
tracker streams. A checkpoint stores it as one ShardedObject per rank, keyed by the rank's
(pipeline, tensor, data-parallel) coordinates (:func:`rng_grid`). Loaded at the layout and world it
was saved with, it is restored exactly; otherwise it is reseeded from the step
(``RESEED_BASE + step``) and a note is logged.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Mapping

import torch

log = logging.getLogger(__name__)

RNG_KEY = "spade.rng_state"
RESEED_BASE = 1234  # reseed value when RNG state cannot be restored: RESEED_BASE + step


def rng_grid() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global shape, this rank's offset) over (pipeline, tensor, data-parallel incl. context)."""
    from megatron.core import parallel_state as ps

    shape = (ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size(),
             ps.get_data_parallel_world_size(with_context_parallel=True))
    offset = (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank(),
              ps.get_data_parallel_rank(with_context_parallel=True))
    return shape, offset


def capture_rng() -> dict[str, Any]:
    """This process's RNG state: python, torch CPU, CUDA (None without), Megatron's tracker, numpy."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    state: dict[str, Any] = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": {k: v.clone() for k, v in get_cuda_rng_tracker().get_states().items()},
    }
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:
        state["numpy"] = None
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Put back a state :func:`capture_rng` returned."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if state.get("numpy") is not None:
        import numpy

        numpy.random.set_state(state["numpy"])
    get_cuda_rng_tracker().set_states(dict(state["tracker"]))


def reseed(step: int, why: str) -> None:
    """Seed every generator with ``RESEED_BASE + step`` and log ``why`` the saved state was not used."""
    import megatron_patches

    seed = RESEED_BASE + step
    log.warning("RNG state not restored (%s); reseeded with seed %d (= %d + step)", why, seed,
                RESEED_BASE)
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    megatron_patches.seed_model_parallel_rng(seed)


def rng_object(data: Any):
    """This rank's RNG state (``None`` to request it at load) as the ShardedObject a checkpoint holds."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    shape, offset = rng_grid()
    return ShardedObject(RNG_KEY, data, shape, offset, replica_id=0)
