"""Build this rank's GPTModel for training, optionally load HF weights, and wrap it in DDP.

``build_model`` returns a ``TrainModel``: the DDP-wrapped chunk list that the Megatron schedule,
optimizer and checkpoint code take, plus the spec and layout it was built for. It also sets the
handful of ``TransformerConfig`` fields the train step relies on, so a model from here is ready for
``train_step``:

* ``calculate_per_token_loss = True`` (before DDP is built: DDP then sums gradients over
  data-parallel ranks instead of averaging them) and ``finalize_model_grads_func``: the loss of
  each micro-batch is a *sum* and ``finalize_model_grads`` divides all gradients once by the
  global loss-token count (see ``train_step``).
* ``variable_seq_lengths = True`` and ``pipeline_dtype``: pipeline stages exchange activation
  shapes, so micro-batches may differ in shape.
* each GPTModel is tagged with the unpadded vocabulary size (``VOCAB_SIZE_ATTR``), which the
  log-prob path needs to keep Megatron's padded vocabulary rows out of the softmax.

Build and DDP wrapping run inside ``cpu_device_mode()`` (a no-op with CUDA). Random initialisation
is kept even when HF weights are loaded: it is where Megatron tags tensor-parallel weights, which
the gradient norm relies on (the builder refuses to skip it under tensor parallelism).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Optional

import torch
from torch import Tensor

from spade.models import ModelSpec, ParallelLayout, RankCoords
from spade.models.builder import BuildOptions, build_gpt_model, naming_for
from spade.models.loading import load_hf_state, load_rank_state

VOCAB_SIZE_ATTR = "spade_vocab_size"


@dataclass
class TrainModel:
    """The DDP-wrapped model chunks of this rank and what they were built from."""

    chunks: list[torch.nn.Module]
    spec: ModelSpec
    layout: ParallelLayout
    options: BuildOptions

    @property
    def config(self):
        """The shared TransformerConfig."""
        from megatron.core.utils import get_model_config

        return get_model_config(self.chunks[0])

    def unwrapped(self) -> list[torch.nn.Module]:
        """The GPTModel of each chunk (DDP and Float16Module removed)."""
        from megatron.core.utils import unwrap_model

        return [unwrap_model(chunk) for chunk in self.chunks]


def _check_parallel_state(layout: ParallelLayout) -> None:
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        raise RuntimeError("call spade.training.parallel.init_parallel(layout) before build_model")
    sizes = (
        ps.get_tensor_model_parallel_world_size(),
        ps.get_pipeline_model_parallel_world_size(),
        ps.get_expert_model_parallel_world_size(),
        ps.get_expert_tensor_parallel_world_size(),
    )
    wanted = (layout.tp, layout.pp, layout.ep, layout.expert_tp)
    if sizes != wanted:
        raise RuntimeError(f"parallel state has (tp, pp, ep, etp) = {sizes}, the layout wants {wanted}")


def _prepare_config(config) -> None:
    from megatron.core.distributed import finalize_model_grads

    config.calculate_per_token_loss = True
    config.variable_seq_lengths = True
    config.pipeline_dtype = config.params_dtype
    config.finalize_model_grads_func = finalize_model_grads


def build_model(
    spec: ModelSpec,
    layout: ParallelLayout,
    *,
    options: BuildOptions = BuildOptions(),
    hf_state: Optional[Mapping[str, Tensor]] = None,
    rank_state: Optional[Mapping[str, Tensor]] = None,
    use_distributed_optimizer: bool = False,
    grad_reduce_in_fp32: bool = True,
    overlap_grad_reduce: bool = False,
) -> TrainModel:
    """This rank's model for ``layout`` (parallel state must be initialised for it).

    ``hf_state``: HF checkpoint-named tensors (``spade.models.transformers_state`` converts a
    transformers model's state dict), copied over the random initialisation. The initialisation
    is not skipped: it is also where Megatron tags tensor-parallel weights.
    ``rank_state``: instead of ``hf_state``, this rank's Megatron-named shards as
    ``spade.training.rank_weights.read_rank_state`` reads them (only this rank's part of a checkpoint).
    ``use_distributed_optimizer`` must match the optimizer built on these chunks.
    ``overlap_grad_reduce``: DDP starts each gradient bucket's data-parallel reduction during the
    last micro-batch's backward (``OptimizerSettings.overlap_grad_reduce``).
    """
    import megatron_patches
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.tensor_parallel import set_defaults_if_not_set_tensor_model_parallel_attributes
    from megatron.core.transformer.module import Float16Module

    _check_parallel_state(layout)
    if hf_state is not None and rank_state is not None:
        raise ValueError("pass hf_state or rank_state, not both")
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=grad_reduce_in_fp32,
        overlap_grad_reduce=overlap_grad_reduce,
        use_distributed_optimizer=use_distributed_optimizer,
    )
    with megatron_patches.cpu_device_mode():
        gpt = build_gpt_model(spec, layout, options)
        setattr(gpt, VOCAB_SIZE_ATTR, spec.vocab_size)
        for param in gpt.parameters():
            set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        if hf_state is not None:
            load_hf_state(gpt, hf_state, spec, layout, RankCoords.current(), naming_for(options))
        elif rank_state is not None:
            load_rank_state(gpt, rank_state)
        config = gpt.config
        _prepare_config(config)
        module = Float16Module(config, gpt) if (config.bf16 or config.fp16) else gpt
        ddp = DistributedDataParallel(config, ddp_config, module)
        ddp.broadcast_params()  # identical replicas whatever the initialisation did
        config.no_sync_func = ddp.no_sync
    return TrainModel(chunks=[ddp], spec=spec, layout=layout, options=options)


def true_vocab_size(gpt: torch.nn.Module) -> int:
    """The unpadded vocabulary size recorded by ``build_model``."""
    size = getattr(gpt, VOCAB_SIZE_ATTR, None)
    if size is None:
        raise RuntimeError(
            "this GPTModel has no recorded vocabulary size; build it with "
            "spade.training.model_provider.build_model"
        )
    return int(size)
