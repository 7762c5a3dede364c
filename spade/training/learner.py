"""The learner: the Megatron model, its optimizer and one GRPO update per step, on every rank.

``Learner.build(...)`` loads the policy from a Hugging Face directory into Megatron's GPTModel
(every parallel layout; each rank reads only its stage, experts and tensor-parallel rows or
columns, ``rank_weights``), the frozen reference policy when the KL term is on, and the optimizer
with its scheduler. On a GPU without Transformer Engine it first refuses settings whose step
memory cannot fit (``memory_plan``). Then, once per step:

* ``update(samples)`` runs one GRPO step on the step's samples, sharded over the data-parallel
  ranks (every rank passes the same list). ``old_logprobs`` stay None (ratio 1 against the
  detached current log-probs); the samples' rollout log-probs give truncated importance sampling;
  with the KL term, the reference model scores the samples first (brought to the device only for
  that when offloading). Every log-prob is taken at the temperature the sample was drawn with
  (``TrainSample.temperature``), or at ``loss.logprob_temperature`` when that is a number. An empty list trains nothing and says so in the metrics.
* ``weight_stream()`` yields every Hugging Face tensor of the current policy on every rank (TP and
  EP shards gathered, other pipeline stages broadcast), for the rollout engine.

``memory`` is the training state's offloader when the rollout engine shares the GPUs (None
otherwise): the rollout manager moves it around the engine's generation phase.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from ..peak_memory import no_phase
from ..rl.samples import TrainSample
from .optimizer import OptimizerSettings
from .train_step import LossSettings

log = logging.getLogger("spade.train")


@dataclass(frozen=True)
class LearnerOptions:
    """How the learner is built (taken from the run's config by the composition root)."""

    optimizer: OptimizerSettings
    loss: LossSettings
    micro_batch_tokens: int
    dtype: torch.dtype
    recompute: str = "none"
    recompute_method: str = "uniform"  # with recompute "full": uniform | block
    recompute_num_layers: int = 1  # with recompute "full": layers per group (uniform) or recomputed (block)
    core_attention: str = "sdpa"  # the local spec's core attention: sdpa | unfused (models.builder.BuildOptions)
    memory_check: bool = True  # refuse a local-spec GPU step whose memory estimate exceeds the device
    offload: bool = False  # keep the training state on the host while the engine generates
    offload_on_host: bool = False  # tests: really move (free and restore) on a CPU run


class Learner:
    def __init__(self, *, spec: Any, layout: Any, ctx: Any, options: LearnerOptions, model: Any,
                 ref_model: Any, optimizer: Any, scheduler: Any, build_options: Any):
        self.spec = spec
        self.layout = layout
        self.ctx = ctx
        self.options = options
        self.model = model
        self.ref_model = ref_model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.build_options = build_options
        self.memory = None  # StagedOffload (options.offload)
        self.ref_memory = None  # the reference model's parameters, likewise
        if options.offload:
            from .offload import StagedOffload, TrainingOffloader

            self.memory = StagedOffload(model.chunks, optimizer, move_on_host=options.offload_on_host)
            if ref_model is not None:  # on the device only while it scores the step's samples
                self.ref_memory = TrainingOffloader(ref_model.chunks, kinds=("params",),
                                                    move_on_host=options.offload_on_host)
                self.ref_memory.offload()

    @classmethod
    def build(cls, hf_dir: Path, hf_config: dict, layout: Any, ctx: Any, options: LearnerOptions) -> "Learner":
        from ..models import RankCoords, read_model_spec
        from ..models.builder import BuildOptions, naming_for
        from .model_provider import build_model
        from .optimizer import build_optimizer
        from .rank_weights import read_rank_state

        spec = read_model_spec(dict(hf_config))
        build_options = BuildOptions(params_dtype=options.dtype, recompute=options.recompute,
                                     recompute_method=options.recompute_method,
                                     recompute_num_layers=options.recompute_num_layers,
                                     core_attention=options.core_attention)
        if options.memory_check:  # before anything is read or allocated
            from .memory_plan import check_local_spec_step

            check_local_spec_step(spec, layout, build_options, options.micro_batch_tokens,
                                  data_parallel=ctx.dp_size,
                                  distributed_optimizer=options.optimizer.use_distributed_optimizer,
                                  reference_model=options.loss.kl_coef > 0 and not options.offload)
        # only this rank's stage, experts and tensor-parallel block leave the disk
        rank_state = read_rank_state(hf_dir, spec, layout, RankCoords.current(), naming_for(build_options))
        distributed = options.optimizer.use_distributed_optimizer
        model = build_model(spec, layout, options=build_options, rank_state=rank_state,
                            use_distributed_optimizer=distributed,
                            overlap_grad_reduce=options.optimizer.overlap_grad_reduce)
        ref_model = None  # the frozen reference policy of the KL term: the initial weights
        if options.loss.kl_coef > 0:
            ref_model = build_model(spec, layout, options=build_options, rank_state=rank_state,
                                    use_distributed_optimizer=distributed)
        del rank_state
        if options.loss.routing_replay == "rollout":
            from megatron_patches.router_replay import attach, check_supported

            check_supported(pipeline_stages=layout.pp, recompute=options.recompute)
            attach(model.chunks)
            if ref_model is not None:
                attach(ref_model.chunks)
        optimizer, scheduler = build_optimizer(model.chunks, options.optimizer)
        return cls(spec=spec, layout=layout, ctx=ctx, options=options, model=model, ref_model=ref_model,
                   optimizer=optimizer, scheduler=scheduler, build_options=build_options)

    @property
    def chunks(self) -> list:
        return self.model.chunks

    # ------------------------------------------------------------------ one update

    def update(self, samples: Sequence[TrainSample], on_phase: Callable[[str], None] = no_phase) -> dict[str, Any]:
        """One GRPO step on ``samples`` (the same list on every rank); ``train/*`` metrics.
        ``on_phase`` is called as each phase ends: "logprobs" (the reference model's pass, with
        the KL term), "forward_backward", "optimizer"."""
        from .advantage_control import shuffle_advantages, shuffle_seed
        from .batching import data_parallel_shard, filler_micro_batch, make_micro_batches
        from .train_step import compute_logprobs, train_step

        if not samples:
            return {"train/loss": None, "train/samples": 0.0, "train/skipped_no_samples": 1.0}
        samples = consistent_logprobs(list(samples))
        samples = at_logprob_temperature(samples, self.options.loss.logprob_temperature)
        samples = over_denominator(samples, self.options.loss.sample_mean_denominator)
        if self.options.loss.control_shuffle_advantages:
            samples = shuffle_advantages(samples, shuffle_seed(samples))
        mine = [samples[i] for i in data_parallel_shard(samples, self.ctx.dp_size, self.ctx.dp_rank)]
        multiple = self.layout.tp if self.layout.sequence_parallel else 1
        budget = self.options.micro_batch_tokens
        micro_batches = make_micro_batches(mine, budget, pad_to_multiple_of=multiple)
        if self.ref_model is not None and mine:
            if self.ref_memory is not None:
                self.ref_memory.onload()
            loss = self.options.loss
            ref = compute_logprobs(self.ref_model.chunks, micro_batches, chunk_size=loss.logprob_chunk_size)
            if self.ref_memory is not None:
                self.ref_memory.offload()
            mine = [dataclasses.replace(s, ref_logprobs=lp) for s, lp in zip(mine, ref)]
            micro_batches = make_micro_batches(mine, budget, pad_to_multiple_of=multiple)
            on_phase("logprobs")
        if not micro_batches:  # this rank got no sample: it still takes part in the collectives
            micro_batches = [filler_micro_batch(max(2, multiple))]
        result = train_step(self.model.chunks, self.optimizer, self.scheduler, micro_batches, self.options.loss,
                            on_phase=on_phase)
        metrics: dict[str, Any] = {f"train/{k}": v for k, v in result.to_dict().items()}
        metrics["train/skipped_no_samples"] = 0.0
        if self.options.loss.routing_replay == "rollout":
            metrics.update(self._router_agreement())
        return metrics

    def _router_agreement(self) -> dict[str, float]:
        """``train/router_agreement``: the share of recorded token-layer decisions where the
        policy's own top-k set equals the rollout's, over every rank (a rank that sees the same
        tokens twice, tensor-parallel without sequence parallelism, doubles both counts alike)."""
        import torch.distributed as dist

        from megatron_patches.router_replay import agreement_counts

        if self.ref_model is not None:
            agreement_counts(self.ref_model.chunks)  # the reference pass's counts are not the policy's
        counts = torch.tensor(agreement_counts(self.model.chunks), dtype=torch.float64, device=self.ctx.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(counts)
        agree, total = counts.tolist()
        return {"train/router_agreement": agree / total} if total > 0 else {}

    # ------------------------------------------------------------------ weights for the engine

    def weight_stream(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every HF tensor of the model, on every rank (all ranks must consume it to the end);
        offloaded parameters are brought back to the device first."""
        from ..models import RankCoords
        from ..models.builder import naming_for
        from ..models.loading import RankExport, StageBroadcast, all_hf_weights, ep_all_gather, group_gather

        if len(self.model.chunks) > 1:
            raise NotImplementedError("weight sync with virtual pipeline stages (several model chunks per rank)")
        if self.memory is not None:
            self.memory.onload_params()
        layout = self.layout
        gather = group_gather() if max(layout.tp, layout.expert_tp) > 1 else None
        return all_hf_weights(self.model.chunks[0], self.spec,
                              RankExport(layout, RankCoords.current(), gather, naming_for(self.build_options)),
                              ep_gather=ep_all_gather() if layout.ep > 1 else None,
                              stages=StageBroadcast(self.ctx.device) if layout.pp > 1 else None)

    # ------------------------------------------------------------------ checkpoints

    def on_device(self) -> None:
        """Everything on the device (before a checkpoint reads it)."""
        if self.memory is not None:
            self.memory.onload()

    def off_device(self) -> None:
        """Everything back to host (after a checkpoint, while the engine generates)."""
        if self.memory is not None:
            self.memory.offload_state()
            self.memory.offload_params()


def at_logprob_temperature(samples: list[TrainSample], setting: str | float) -> list[TrainSample]:
    """The samples with the temperature their trainer log-probs are taken at: their own sampling
    temperature for ``"sampling"`` (unchanged), else ``setting`` for all of them (the released
    code's 1.0: ``LossSettings.logprob_temperature``). The rollout log-probs stay the engine's."""
    if setting == "sampling":
        return samples
    return [dataclasses.replace(s, temperature=float(setting)) for s in samples]


def over_denominator(samples: list[TrainSample], denominator: str | int) -> list[TrainSample]:
    """The samples weighted so that a ``sample_mean`` loss over them, which divides by their count
    ``n`` (the sum of ``count_weight``), divides by ``max(denominator, n)`` instead: every
    ``loss_weight`` times ``n / denominator`` when ``n < denominator`` (``LossSettings.sample_mean_denominator``;
    ``"samples"``: unchanged). The released reducer with the KL term on: slime's sum of sample means
    over the configured global batch, its padding samples adding 0 (``slime/spade_rollout.py:844-866``)."""
    if denominator == "samples":
        return samples
    count = sum(s.count_weight for s in samples)
    if count >= int(denominator):
        return samples
    factor = count / int(denominator)
    return [dataclasses.replace(s, loss_weight=s.loss_weight * factor) for s in samples]


def consistent_logprobs(samples: list[TrainSample]) -> list[TrainSample]:
    """make_micro_batches wants each log-prob field on all samples or none: drop partial ones."""
    for name in ("old_logprobs", "rollout_logprobs", "ref_logprobs"):
        present = sum(getattr(s, name) is not None for s in samples)
        if 0 < present < len(samples):
            log.warning("%s present on %d of %d samples: dropped for this step", name, present, len(samples))
            samples = [dataclasses.replace(s, **{name: None}) for s in samples]
    return samples
