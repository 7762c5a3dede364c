"""The Megatron-core training backend: parallel state, model provider, optimizer, micro-batches and
the GRPO train step (CPU with gloo and GPU alike). Checkpoints live in ``checkpoint.py``."""

from ..rl.samples import TrainSample
from .batching import MicroBatch, data_parallel_shard, make_micro_batches
from .model_provider import TrainModel, build_model
from .optimizer import OptimizerSettings, build_optimizer
from .parallel import ParallelContext, init_parallel, parallel_session, teardown_parallel
from .train_step import (
    LossSettings,
    LossSummary,
    TrainStepMetrics,
    compute_logprobs,
    forward_backward,
    train_step,
)

__all__ = [
    "LossSettings",
    "LossSummary",
    "MicroBatch",
    "OptimizerSettings",
    "ParallelContext",
    "TrainModel",
    "TrainSample",
    "TrainStepMetrics",
    "build_model",
    "build_optimizer",
    "compute_logprobs",
    "data_parallel_shard",
    "forward_backward",
    "init_parallel",
    "make_micro_batches",
    "parallel_session",
    "teardown_parallel",
    "train_step",
]
