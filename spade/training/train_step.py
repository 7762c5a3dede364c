"""One GRPO update with Megatron, and the no-grad log-prob pass.

Loss normalisation. ``spade.rl.loss.policy_loss`` returns a mean over the micro-batch it sees.
Averaging such means over micro-batches or data-parallel ranks would weight tokens by how the
batch happened to be split. Instead each micro-batch's loss function returns the *sum*
``mean * count`` together with ``count`` (loss tokens for ``token_mean``, sequences with a loss
token for ``seq_mean_token_mean``, every sequence for ``sample_mean``, or the sum of the samples'
``TrainSample.count_weight``: an episode's turn samples count once together), the model config has ``calculate_per_token_loss`` (set by
``build_model``), so neither the schedule nor DDP rescales anything, and ``finalize_model_grads``
divides every gradient once by the global count (summed over micro-batches, broadcast along the
pipeline, all-reduced over data-parallel ranks). The step's loss and gradients are therefore
those of one ``policy_loss`` call on the whole global batch, however it is split into
micro-batches and ranks. The reported metrics are reduced the same way (token- or count-weighted
sums, all-reduced over data-parallel ranks, broadcast from the last pipeline stage).

A micro-batch without ``old_logprobs`` uses the current log-probs, detached (ratio 1: the
on-policy case of a single update per batch).

Temperature. Every log-prob here (the current policy's, the no-grad pass's for old or reference
log-probs) is taken at ``TrainSample.temperature`` (carried per target by
``MicroBatch.temperatures``). With ``LossSettings.logprob_temperature`` ``"sampling"`` (spade's
default) that is the temperature each sample was drawn with, the distribution the engine's rollout
log-probs describe; a number (the released code's 1.0) replaces it for every sample
(``Learner.update``), so the importance weights compare that policy with the sampler's.
Beside the truncated importance weights the step reports how far the two policies are apart:
``rollout_logprob_abs_diff`` and ``rollout_kl`` (``spade.rl.loss.LossMetrics``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import partial
from typing import Callable, Literal, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from spade.config import require
from spade.peak_memory import no_phase
from spade.rl.loss import AGGREGATIONS, TOKEN_MEANS, LossStats, policy_loss

from .batching import MicroBatch
from .forward_logprobs import is_last_stage, micro_batch_logprobs, stage_forward
from .schedule import device as _device
from .schedule import run_schedule


ROUTING_REPLAY: tuple[str, ...] = ("off", "rollout")


@dataclass(frozen=True)
class LossSettings:
    """GRPO loss knobs (SPEC section 1 step 5) and the log-prob computation.

    ``aggregation``: how token losses become the step's loss (``spade.rl.loss.policy_loss``);
    ``sample_mean`` is the released code's reducer (slime's sum of per-sample token means divided
    by the step's sample count, ``slime@bf14dc2:slime/backends/megatron_utils/loss.py``), counted
    over every micro-batch and data-parallel rank. ``logprob_temperature``: ``"sampling"`` takes
    every trainer log-prob at the temperature its sample was drawn with; a number ``T`` takes them
    all at ``T`` (the released code: 1.0, slime's ``--rollout-temperature 1.0`` in
    ``cmd/games/train_spade_4b.sh:77`` while the rollout samples at 0.6).
    ``sample_mean_denominator`` (``sample_mean`` only): ``"samples"`` divides by the step's sample
    count; a number ``N`` divides a step with fewer samples by ``N`` instead (``max(N, count)``): the
    released reducer with the KL term on, where slime divides by ``--global-batch-size`` and the
    rescale to the real count is skipped (``slime/spade_rollout.py:844-866``; applied by
    ``Learner.update``, :func:`spade.training.learner.over_denominator`).
    """

    eps_low: float = 0.2
    eps_high: float = 0.28
    tis_cap: float = 2.0
    kl_coef: float = 0.0
    aggregation: Literal["token_mean", "seq_mean_token_mean", "sample_mean"] = "token_mean"
    logprob_temperature: Literal["sampling"] | float = "sampling"
    logprob_chunk_size: int = 1024
    # MoE rollout routing replay (R3): "rollout" routes every token the engine reported by the
    # engine's experts (docs/routing_replay.md); "off" lets the trainer's routers choose.
    routing_replay: Literal["off", "rollout"] = "off"
    sample_mean_denominator: Literal["samples"] | int = "samples"
    # the learning check's control arm only (docs/learning.md): each step's advantages permuted among
    # its samples before the loss (spade.training.advantage_control), so nothing can be learned
    control_shuffle_advantages: bool = False

    def __post_init__(self) -> None:
        require(self.aggregation in AGGREGATIONS, "aggregation",
                f"{self.aggregation!r} is not allowed; choose one of: {', '.join(AGGREGATIONS)}")
        require(0.0 <= self.eps_low < 1.0, "eps_low", f"must be in [0, 1), got {self.eps_low}")
        require(self.eps_high >= 0.0, "eps_high", f"must be >= 0, got {self.eps_high}")
        require(self.tis_cap > 0.0, "tis_cap", f"must be > 0, got {self.tis_cap}")
        require(self.kl_coef >= 0.0, "kl_coef", f"must be >= 0, got {self.kl_coef}")
        require(self.routing_replay in ROUTING_REPLAY, "routing_replay",
                f"{self.routing_replay!r} is not allowed; choose one of: {', '.join(ROUTING_REPLAY)}")
        temperature = self.logprob_temperature
        require(temperature == "sampling" or (isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
                                              and temperature > 0), "logprob_temperature",
                f"{temperature!r} is not allowed; choose one of: sampling (each sample's own sampling "
                "temperature), a number > 0 (the released code: 1.0)")
        denominator = self.sample_mean_denominator
        require(denominator == "samples" or (isinstance(denominator, int) and not isinstance(denominator, bool)
                                             and denominator >= 1), "loss.sample_mean_denominator",
                f"{denominator!r} is not allowed; choose one of: samples (the step's sample count), an integer "
                ">= 1 (the released reducer with the KL term on: the launcher's --global-batch-size)")
        require(denominator == "samples" or self.aggregation == "sample_mean", "loss.sample_mean_denominator",
                f"a number needs aggregation sample_mean, got aggregation {self.aggregation!r}")
        require(self.logprob_chunk_size >= 1, "logprob_chunk_size", f"must be >= 1, got {self.logprob_chunk_size}")


@dataclass(frozen=True)
class LossSummary(LossStats):
    """Loss statistics of a whole step (global batch), as ``LossMetrics`` would give for one call,
    with the step's masked tokens, all tokens and samples."""

    loss_tokens: int
    tokens: int
    samples: int


@dataclass(frozen=True)
class TrainStepMetrics(LossSummary):
    """``LossSummary`` plus the optimizer side of the step."""

    grad_norm: float = 0.0
    lr: float = 0.0
    micro_batches: int = 0  # per data-parallel rank (every rank runs the same number)
    skipped: bool = False  # the optimizer rejected the update (e.g. fp16 overflow)

    def to_dict(self) -> dict[str, float]:
        out = {k: (float(v) if not isinstance(v, bool) else v) for k, v in dataclasses.asdict(self).items()}
        out["clip_frac"] = self.clip_frac
        return out


_FIELDS = ("loss", "pg_loss", *TOKEN_MEANS, "count", "loss_tokens", "tokens", "samples")


class _Totals:
    """Weighted sums of per-micro-batch ``LossMetrics`` (fp64, reduced across ranks at the end)."""

    def __init__(self) -> None:
        self.values = torch.zeros(len(_FIELDS), dtype=torch.float64)

    def add(self, metrics, count: int, micro_batch: MicroBatch) -> None:
        tokens, scale = metrics.num_tokens, max(count, 1)  # the sum policy_loss divided (see _loss_func)
        row = dict(loss=metrics.loss * scale, pg_loss=metrics.pg_loss * scale, count=count,
                   loss_tokens=tokens, tokens=micro_batch.num_tokens,
                   samples=len(micro_batch.sample_indices))
        row.update({name: getattr(metrics, name) * tokens for name in TOKEN_MEANS})
        self.values += torch.tensor([row[name] for name in _FIELDS], dtype=torch.float64)

    def add_counts(self, micro_batch: MicroBatch, count: int = 0) -> None:
        """A micro-batch without loss tokens: only its tokens, samples and loss count (``sample_mean``)."""
        self.values[_FIELDS.index("count")] += count
        self.values[_FIELDS.index("tokens")] += micro_batch.num_tokens
        self.values[_FIELDS.index("samples")] += len(micro_batch.sample_indices)

    def reduce(self) -> LossSummary:
        from megatron.core import parallel_state as ps

        values = self.values.to(_device())
        dp_group = ps.get_data_parallel_group()
        if dist.get_world_size(dp_group) > 1:
            dist.all_reduce(values, group=dp_group)
        if ps.get_pipeline_model_parallel_world_size() > 1:
            dist.broadcast(values, src=ps.get_pipeline_model_parallel_last_rank(),
                           group=ps.get_pipeline_model_parallel_group())
        total = dict(zip(_FIELDS, values.cpu().tolist()))
        count, tokens = max(total["count"], 1.0), max(total["loss_tokens"], 1.0)
        return LossSummary(
            loss=total["loss"] / count,
            pg_loss=total["pg_loss"] / count,
            **{name: total[name] / tokens for name in TOKEN_MEANS},
            loss_tokens=int(round(total["loss_tokens"])),
            tokens=int(round(total["tokens"])),
            samples=int(round(total["samples"])),
        )


def _loss_count(micro_batch: MicroBatch, aggregation: str) -> int:
    """What the step's loss is divided by, this micro-batch's share (module docstring)."""
    if aggregation == "token_mean":
        return micro_batch.num_loss_tokens
    if aggregation == "sample_mean":
        # Megatron adds this up in an int tensor (schedules' total_num_tokens, torch.int), so the
        # counts are integers: an episode's turn samples do not split its count into 1/T each, its
        # first turn sample carries all of it (count weights 1, 0, ..., 0; a common multiple of the
        # turn counts would overflow int32 on long games). A filler micro-batch has none.
        return micro_batch.sample_count
    return micro_batch.num_loss_sequences


def _loss_func(micro_batch: MicroBatch, settings: LossSettings, totals: _Totals, logprobs: Tensor):
    if micro_batch.num_loss_tokens == 0:
        # Nothing to train on (a filler micro-batch, or all-prompt samples): a zero that keeps
        # the graph, so the backward and its collectives still run on this rank. Under
        # sample_mean its samples still count in the step's denominator.
        count = _loss_count(micro_batch, settings.aggregation)
        totals.add_counts(micro_batch, count)
        return (logprobs * 0.0).sum(), torch.tensor(count, dtype=torch.int, device=logprobs.device), {}
    old = micro_batch.old_logprobs if micro_batch.old_logprobs is not None else logprobs.detach()
    loss, metrics = policy_loss(
        logprobs,
        old,
        micro_batch.advantages,
        micro_batch.loss_mask,
        eps_low=settings.eps_low,
        eps_high=settings.eps_high,
        rollout_logprobs=micro_batch.rollout_logprobs,
        tis_cap=settings.tis_cap,
        ref_logprobs=micro_batch.ref_logprobs,
        kl_coef=settings.kl_coef,
        aggregation=settings.aggregation,
        **_sample_weights(micro_batch, settings.aggregation),
    )
    count = _loss_count(micro_batch, settings.aggregation)
    totals.add(metrics, count, micro_batch)
    # A sum, not a mean: finalize_model_grads divides by the global count (module docstring).
    # policy_loss divides by max(count, 1): a micro-batch of an episode's later turn samples has
    # count 0 and a loss that is already its sum.
    return loss * max(count, 1), torch.tensor(count, dtype=torch.int, device=loss.device), {}


def _sample_weights(micro_batch: MicroBatch, aggregation: str) -> dict:
    """The samples' loss and count weights for a ``sample_mean`` loss (none: every weight 1)."""
    if aggregation != "sample_mean" or micro_batch.loss_weights is None:
        return {}
    return dict(sample_weights=micro_batch.loss_weights, sample_counts=micro_batch.count_weights)


def _train_step_fn(settings: LossSettings, totals: _Totals, model: torch.nn.Module, micro_batch: MicroBatch):
    _replay_targets(model, micro_batch)
    output = stage_forward(model, micro_batch)
    if not is_last_stage(model):
        return output, None
    logprobs = micro_batch_logprobs(model, output, micro_batch, chunk_size=settings.logprob_chunk_size)
    return logprobs, partial(_loss_func, micro_batch, settings, totals)


def _replay_targets(model: torch.nn.Module, micro_batch: MicroBatch) -> None:
    """The micro-batch's recorded experts to the routers that replay (none attached: nothing)."""
    from megatron_patches.router_replay import set_targets

    set_targets(model, micro_batch.routed_experts)


def _check_config(model_chunks: Sequence[torch.nn.Module]) -> None:
    from megatron.core.utils import get_model_config

    config = get_model_config(model_chunks[0])
    if not config.calculate_per_token_loss or config.finalize_model_grads_func is None:
        raise RuntimeError(
            "the model config is not prepared for train_step (calculate_per_token_loss and "
            "finalize_model_grads_func): build the model with spade.training.model_provider.build_model"
        )


def forward_backward(
    model_chunks: Sequence[torch.nn.Module],
    micro_batches: Sequence[MicroBatch],
    loss_settings: LossSettings = LossSettings(),
) -> LossSummary:
    """Zero the gradient buffers, run forward and backward over all micro-batches and finalize
    the gradients (DP reduction and division by the global count); no optimizer step. The
    gradients are left in each parameter's ``main_grad``."""
    _check_config(model_chunks)
    for chunk in model_chunks:
        chunk.zero_grad_buffer()
    totals = _Totals()
    run_schedule(model_chunks, micro_batches, partial(_train_step_fn, loss_settings, totals), forward_only=False)
    return totals.reduce()


def train_step(
    model_chunks: Sequence[torch.nn.Module],
    optimizer,
    scheduler,
    micro_batches: Sequence[MicroBatch],
    loss_settings: LossSettings = LossSettings(),
    on_phase: Callable[[str], None] = no_phase,
) -> TrainStepMetrics:
    """One optimizer update on this rank's micro-batches (the global batch is the union over
    data-parallel ranks). ``scheduler`` (an ``OptimizerParamScheduler``) advances after a
    successful update; ``lr`` reports the rate used by this update. ``on_phase`` is called with
    "forward_backward" and "optimizer" as each ends (``spade.peak_memory.PhaseMemory.mark``)."""
    import megatron_patches

    optimizer.zero_grad()
    summary = forward_backward(model_chunks, micro_batches, loss_settings)
    on_phase("forward_backward")
    lr = float(optimizer.param_groups[0]["lr"]) if optimizer.param_groups else 0.0
    with megatron_patches.cpu_device_mode():
        updated, grad_norm, _ = optimizer.step()
        if grad_norm is None and updated:
            grad_norm = optimizer.get_grad_norm()
    if updated and scheduler is not None:
        scheduler.step(increment=1)
    on_phase("optimizer")
    return TrainStepMetrics(
        **dataclasses.asdict(summary),
        grad_norm=float(grad_norm) if grad_norm is not None else math.nan,
        lr=lr,
        micro_batches=len(micro_batches),
        skipped=not updated,
    )


def _logprob_step_fn(chunk_size: int, store: dict, model: torch.nn.Module, micro_batch: MicroBatch):
    _replay_targets(model, micro_batch)
    output = stage_forward(model, micro_batch)
    if not is_last_stage(model):
        return output, None
    logprobs = micro_batch_logprobs(model, output, micro_batch, chunk_size=chunk_size)
    for row, index in enumerate(micro_batch.sample_indices):
        length = int(micro_batch.lengths[row]) - 1
        store[index] = logprobs[row, :length].detach().float().cpu()

    def loss_func(output_tensor: Tensor):
        zero = output_tensor.new_zeros(())
        return zero, torch.zeros((), dtype=torch.int, device=zero.device), {}

    return logprobs, loss_func


@torch.no_grad()
def compute_logprobs(
    model_chunks: Sequence[torch.nn.Module],
    micro_batches: Sequence[MicroBatch],
    *,
    chunk_size: int = 1024,
) -> list[Tensor]:
    """Log-probs of every sample's targets under the current weights, without gradients (old
    log-probs before an update, or reference log-probs with the reference weights loaded), each
    at its sample's temperature (``MicroBatch.temperatures``).

    Returns one fp32 CPU tensor of ``len(token_ids) - 1`` values per sample, indexed like the
    sample list the micro-batches were made from; identical on every rank of a data-parallel
    replica (computed on the last pipeline stage and broadcast).
    """
    from megatron.core import parallel_state as ps

    store: dict[int, Tensor] = {}
    run_schedule(model_chunks, micro_batches, partial(_logprob_step_fn, chunk_size, store),
                 forward_only=True)
    lengths: dict[int, int] = {}
    for micro_batch in micro_batches:
        for row, index in enumerate(micro_batch.sample_indices):
            lengths[index] = int(micro_batch.lengths[row]) - 1
    order = sorted(lengths)
    if order != list(range(len(order))):
        raise ValueError("micro-batches must cover sample indices 0..n-1 exactly once")
    if ps.get_pipeline_model_parallel_world_size() > 1:
        flat = (torch.cat([store[i] for i in order]) if store
                else torch.zeros(sum(lengths.values()), dtype=torch.float32)).to(_device())
        dist.broadcast(flat, src=ps.get_pipeline_model_parallel_last_rank(),
                       group=ps.get_pipeline_model_parallel_group())
        return list(torch.split(flat.cpu(), [lengths[i] for i in order]))
    return [store[i] for i in order]
