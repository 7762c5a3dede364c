"""The trainer: ``spade train``'s loop over self-play steps, single process or under ``torchrun``.

``Trainer.run()`` builds, in this order: the parallel state, the sandbox service (rank 0, BEFORE
the model loads), with ``engine.kind: sglang`` the rollout servers (colocated, they start and then
release their weights and KV cache, so the trainer's model finds the GPUs free), the learner (the
Megatron model, reference model and optimizer), with ``engine.kind: hf`` the in-process engine
(rank 0), then corpus, memory and orchestrator (rank 0). When resuming it loads the newest
complete checkpoint (model, optimizer, RNG, scheduler, orchestrator), rolls the memory back and
truncates ``metrics.jsonl``. The engine gets the trainer's weights before the first step (version
= start step; always sent, as released servers keep none), so a straight and a resumed run serve
rollouts from identical weights. Then every step is Algorithm 1 (:meth:`Trainer.one_step`)::

    out = await role.produce(step)                              # rank 0: orchestrator.run_step, steps 1-4 and 6
    samples = await role.switch_to_training(out)                # the engine offloaded, the samples on
                                                                # every rank, training onloaded
    metrics = await update(samples)                             # step 5: one GRPO step
    await publish(step, samples)                                # the engine serves the new policy
    record                                                      # the metrics line (step_metrics)

with a checkpoint every run.checkpoint_every steps and after the last. How steps follow each other
(synchronous, or one step off policy with ``run.overlap: 1``) is the schedule's (``spade.run.loops``);
what a rank does in a step besides the update is its role's (``spade.run.roles``, chosen at build);
every figure of the step's line is made in ``spade.run.step_metrics``.

``step`` is a :class:`~spade.selfplay.step.Step`, the updates done before it; ``step.after`` is the
weight version the step publishes and the number of the checkpoint written after it.

What each engine does around the update (release, offload, restart, weight transport) is the
rollout manager's (``spade.rollout.manager``); what the update does (sharding over data-parallel
ranks, reference-model scoring, micro-batches) is the learner's (``spade.training.learner``).
Every sample records the weight version that generated it (``train/policy_lag_*``).

With ``selfplay.rollout_shards`` > 1 the shard ranks (one per node) also start a sandbox service
and an engine (hf) or a client over their node's servers (SGLang); while rank 0 runs the step they
play their blocks of its rounds of plays (``spade.selfplay.plays.rollout_shards``) and then wait for the
samples like every rank (their role: ``roles.ShardServing``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

import torch

from ..collectives import broadcast_object
from ..peak_memory import PhaseMemory, large_allocations_from_mmap
from ..rollout.manager import HFRolloutManager, RolloutManager, SGLangRolloutManager
from ..selfplay.step import Step
from ..train_config import EMBEDDED, TrainConfig
from ..training.learner import Learner, LearnerOptions
from .best_checkpoint import suite_mean
from .loops import schedule_for, train_steps
from .metrics_writer import MetricsWriter
from .roles import Orchestrating, ShardServing, Waiting
from .step_metrics import StepMetrics
from .trackers import check_installed
from .progress import Progress
from .stop import GracefulStop
from .run_dir import RunDir, RunDirError

log = logging.getLogger("spade.train")

ISOLATION_VARIABLE = "SPADE_SANDBOX_ISOLATION"
OFFLOAD_ON_CPU_VARIABLE = "SPADE_OFFLOAD_ON_CPU"


def resolve_hf_dir(config: TrainConfig) -> Path:
    if config.model.hf_dir == EMBEDDED:
        from ..models.embedded import embedded_model_dir

        return embedded_model_dir()
    path = Path(config.model.hf_dir)
    if not (path / "config.json").is_file():
        raise RunDirError(f"model.hf_dir: {path} is not a Hugging Face model directory (no config.json)")
    return path


def torch_dtype(config: TrainConfig) -> torch.dtype:
    from .engines import resolve_dtype  # auto: bf16 on CUDA or a CPU with native bf16, else fp32

    return resolve_dtype(config.model.dtype, "cuda" if torch.cuda.is_available() else "cpu").torch


class Trainer:
    """Everything one training process holds; ``await run()`` trains to ``config.run.steps``."""

    def __init__(self, config: TrainConfig, run_dir: str | Path, *, resume: bool = False,
                 progress: Optional[Progress] = None, stop: Optional[GracefulStop] = None):
        self.config = config
        self.run_dir = RunDir(run_dir)
        self.resume = resume
        self.progress = progress
        self.stop = stop  # Ctrl-C: stop after the step in progress and its checkpoint (spade.run.stop)
        self.last_checkpoint_s: Optional[float] = None
        self.rank = 0
        self.sandbox = None
        self.rollout: Optional[RolloutManager] = None
        self.learner: Optional[Learner] = None
        self.orchestrator = None
        self.memory = None
        self.metrics: Optional[StepMetrics] = None  # every step's figures (build)
        self.resumed_from: tuple[int, ...] = ()  # the checkpoint restore() loaded
        self.phase_memory = PhaseMemory()  # peak RSS per phase of a step (memory/peak_rss_gb/*)
        self.schedule = schedule_for(config.run.overlap)  # how steps follow each other (loops)
        self.role: Optional[Waiting] = None  # what this rank does in a step besides the update (build)
        self.shards = None  # selfplay.rollout_shards > 1: the shards' channel (every rank)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def plays_shard(self) -> bool:
        """This rank plays a shard of every step's rollouts besides rank 0 (selfplay.rollout_shards)."""
        return self.shards is not None and bool(self.shards.shard)

    @property
    def plays(self) -> bool:
        """This rank holds a sandbox service, a tokenizer and (hf) an engine."""
        return self.is_main or self.plays_shard

    # ------------------------------------------------------------------ building

    async def build(self) -> None:
        from ..envs.sandbox.client import SandboxService
        from ..training.parallel import init_parallel

        cfg = self.config
        large_allocations_from_mmap()  # freed activations leave the process (peak_memory)
        self.layout = cfg.parallel.layout()
        self.ctx = init_parallel(self.layout, seed=cfg.run.seed)
        self.rank = self.ctx.rank
        if self.progress is None:
            self.progress = Progress(cfg.run.steps, log_every=cfg.run.log_every, enabled=self.is_main,
                                     env_source=cfg.selfplay.env_source)
        self.progress.enabled = self.is_main
        self.metrics = StepMetrics(self.progress, self.phase_memory)
        if self.stop is not None:
            self.stop.describe = self.stop_notice
        if cfg.selfplay.rollout_shards > 1:
            from ..selfplay.plays.rollout_shards import ShardChannel, ShardLayout

            self.shards = ShardChannel.create(ShardLayout.of(cfg.selfplay.rollout_shards, self.ctx.world_size),
                                              self.rank)

        if self.plays:  # the sandbox service starts before the model is loaded
            self.progress.phase("starting", what="sandbox")
            sandbox_config = cfg.sandbox
            isolation = os.environ.get(ISOLATION_VARIABLE)
            if isolation:
                sandbox_config = dataclasses.replace(sandbox_config, isolation=isolation)
            self.sandbox = await SandboxService.start(sandbox_config)
        broadcast_object(None)  # the other ranks wait for the sandbox

        self.hf_dir = resolve_hf_dir(cfg) if self.is_main else None
        self.hf_dir = Path(broadcast_object(str(self.hf_dir)))
        self.hf_config = json.loads((self.hf_dir / "config.json").read_text())
        if cfg.engine.kind == "sglang":
            self.progress.phase("starting", what="sglang servers")
            self.rollout = self._sglang_manager()
            await self.rollout.start()  # colocated: the servers' memory is released when it returns

        self.progress.phase("starting", what="model")
        self.learner = Learner.build(self.hf_dir, self.hf_config, self.layout, self.ctx, self._learner_options())
        if isinstance(self.rollout, SGLangRolloutManager):
            self.rollout.use_training_memory(self.learner.memory)
        if self.plays:
            from transformers import AutoTokenizer

            self.progress.phase("starting", what="engine")
            self.tokenizer = AutoTokenizer.from_pretrained(self.hf_dir)
        if self.rollout is None:
            self.rollout = HFRolloutManager(self._hf_engine() if self.plays else None, is_main=self.is_main,
                                            device=self.ctx.device)
        if self.shards is not None and self.shards.shard is not None:
            await self.rollout.open_shard(self.shards.shard, self.shards.shards)
        if self.is_main:
            self._build_selfplay()
            self.role = Orchestrating(self.rollout, self.orchestrator, self.progress, shards=self.shards,
                                      device=self.ctx.device, evaluate_now=self._evaluate, due=cfg.eval.due,
                                      best_metric=cfg.run.best_metric)
        elif self.plays_shard:
            self.role = ShardServing(self.rollout, self._shard_server())
        else:
            self.role = Waiting(self.rollout)

    def _learner_options(self) -> LearnerOptions:
        cfg = self.config
        sglang = cfg.engine.sglang
        return LearnerOptions(optimizer=cfg.optimizer, loss=cfg.loss, micro_batch_tokens=cfg.run.micro_batch_tokens,
                              dtype=torch_dtype(cfg), recompute=cfg.model.recompute,
                              recompute_method=cfg.model.recompute_method or "uniform",
                              recompute_num_layers=cfg.model.recompute_num_layers or 1,
                              core_attention=cfg.model.core_attention,
                              memory_check=cfg.model.memory_check,
                              offload=cfg.engine.kind == "sglang" and sglang.colocated and sglang.offload_training,
                              offload_on_host=os.environ.get(OFFLOAD_ON_CPU_VARIABLE) == "1")

    def _sglang_manager(self) -> SGLangRolloutManager:
        from ..rollout.sglang.deployment import SGLangDeployment

        from ..rl.routing_record import RoutingShape

        replay = self.config.loss.routing_replay == "rollout"
        deployment = SGLangDeployment(self.config.engine.sglang, model_dir=self.hf_dir,
                                      log_dir=self.run_dir.root / "logs", device=self.ctx.device,
                                      local_rank=self.ctx.local_rank,
                                      routing=RoutingShape.of_hf_config(self.hf_config) if replay else None)
        return SGLangRolloutManager(deployment, is_main=self.is_main, device=self.ctx.device)

    def _hf_engine(self):
        from .engines import EngineSettings, hf_engine

        cfg = self.config
        return hf_engine(self.hf_dir, self.tokenizer, EngineSettings(cfg.engine, cfg.model.dtype),
                         return_routed_experts=cfg.loss.routing_replay == "rollout")

    def _build_selfplay(self) -> None:
        from ..designer.corpus import Corpus
        from ..designer.memory import Memory, memory_path
        from ..rollout.conversation import thinking_template_kwargs
        from ..selfplay.orchestrator import Orchestrator

        cfg = self.config
        sp = cfg.selfplay
        corpus = None
        if sp.designer_enabled and sp.use_corpus:
            if not cfg.corpus.paths:
                raise RunDirError("corpus.paths is empty but selfplay.use_corpus is true: give a corpus "
                                  "(e.g. examples/corpus/demo.jsonl.gz) or set selfplay.use_corpus: false")
            corpus = Corpus(cfg.corpus)
            for warning in corpus.skipped_warnings:
                self.progress.message(f"warning: {warning}")
        self.memory = Memory(memory_path(self.run_dir.root), capacity=sp.memory_capacity)
        template_kwargs = thinking_template_kwargs(self.tokenizer.chat_template, cfg.model.thinking)
        self.orchestrator = Orchestrator(sp, sandbox=self.sandbox, engine=self.rollout.engine,
                                         tokenizer=self.tokenizer, corpus=corpus, memory=self.memory,
                                         run_dir=self.run_dir.root, seed=cfg.run.seed,
                                         chat_template_kwargs=template_kwargs, shards=self.shards,
                                         play_engine=self.rollout.play_engine, device=self.ctx.device,
                                         final_step=cfg.run.steps - 1)
        self.orchestrator.on_phase = self.phase_memory.mark
        self.orchestrator.on_stage = self.stage  # designing, admitting, hinting, playing

    def _shard_server(self) -> Any:
        from ..rollout.conversation import thinking_template_kwargs
        from ..selfplay.plays.rollout_shards import ShardServer, shard_player

        cfg = self.config
        engine = self.rollout.play_engine or self.rollout.engine
        player = shard_player(cfg.selfplay, sandbox=self.sandbox, engine=engine, tokenizer=self.tokenizer,
                              seed=cfg.run.seed,
                              chat_template_kwargs=thinking_template_kwargs(self.tokenizer.chat_template,
                                                                            cfg.model.thinking))
        return ShardServer(player, self.shards, self.ctx.device)

    def restore(self) -> Step:
        """Load the newest complete checkpoint; returns the step to start at (0 for a new run): the
        updates done in the checkpoint."""
        from ..training.checkpoint import load_checkpoint

        if not self.resume:
            return Step(0)
        found = self.run_dir.newest_intact_checkpoint() if self.is_main else None
        saved, warnings = broadcast_object(found)
        if saved is None and warnings:  # checkpoints exist but none is intact: never wipe the run silently
            raise RunDirError("\n".join(warnings))
        for warning in warnings:
            self.progress.message(f"warning: {warning}")
        if saved is None:
            self.progress.message(f"no complete checkpoint in {self.run_dir.checkpoints_dir}: starting at step 0")
            start = Step(0)
            if self.is_main:
                self.run_dir.truncate_metrics(start.updates_done)
                self.run_dir.forget_scores_after(start.updates_done)
                if self.memory is not None:
                    self.memory.rollback(start.last_run)
            return start
        start = Step(saved)
        self.resumed_from = (saved,)  # pruning never removes it while this run goes on
        directory = self.run_dir.checkpoint_dir(start.updates_done)
        state = broadcast_object(self.run_dir.read_trainer_state(start.updates_done) if self.is_main else None)
        load_checkpoint(directory, self.learner.chunks, optimizer=self.learner.optimizer, load_rng=True)
        if state.get("scheduler") is not None:
            self.learner.scheduler.load_state_dict(state["scheduler"])
        if self.is_main:
            self.orchestrator.load_state_dict(state["orchestrator"])
            self.schedule.load_state(state, self.config.selfplay.sampling.agent.temperature)
            ready = self.schedule.ready
            if ready is not None and ready.step != start:
                raise RunDirError(f"{directory}: its ready rollout is of step {ready.step.updates_done}, "
                                  f"not {start.updates_done}")
            # with a ready rollout in the checkpoint, the step it played has run: its records stay
            self.memory.rollback(start.updates_done if ready is not None else start.last_run)
            dropped = self.run_dir.truncate_metrics(start.updates_done)
            self.run_dir.forget_scores_after(start.updates_done)  # the best so far goes on from here
            self.progress.message(f"resumed from {directory} (step {start.updates_done}; dropped {dropped} "
                                  "metrics lines written after it)")
        return start

    # ------------------------------------------------------------------ the loop

    async def run(self) -> int:
        """Build, restore, train; returns the number of steps this process ran."""
        cfg = self.config
        try:
            # a missing tracker fails here on every rank, before any model loads
            check_installed(tuple(n for n in cfg.run.loggers if n != "tensorboard"))
            await self.build()
            start = self.restore()
            if self.is_main:
                self.metrics.writers = MetricsWriter(self.run_dir, purge_step=start.updates_done or None,
                                                     progress=self.progress, loggers=cfg.run.loggers,
                                                     config=cfg.to_dict())
            await self.rollout.publish(self.learner.weight_stream, version=start.updates_done)
            self.phase_memory.mark("build")  # reported on the first step's line
            self._warn_unaligned_best()
            ran = await train_steps(self, self.schedule, start, Step(cfg.run.steps))
            self.progress.counters = {}
            self.progress.phase("done")
            return ran
        finally:
            await self.close()

    async def one_step(self, step: Step, *, ready: Optional[Any] = None,
                       update: Optional[Callable[[list], Awaitable[dict[str, Any]]]] = None) -> None:
        """Algorithm 1, one step (see the module docstring), the same on every rank. The schedule
        (``spade.run.loops``) may hand in the step's rollout played ahead (``ready``) and an update
        that plays the next step's rollout meanwhile (``update``; the engine then keeps serving)."""
        meter = self.metrics.begin(step)
        out = await self.role.produce(step, ready=ready)  # rank 0: the orchestrator's step, steps 1-4 and 6
        samples = await self.role.switch_to_training(out, keep_serving=update is not None)
        meter.mark("plays")
        meter.training(samples, self.rollout.version)
        meter.trained(samples, await (update or self.update)(samples))
        await self.publish(step, samples)
        meter.synced(self.rollout.step_metrics())
        await meter.evaluated(self.role.evaluate(step.after))  # the policy just published, when due
        meter.record(out)

    async def update(self, samples: list) -> dict[str, Any]:
        """Step 5: one GRPO step on every rank (none without samples)."""
        return self.learner.update(samples, on_phase=self.phase_memory.mark)

    async def publish(self, step: Step, samples: list) -> None:
        """The engine serves the updated weights as version ``step.after`` (the same version when
        there was nothing to train on)."""
        self.progress.phase("syncing")
        version = step.after.updates_done if samples else self.rollout.version
        await self.rollout.publish(self.learner.weight_stream, version=version, changed=bool(samples))

    async def _evaluate(self, done: Step) -> dict[str, Any]:
        """Rank 0: the configured held-out benchmarks on the rollout engine (``eval/*`` metrics);
        ``done`` is the number of updates the evaluated weights have seen."""
        from ..eval.in_loop import evaluate_in_loop

        step = done.updates_done
        self.progress.phase("evaluating", at=step)
        out = await evaluate_in_loop(self.rollout.engine, self.tokenizer, self.config.eval, step,
                                     out_dir=self.run_dir.root / "eval", sandbox=self.config.sandbox,
                                     max_context_tokens=self.config.selfplay.max_context_tokens,
                                     chat_template_kwargs=self.orchestrator.chat_format.template_kwargs)
        return {**out, **suite_mean(out)}

    def _warn_unaligned_best(self) -> None:
        run, every = self.config.run, self.config.eval.every
        if self.is_main and run.best_metric != "none" and every and every % run.checkpoint_every:
            self.progress.message(f"warning: run.best_metric: only evaluated steps that are also checkpointed take "
                                  f"part (eval.every = {every} is not a multiple of run.checkpoint_every = "
                                  f"{run.checkpoint_every})")

    def stage(self, name: str, detail: Optional[str] = None, **counters: Any) -> None:
        """The orchestrator's stage change: shown, and a place where a dropped stop-now is raised again."""
        if self.stop is not None:
            self.stop.raise_if_now()
        self.progress.phase(name, detail, **counters)

    def stop_requested(self) -> bool:
        if self.stop is not None:
            self.stop.raise_if_now()
        return self.stop is not None and self.stop.requested

    def stop_notice(self) -> Optional[str]:
        """What a Ctrl-C now does: the step in progress, its checkpoint and about how long they take
        (the last step's time less what this one has run, plus the last checkpoint's time); None
        before the first step (nothing to finish: the run stops at once)."""
        if self.progress is None or self.progress.step is None:
            return None
        step = Step(self.progress.step)
        text = (f"stopping after step {step.updates_done}'s checkpoint (checkpoints/step_{step.after.updates_done}, "
                f"where a resume starts)")
        left = self.progress.step_time_left()
        if left is None:
            return text + ", once the step's plays and update are done (its time is not known yet)"
        return text + f", about {max(1, round(left + (self.last_checkpoint_s or 0.0)))} s"

    def checkpoint(self, done: Step) -> None:
        """Every rank: save the state after ``done`` updates as ``checkpoints/step_<done>``."""
        from ..training.checkpoint import save_checkpoint

        step = done.updates_done
        self.progress.phase("checkpointing", at=step)
        began = time.perf_counter()
        self.phase_memory.start()
        directory = self.run_dir.checkpoint_dir(step)
        if self.is_main:
            directory.parent.mkdir(parents=True, exist_ok=True)
        broadcast_object(None)
        self.learner.on_device()
        save_checkpoint(directory, self.learner.chunks, hf_config=self.hf_config, layout=self.layout, step=step,
                        optimizer=self.learner.optimizer, save_rng=True, tokenizer_dir=self.hf_dir)
        error = None
        if self.is_main:
            state = {
                "step": step,
                "orchestrator": self.orchestrator.state_dict(),
                "scheduler": self.learner.scheduler.state_dict(),
                "engine_weight_version": step,
                "metrics_lines": step,
                "saved_at": time.time(),
            }
            state.update(self.schedule.state())  # run.overlap: the next step's rollout, not trained on yet
            try:
                self.run_dir.write_trainer_state(step, state)
                self.run_dir.mark_latest(step)  # the checkpoint counts from here on (verified first)
                score = self.role.eval_score
                if score is not None and score[0] == step:  # its weights were evaluated
                    self.run_dir.record_score(step, score[1], metric=self.config.run.best_metric,
                                              mode=self.config.run.best_mode)
                self.run_dir.prune_checkpoints(self.config.run.keep_checkpoints, protect=self.resumed_from)
            except RunDirError as exc:
                error = str(exc)
        self.learner.off_device()  # back to host: the engine generates next
        self.phase_memory.mark("checkpoint")  # reported on the next step's line (one_step)
        self.last_checkpoint_s = time.perf_counter() - began
        if done == Step(self.config.run.steps) and self.is_main:
            self.progress.message(f"checkpoint {step}: peak RSS "
                                  f"{self.phase_memory.metrics()['memory/peak_rss_gb']:.2f} GB")
        error = broadcast_object(error)  # every rank stops together rather than waiting on rank 0
        if error is not None:
            raise RunDirError(error)

    async def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.progress is not None:
            self.progress.close()
        if self.orchestrator is not None:
            await self.orchestrator.close()
        if self.rollout is not None:
            await self.rollout.close()
        if self.memory is not None:
            self.memory.close()
        if self.sandbox is not None:
            await self.sandbox.close()


def train(config: TrainConfig, run_dir: str | Path, *, resume: bool = False,
          progress: Optional[Progress] = None, stop: Optional[GracefulStop] = None) -> int:
    """Run the trainer to ``config.run.steps`` in this process (one rank); returns steps run.

    A world this call joined (the torchrun world, or a world of one) is left once the run ends
    cleanly: the trainer, and with it every model and optimizer holding a group, is gone by then,
    so the groups are torn down now rather than during interpreter exit. After an error the world
    is left as it is (the error's traceback still holds the trainer)."""
    import torch.distributed as dist

    from ..training.parallel import teardown_parallel

    joined = not dist.is_initialized()
    ran = asyncio.run(Trainer(config, run_dir, resume=resume, progress=progress, stop=stop).run())
    if joined:
        teardown_parallel()
    return ran
