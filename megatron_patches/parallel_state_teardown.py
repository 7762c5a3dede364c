"""``parallel_state.destroy_model_parallel`` that lets go of every group it made (any device).

Upstream ``destroy_model_parallel`` (megatron-core 0.16.1) sets most of the module's groups to
None but misses four: ``_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP`` and its gloo twin,
``_HIERARCHICAL_CONTEXT_PARALLEL_GROUPS`` and ``_HYBRID_DP_CP_GROUPS``. Rotary embeddings hold a
group too (``cp_group``), and ``RotaryEmbedding.forward`` / ``YarnRotaryEmbedding.forward`` are
methods cached with ``lru_cache``: each cache keeps up to 32 embedding modules (and so their
groups) alive after the model that owned them is gone.

A group that something still holds survives ``torch.distributed.destroy_process_group``: its gloo
threads (or NCCL communicators) live on into interpreter exit, where a gloo thread that has to
release a tensor once Python has begun to finalize aborts the process (SIGABRT, "terminate called
without an active exception"), after a run that succeeded. The replacement calls upstream, then
resets the four globals to their import-time values and empties the two caches, whose entries
belong to models of the state being destroyed.
"""

from __future__ import annotations

from megatron.core import parallel_state
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding

from ._util import original_of, replace

NAME = "parallel_state_teardown"

CACHED_FORWARDS = (RotaryEmbedding, YarnRotaryEmbedding)


def destroy_model_parallel_releasing_groups() -> None:
    """Upstream ``destroy_model_parallel``, then the groups it leaves behind are released."""
    original_of(parallel_state, "destroy_model_parallel")()
    parallel_state._INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP = None
    parallel_state._INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO = None
    parallel_state._HIERARCHICAL_CONTEXT_PARALLEL_GROUPS = None
    parallel_state._HYBRID_DP_CP_GROUPS = {}
    for embedding in CACHED_FORWARDS:
        embedding.forward.cache_clear()


def apply() -> bool:
    return replace(parallel_state, "destroy_model_parallel", destroy_model_parallel_releasing_groups)
