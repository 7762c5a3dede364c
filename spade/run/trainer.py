"""The trainer: ``spade train``'s loop over self-play steps, single process or under ``torchrun``.

``train(config, run_dir, resume=False)`` builds, in this order: the parallel state, the sandbox
service (rank 0, BEFORE the model loads), with ``engine.kind: sglang`` the SGLang servers (every
node's local rank 0 launches its own, ``spade.rollout.sglang_deployment``), the Megatron model from
the HF directory, the optimizer, the rollout engine (rank 0: the in-process HF engine, or the
client over all servers), corpus, memory and orchestrator (rank 0). When resuming it then loads
the newest complete checkpoint (model, optimizer, RNG), the scheduler and orchestrator state,
rolls the memory back and truncates ``metrics.jsonl``. Every step:

1. ``out = await orchestrator.run_step(step)`` (rank 0). The other ranks wait for a command from
   rank 0: the samples (step 2 follows), or "a server died": the owner restarts it and every rank
   re-sends the current weights to it, while rank 0's requests to it wait and are retried;
2. sglang: generation paused and the servers' weights and KV cache released (rank 0), training
   state brought back to the GPU;
3. one GRPO update (``train_step``) on agent + released designer samples, sharded over
   data-parallel ranks (``old_logprobs`` left None: ratio 1 against the detached current
   log-probs; the samples' ``rollout_logprobs`` give truncated importance sampling). A step
   without samples skips the update and says so (``train/skipped_no_samples``);
4. weight sync with ``version = step + 1``: every rank streams the full HF tensors
   (``all_hf_weights``: TP and EP shards gathered). hf: rank 0 copies them into its engine.
   sglang: gradients and optimizer state go to host first, dead servers are restarted, weight
   memory resumed, the weights sent (CUDA IPC colocated, NCCL broadcast otherwise), KV cache
   resumed and generation continued; then the parameters go to host as well;
5. metrics (``train/*`` from ``TrainStepMetrics``, ``time/step_s``, ``time/train_s``,
   ``time/sync_s`` with the orchestrator's ``agent/``, ``designer/``, ``env/``, ``time/`` keys) to
   ``metrics.jsonl`` and TensorBoard;
6. a checkpoint every ``run.checkpoint_every`` steps and after the last step.

The engine always gets the trainer's weights before the first step (version = start step), so a
straight run and a resumed run serve rollouts from identical weights; every sample records the
weight version that generated it (``train/policy_lag_*``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, Optional

import torch

from ..train_config import EMBEDDED, TrainConfig
from ..collectives import broadcast_object, in_thread
from .progress import Progress
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


def _dtype(config: TrainConfig) -> torch.dtype:
    if config.model.dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return getattr(torch, config.model.dtype)


def _engine_device(config: TrainConfig) -> str:
    if config.engine.device == "auto":
        return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    return config.engine.device


class _Writers:
    """metrics.jsonl always; TensorBoard when the package is installed (rank 0 only)."""

    def __init__(self, run_dir: RunDir, purge_step: Optional[int], progress: Progress):
        self.run_dir = run_dir
        self.tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            progress.message(f"warning: TensorBoard is not available ({exc}); writing metrics.jsonl only")
            return
        self.tb = SummaryWriter(str(run_dir.tensorboard_dir), purge_step=purge_step)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self.run_dir.append_metrics({"step": step, **metrics})
        if self.tb is not None:
            for key, value in metrics.items():
                if isinstance(value, bool):
                    value = float(value)
                if isinstance(value, (int, float)) and math.isfinite(float(value)):
                    self.tb.add_scalar(key, float(value), global_step=step)
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


@dataclass(frozen=True)
class _Command:
    """What rank 0 tells the other ranks while it runs the orchestrator."""

    kind: Literal["samples", "recover"]
    samples: Optional[list] = None
    servers: tuple[int, ...] = ()


def _policy_lag(samples: list, version: int) -> dict[str, float]:
    lags = [version - s.weight_version for s in samples if s.weight_version is not None]
    if not lags:
        return {}
    return {"train/policy_lag_mean": sum(lags) / len(lags), "train/policy_lag_max": float(max(lags))}


def _consistent_logprobs(samples: list) -> list:
    """make_micro_batches wants each log-prob field on all samples or none: drop partial ones."""
    for name in ("old_logprobs", "rollout_logprobs", "ref_logprobs"):
        present = sum(getattr(s, name) is not None for s in samples)
        if 0 < present < len(samples):
            log.warning("%s present on %d of %d samples: dropped for this step", name, present, len(samples))
            samples = [dataclasses.replace(s, **{name: None}) for s in samples]
    return samples


class Trainer:
    """Everything one training process holds; ``await run()`` trains to ``config.run.steps``."""

    def __init__(self, config: TrainConfig, run_dir: str | Path, *, resume: bool = False,
                 progress: Optional[Progress] = None):
        self.config = config
        self.run_dir = RunDir(run_dir)
        self.resume = resume
        self.progress = progress
        self.rank = 0
        self.sandbox = None
        self.deployment = None  # SGLangDeployment (engine.kind: sglang), on every rank
        self.offloader = None  # StagedOffload (engine.sglang.offload_training)
        self.ref_offloader = None  # the frozen reference model's parameters, likewise
        self.weights_version = 0  # the version the engine serves
        self._collective_lock: Optional[asyncio.Lock] = None
        self.engine = None
        self.orchestrator = None
        self.memory = None
        self.writers: Optional[_Writers] = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ building

    async def build(self) -> None:
        from ..designer.corpus import Corpus
        from ..designer.memory import Memory, memory_path
        from ..envs.sandbox.client import SandboxService
        from ..models import read_model_spec
        from ..models.builder import BuildOptions
        from ..rollout import HFEngine
        from ..selfplay.orchestrator import Orchestrator
        from ..training.checkpoint import read_hf_tensors
        from ..training.model_provider import build_model
        from ..training.optimizer import build_optimizer
        from ..training.parallel import init_parallel

        cfg = self.config
        self.layout = cfg.parallel.layout()
        self.ctx = init_parallel(self.layout, seed=cfg.run.seed)
        self.rank = self.ctx.rank
        if self.progress is None:
            self.progress = Progress(cfg.run.steps, log_every=cfg.run.log_every, enabled=self.is_main)
        self.progress.enabled = self.is_main

        if self.is_main:  # the sandbox service starts before the model is loaded
            self.progress.phase("starting", what="sandbox")
            sandbox_config = cfg.sandbox
            isolation = os.environ.get(ISOLATION_VARIABLE)
            if isolation:
                sandbox_config = dataclasses.replace(sandbox_config, isolation=isolation)
            self.sandbox = await SandboxService.start(sandbox_config)
        broadcast_object(None)  # the other ranks wait for the sandbox

        self.hf_dir = resolve_hf_dir(cfg) if self.is_main else None
        self.hf_dir = Path(broadcast_object(str(self.hf_dir)))
        self._collective_lock = asyncio.Lock()
        if cfg.engine.kind == "sglang":  # the servers load their weights before the trainer's model
            from ..rollout.sglang_deployment import SGLangDeployment

            self.progress.phase("starting", what="sglang servers")
            self.deployment = SGLangDeployment(cfg.engine.sglang, model_dir=self.hf_dir,
                                               log_dir=self.run_dir.root / "logs", device=self.ctx.device,
                                               local_rank=self.ctx.local_rank)
            self.deployment.recover_hook = self._recover_server
            await self.deployment.start()

        self.progress.phase("starting", what="model")
        self.hf_config = json.loads((self.hf_dir / "config.json").read_text())
        self.spec = read_model_spec(dict(self.hf_config))
        self.options = BuildOptions(params_dtype=_dtype(cfg), recompute=cfg.model.recompute)
        hf_state = read_hf_tensors(self.hf_dir, self.spec)
        self.model = build_model(self.spec, self.layout, options=self.options, hf_state=hf_state,
                                 use_distributed_optimizer=cfg.optimizer.use_distributed_optimizer)
        # the frozen reference policy of the KL term (loss.kl_coef > 0): the initial weights
        self.ref_model = None
        if cfg.loss.kl_coef > 0:
            self.ref_model = build_model(self.spec, self.layout, options=self.options, hf_state=hf_state,
                                         use_distributed_optimizer=cfg.optimizer.use_distributed_optimizer)
        del hf_state
        self.optimizer, self.scheduler = build_optimizer(self.model.chunks, cfg.optimizer)
        if self.deployment is not None and cfg.engine.sglang.colocated and cfg.engine.sglang.offload_training:
            from ..training.offload import StagedOffload, TrainingOffloader

            # SPADE_OFFLOAD_ON_CPU=1 (tests): really free and restore the storages on a CPU run, so
            # that any use of the training state while it is offloaded fails there too
            move_on_host = os.environ.get(OFFLOAD_ON_CPU_VARIABLE) == "1"
            self.offloader = StagedOffload(self.model.chunks, self.optimizer, move_on_host=move_on_host)
            if self.ref_model is not None:  # on the GPU only while it scores the step's samples
                self.ref_offloader = TrainingOffloader(self.ref_model.chunks, kinds=("params",),
                                                       move_on_host=move_on_host)
                self.ref_offloader.offload()

        if self.is_main:
            from transformers import AutoTokenizer

            self.progress.phase("starting", what="engine")
            self.tokenizer = AutoTokenizer.from_pretrained(self.hf_dir)
            if self.deployment is not None:
                self.engine = self.deployment.engine
            else:
                self.engine = HFEngine(self.hf_dir, self.tokenizer, device=_engine_device(cfg), dtype=_dtype(cfg),
                                       max_batch_size=cfg.engine.max_batch_size,
                                       batch_wait_ms=cfg.engine.batch_wait_ms)
            sp = cfg.selfplay
            corpus = None
            if sp.designer_enabled and sp.use_corpus:
                if not cfg.corpus.paths:
                    raise RunDirError("corpus.paths is empty but selfplay.use_corpus is true: give a corpus "
                                      "(e.g. examples/corpus/demo.jsonl.gz) or set selfplay.use_corpus: false")
                corpus = Corpus(cfg.corpus)
            self.memory = Memory(memory_path(self.run_dir.root), capacity=sp.memory_capacity)
            self.orchestrator = Orchestrator(sp, sandbox=self.sandbox, engine=self.engine, tokenizer=self.tokenizer,
                                             corpus=corpus, memory=self.memory, run_dir=self.run_dir.root,
                                             seed=cfg.run.seed)

    def restore(self) -> int:
        """Load the newest complete checkpoint; returns the step to start at (0 for a new run)."""
        from ..training.checkpoint import load_checkpoint

        if not self.resume:
            return 0
        step = self.run_dir.latest_step() if self.is_main else None
        step = broadcast_object(step)
        if step is None:
            self.progress.message(f"no complete checkpoint in {self.run_dir.checkpoints_dir}: starting at step 0")
            if self.is_main:
                self.run_dir.truncate_metrics(0)
                if self.memory is not None:
                    self.memory.rollback(-1)
            return 0
        directory = self.run_dir.checkpoint_dir(step)
        state = broadcast_object(self.run_dir.read_trainer_state(step) if self.is_main else None)
        load_checkpoint(directory, self.model.chunks, optimizer=self.optimizer, load_rng=True)
        if state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.is_main:
            self.orchestrator.load_state_dict(state["orchestrator"])
            self.memory.rollback(step - 1)
            dropped = self.run_dir.truncate_metrics(step)
            self.progress.message(f"resumed from {directory} (step {step}; dropped {dropped} metrics lines "
                                  "written after it)")
        return step

    # ------------------------------------------------------------------ the loop

    async def run(self) -> int:
        """Build, restore, train; returns the number of steps this process ran."""
        cfg = self.config
        await self.build()
        try:
            start = self.restore()
            if self.is_main:
                self.writers = _Writers(self.run_dir, purge_step=start if start > 0 else None, progress=self.progress)
            await self.publish_weights(version=start)
            ran = 0
            last_saved = start if self.resume else None
            for step in range(start, cfg.run.steps):
                await self.one_step(step)
                ran += 1
                if (step + 1) % cfg.run.checkpoint_every == 0 or step + 1 == cfg.run.steps:
                    self.checkpoint(step + 1)
                    last_saved = step + 1
            if cfg.run.steps > start and last_saved != cfg.run.steps:
                self.checkpoint(cfg.run.steps)
            self.progress.counters = {}
            self.progress.phase("done")
            return ran
        finally:
            await self.close()

    async def one_step(self, step: int) -> None:
        from ..training.batching import data_parallel_shard, filler_micro_batch, make_micro_batches
        from ..training.train_step import compute_logprobs, train_step

        cfg = self.config
        started = time.perf_counter()
        self.progress.start_step(step)
        out_metrics: dict[str, Any] = {}
        samples = None
        if self.is_main:
            self.progress.phase("playing")
            out = await self._run_orchestrator_step(step)
            samples = list(out.agent_samples) + list(out.designer_samples)
            out_metrics = dict(out.metrics)
            out_metrics.setdefault("agent/samples", float(len(out.agent_samples)))
            out_metrics.setdefault("designer/samples", float(len(out.designer_samples)))
            for key in ("env/admitted", "env/rejected"):  # per-regeneration keys: 0 between regenerations
                out_metrics.setdefault(key, 0.0)
            if self.deployment is not None and samples:
                # Without samples nothing trains: the servers keep their memory (and weights,
                # which SGLang's memory saver does not keep across a release).
                self.progress.phase("releasing")
                await self.deployment.release()
        samples = await self._exchange_samples(samples)
        rolled = time.perf_counter()

        self.progress.phase("training", samples=len(samples))
        train_metrics: dict[str, Any] = _policy_lag(samples, self.weights_version) if self.is_main else {}
        if self.offloader is not None and samples:
            back = self.offloader.onload()
            train_metrics["time/onload_s"] = sum(report.seconds for report in back)
        if samples:
            samples = _consistent_logprobs(samples)
            mine = [samples[i] for i in data_parallel_shard(samples, self.ctx.dp_size, self.ctx.dp_rank)]
            multiple = self.layout.tp if self.layout.sequence_parallel else 1
            micro_batches = make_micro_batches(mine, cfg.run.micro_batch_tokens, pad_to_multiple_of=multiple)
            if self.ref_model is not None and mine:
                if self.ref_offloader is not None:
                    self.ref_offloader.onload()
                ref = compute_logprobs(self.ref_model.chunks, micro_batches, temperature=cfg.loss.temperature,
                                       chunk_size=cfg.loss.logprob_chunk_size)
                if self.ref_offloader is not None:
                    self.ref_offloader.offload()
                mine = [dataclasses.replace(s, ref_logprobs=lp) for s, lp in zip(mine, ref)]
                micro_batches = make_micro_batches(mine, cfg.run.micro_batch_tokens, pad_to_multiple_of=multiple)
            if not micro_batches:
                micro_batches = [filler_micro_batch(max(2, multiple))]
            result = train_step(self.model.chunks, self.optimizer, self.scheduler, micro_batches, cfg.loss)
            train_metrics.update({f"train/{k}": v for k, v in result.to_dict().items()})
            train_metrics["train/skipped_no_samples"] = 0.0
        else:
            self.progress.message(f"step {step}: no samples, the update is skipped")
            train_metrics.update({"train/loss": None, "train/samples": 0.0, "train/skipped_no_samples": 1.0})
        trained = time.perf_counter()

        self.progress.phase("syncing")
        restarted = await self.publish_weights(version=step + 1 if samples else self.weights_version,
                                               changed=bool(samples))
        synced = time.perf_counter()
        if self.offloader is not None and self.offloader.params.last_report is not None:
            away = (self.offloader.state.last_report, self.offloader.params.last_report)
            train_metrics["time/offload_s"] = sum(report.seconds for report in away if report is not None)
            train_metrics["engine/offloaded_gib"] = sum(report.total_bytes for report in away if report) / 2**30
        if self.deployment is not None:
            train_metrics["engine/restarted_servers"] = float(len(restarted))
            train_metrics["engine/restarts_total"] = float(sum(self.deployment.restarts.values()))

        if self.is_main:
            metrics = {**out_metrics, **train_metrics}
            metrics["time/rollout_s"] = rolled - started
            metrics["time/train_s"] = trained - rolled
            metrics["time/sync_s"] = synced - trained
            metrics["time/step_s"] = synced - started
            self.writers.write(step, metrics)
            self.progress.end_step(step, metrics)

    async def _run_orchestrator_step(self, step: int):
        """``orchestrator.run_step`` with a ticker that feeds the progress display tokens/s."""
        stats = getattr(self.engine, "stats", None)

        async def ticker() -> None:
            last_tokens = getattr(stats, "generated_tokens", 0)
            last_time = time.perf_counter()
            while True:
                await asyncio.sleep(1.0)
                now, tokens = time.perf_counter(), getattr(stats, "generated_tokens", 0)
                self.progress.update(tokens_per_s=(tokens - last_tokens) / max(now - last_time, 1e-9))
                last_tokens, last_time = tokens, now

        task = asyncio.create_task(ticker()) if self.progress.tty else None
        tokens_before = getattr(stats, "generated_tokens", 0)
        busy_before = getattr(stats, "busy_s", 0.0)
        retries_before = getattr(stats, "retries", 0)
        began = time.perf_counter()
        try:
            out = await self.orchestrator.run_step(step)
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        generated = getattr(stats, "generated_tokens", 0) - tokens_before
        out.metrics.setdefault("time/gen_tokens_per_s", generated / max(time.perf_counter() - began, 1e-9))
        if stats is not None:  # the engine's own clock: generation only, no sandbox or designer waits
            busy = getattr(stats, "busy_s", 0.0) - busy_before
            out.metrics["engine/generated_tokens"] = float(generated)
            out.metrics["time/engine_busy_s"] = busy
            out.metrics["time/engine_tokens_per_s"] = generated / busy if busy > 0 else 0.0
            if hasattr(stats, "retries"):
                out.metrics["engine/retries"] = float(stats.retries - retries_before)
        counters = {"admitted": out.metrics.get("env/admitted"),
                    "episodes": out.metrics.get("agent/episodes", len(out.agent_samples))}
        self.progress.update(**{k: int(v) for k, v in counters.items() if v is not None})
        return out

    def weight_stream(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every HF tensor of the model, on every rank (all ranks must consume it to the end)."""
        from ..models import RankCoords
        from ..models.builder import naming_for
        from ..models.loading import StageBroadcast, all_hf_weights, ep_all_gather, group_gather

        if len(self.model.chunks) > 1:
            raise NotImplementedError("weight sync with virtual pipeline stages (several model chunks per rank)")
        gather = group_gather() if max(self.layout.tp, self.layout.expert_tp) > 1 else None
        return all_hf_weights(self.model.chunks[0], self.spec, self.layout, RankCoords.current(), gather,
                              naming_for(self.options), ep_gather=ep_all_gather() if self.layout.ep > 1 else None,
                              stages=StageBroadcast(self.ctx.device) if self.layout.pp > 1 else None)

    def _weights_on_device(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``weight_stream`` with the parameters brought back from host first if they are there."""
        if self.offloader is not None:
            self.offloader.onload_params()
        return self.weight_stream()

    async def publish_weights(self, version: int, changed: bool = True) -> list[int]:
        """Every rank: bring the engine to the trainer's weights as ``version``. sglang: also restart
        dead servers and resume released memory (see the module docstring). Returns the servers
        that were restarted."""
        restarted: list[int] = []
        if self.deployment is not None:
            if self.offloader is not None:
                self.offloader.offload_state()  # gradients and optimizer state: room for the engine
            restarted = await self.deployment.resume_and_sync(self._weights_on_device, version, changed=changed)
            if self.offloader is not None:
                self.offloader.offload_params()
        elif changed:
            weights = self.weight_stream()
            if self.is_main:
                await self.engine.update_weights(weights, version=version)
            else:
                for _ in weights:  # take part in the gathers
                    pass
        self.weights_version = version
        return restarted

    async def _exchange_samples(self, samples: Optional[list]) -> list:
        """Rank 0 sends the step's samples; the others serve recover commands until they arrive."""
        if self.is_main:
            async with self._collective_lock:
                await in_thread(self.ctx.device, broadcast_object, _Command("samples", samples=samples))
            return samples
        while True:
            command = await in_thread(self.ctx.device, broadcast_object, None)
            if command.kind == "samples":
                return command.samples
            await self._recover_servers(command.servers)

    async def _recover_server(self, index: int) -> None:
        """Rank 0 (the engine's failure hook, during rollouts): restart server ``index`` and re-send
        the current weights to it, with every rank."""
        async with self._collective_lock:
            await in_thread(self.ctx.device, broadcast_object, _Command("recover", servers=(index,)))
            await self._recover_servers((index,))

    async def _recover_servers(self, servers: tuple[int, ...]) -> None:
        await self.deployment.restart(servers)
        await self.deployment.sync_weights(self._weights_on_device, self.weights_version, servers)
        if self.offloader is not None:
            self.offloader.offload_params()

    def checkpoint(self, step: int) -> None:
        from ..training.checkpoint import save_checkpoint

        self.progress.phase("checkpointing", at=step)
        directory = self.run_dir.checkpoint_dir(step)
        if self.is_main:
            directory.parent.mkdir(parents=True, exist_ok=True)
        broadcast_object(None)
        if self.offloader is not None:
            self.offloader.onload()
        save_checkpoint(directory, self.model.chunks, hf_config=self.hf_config, layout=self.layout, step=step,
                        optimizer=self.optimizer, save_rng=True, tokenizer_dir=self.hf_dir)
        if self.is_main:
            state = {
                "step": step,
                "orchestrator": self.orchestrator.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "engine_weight_version": step,
                "metrics_lines": step,
                "saved_at": time.time(),
            }
            self.run_dir.write_trainer_state(step, state)
            self.run_dir.mark_latest(step)  # the checkpoint counts from here on
            self.run_dir.prune_checkpoints(self.config.run.keep_checkpoints)
        if self.offloader is not None:  # back to host: the engine generates next
            self.offloader.offload_state()
            self.offloader.offload_params()
        broadcast_object(None)

    async def close(self) -> None:
        if self.writers is not None:
            self.writers.close()
        if self.progress is not None:
            self.progress.close()
        if self.deployment is not None:
            await self.deployment.close()
        elif self.engine is not None:
            self.engine.close()
        if self.memory is not None:
            self.memory.close()
        if self.sandbox is not None:
            await self.sandbox.close()


def train(config: TrainConfig, run_dir: str | Path, *, resume: bool = False,
          progress: Optional[Progress] = None) -> int:
    """Run the trainer to ``config.run.steps`` in this process (one rank); returns steps run."""
    return asyncio.run(Trainer(config, run_dir, resume=resume, progress=progress).run())
