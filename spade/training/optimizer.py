"""Optimizer settings and the Megatron optimizer + learning-rate scheduler built from them.

``OptimizerSettings`` defaults are SPEC section 2: Adam (decoupled weight decay, as Megatron's
``adam``), lr 1e-6 constant, betas (0.9, 0.98), weight decay 0.1, gradient clipping at norm 1.0.
``build_optimizer`` returns ``(get_megatron_optimizer(...), OptimizerParamScheduler(...))`` for
DDP-wrapped chunks from ``build_model``. Megatron exempts biases and norm weights (1-D
parameters) from weight decay.

Schedules: ``constant``; ``cosine`` and ``linear`` decay from ``lr`` to ``min_lr`` at
``total_steps``. ``warmup_steps`` > 0 ramps linearly from 0 (Megatron's warmup: the scheduler's
step 0 has lr 0) to ``lr`` at ``warmup_steps``. The scheduler advances once per successful
update (``train_step`` does it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Sequence

import torch

from spade.config import require

SCHEDULES: tuple[str, ...] = ("constant", "cosine", "linear")


@dataclass(frozen=True)
class OptimizerSettings:
    """Adam, its learning-rate schedule and precision; invalid values raise ``ConfigError``
    (a ValueError) naming the key."""

    lr: float = 1e-6  # peak learning rate (SPEC: 1e-6, constant); 0 trains nothing (a control run)
    min_lr: float = 0.0  # floor of the cosine and linear schedules
    betas: tuple[float, float] = (0.9, 0.98)  # Adam's (beta1, beta2)
    eps: float = 1e-8  # Adam's epsilon
    weight_decay: float = 0.1  # decoupled weight decay (AdamW)
    clip_grad: float = 1.0  # 0 turns clipping off
    # learning-rate schedule after warm-up: constant, cosine or linear decay to min_lr
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = 0  # updates of linear warm-up from 0 to lr
    total_steps: Optional[int] = None  # required by cosine and linear
    use_distributed_optimizer: bool = False  # shard optimizer state over data-parallel ranks
    # Reduce (or reduce-scatter) each gradient bucket over data-parallel ranks as soon as the last
    # micro-batch's backward has filled it, instead of all of them after the backward.
    overlap_grad_reduce: bool = False
    bf16: Optional[bool] = None  # None: follow the model (bf16 params get fp32 main params)

    def __post_init__(self) -> None:
        require(self.schedule in SCHEDULES, "schedule",
                f"{self.schedule!r} is not allowed; choose one of: {', '.join(SCHEDULES)}")
        require(self.lr >= 0.0, "lr", f"must be >= 0 (0: the weights never change, a control run), got {self.lr}")
        require(0.0 <= self.min_lr <= self.lr, "min_lr", f"must be in [0, lr={self.lr}], got {self.min_lr}")
        require(len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas), "betas",
                f"must be two numbers in [0, 1), got {self.betas}")
        require(self.eps > 0.0, "eps", f"must be > 0, got {self.eps}")
        require(self.weight_decay >= 0.0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        require(self.clip_grad >= 0.0, "clip_grad", f"must be >= 0 (0 = no clipping), got {self.clip_grad}")
        require(self.warmup_steps >= 0, "warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        if self.schedule != "constant":
            require(self.total_steps is not None, "total_steps",
                    f"is required by schedule={self.schedule!r}")
        if self.total_steps is not None:
            require(self.total_steps > self.warmup_steps, "total_steps",
                    f"must be > warmup_steps={self.warmup_steps}, got {self.total_steps}")


def _model_bf16(model_chunks: Sequence[torch.nn.Module]) -> bool:
    from megatron.core.utils import get_model_config

    return bool(get_model_config(model_chunks[0]).bf16)


def _check_ddp(model_chunks: Sequence[torch.nn.Module], settings: OptimizerSettings) -> None:
    for chunk in model_chunks:
        ddp_config = getattr(chunk, "ddp_config", None)
        if ddp_config is None:
            raise TypeError("build_optimizer needs DDP-wrapped chunks (spade.training.model_provider.build_model)")
        if ddp_config.use_distributed_optimizer != settings.use_distributed_optimizer:
            raise ValueError(
                f"use_distributed_optimizer={settings.use_distributed_optimizer} but the model was wrapped "
                f"with use_distributed_optimizer={ddp_config.use_distributed_optimizer}: pass the same value "
                "to build_model"
            )


def build_optimizer(model_chunks: Sequence[torch.nn.Module], settings: OptimizerSettings = OptimizerSettings()):
    """``(optimizer, scheduler)`` for DDP-wrapped chunks; sets the model config's loss scaling hook."""
    import megatron_patches
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.utils import get_model_config

    _check_ddp(model_chunks, settings)
    model_bf16 = _model_bf16(model_chunks)
    bf16 = model_bf16 if settings.bf16 is None else settings.bf16
    if bf16 != model_bf16:
        raise ValueError(f"bf16={settings.bf16} but the model's parameters are "
                         f"{'bf16' if model_bf16 else 'not bf16'}: build the model with the matching dtype")
    config = get_model_config(model_chunks[0])
    optimizer_config = OptimizerConfig(
        optimizer="adam",
        lr=settings.lr,
        min_lr=settings.min_lr,
        weight_decay=settings.weight_decay,
        adam_beta1=settings.betas[0],
        adam_beta2=settings.betas[1],
        adam_eps=settings.eps,
        clip_grad=settings.clip_grad,
        bf16=bf16,
        params_dtype=config.params_dtype,
        use_distributed_optimizer=settings.use_distributed_optimizer,
    )
    with megatron_patches.cpu_device_mode():
        optimizer = get_megatron_optimizer(optimizer_config, list(model_chunks))
    config.grad_scale_func = optimizer.scale_loss

    decay_steps = settings.total_steps if settings.total_steps is not None else settings.warmup_steps + 1
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if settings.warmup_steps > 0 else settings.lr,
        max_lr=settings.lr,
        min_lr=settings.min_lr,
        lr_warmup_steps=settings.warmup_steps,
        lr_decay_steps=decay_steps,
        lr_decay_style=settings.schedule,
        start_wd=settings.weight_decay,
        end_wd=settings.weight_decay,
        wd_incr_steps=decay_steps,
        wd_incr_style="constant",
    )
    return optimizer, scheduler
