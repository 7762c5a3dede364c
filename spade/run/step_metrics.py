"""Every figure of a step's ``metrics.jsonl`` line, and its console line, made in one place.

A step's line is, in this order: the orchestrator's own figures (``StepOutput.metrics``: the
plays, the set, the designer's rewards, its stage times ``time/designer_s`` and ``time/play_s``),
the rollout engine's figures measured around ``run_step`` (:func:`measured_step`), the regeneration
counts every line carries, the policy lag of the samples, the update's ``train/*`` figures with the
learning signal (:func:`learning_signal`), the engine manager's ``engine/*`` and ``time/*`` figures
of the switch and the publish, the in-loop evaluation, the step's peak RSS per phase, and the
step's times (:class:`StepMeter`): ``time/rollout_s`` (until every rank has the samples),
``time/train_s`` (the update), ``time/sync_s`` (the publish) and ``time/step_s`` (all three).

The rollout engine's figures: ``engine/generated_tokens``, ``time/engine_busy_s`` and
``time/engine_tokens_per_s`` come from the engine's generation-only clock
(``RolloutEngine.generation_stats``: no sandbox or designer waits, the figure to set beside a
serving benchmark); ``engine/retries`` from an engine that re-sends failed requests;
``time/gen_tokens_per_s`` is over the whole rollout phase. An engine that keeps no counters
(``generation_stats`` is None) adds none of these but ``time/gen_tokens_per_s`` (0). On a terminal
a ticker feeds the progress line tokens/s while the step runs.

*Learning signal* (issue 43). A GRPO update learns from the spread of returns inside each group:
when every trained sample's advantage is 0 (every group's returns were equal) the update has loss 0
and gradient norm 0 and changes nothing but the optimizer's moments. Such a step carries
``train/no_signal`` 1.0 (0.0 otherwise, absent when nothing was trained), the console's step line
says so, and the run summary counts them (:mod:`.console`). The orchestrator's figures log the
spread itself (``spade/selfplay/step_figures.py``): ``agent/group_return_std`` (the mean over the
step's no-hint groups of their returns' std) and ``agent/flat_groups``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from typing import Any, Awaitable, Optional, Sequence

import torch

from ..peak_memory import PhaseMemory
from ..rollout.engine import GenerationStats, RolloutEngine
from ..selfplay.step import Step
from .metrics_writer import MetricsWriter
from .progress import Progress

REGENERATION_COUNTS = ("env/admitted", "env/rejected")  # 0 in the lines between regenerations


# ------------------------------------------------------------------ the rollout engine's figures

def _stats(engine: Optional[RolloutEngine], also: Optional[RolloutEngine] = None) -> Optional[GenerationStats]:
    """``engine``'s totals, plus ``also``'s (rank 0's own rollout-shard client) when given."""
    first = None if engine is None else engine.generation_stats()
    second = None if also is None or also is engine else also.generation_stats()
    if first is None or second is None:
        return first
    retries = None if first.retries is None or second.retries is None else first.retries + second.retries
    return GenerationStats(first.generated_tokens + second.generated_tokens, first.busy_s + second.busy_s, retries)


def _tokens(stats: Optional[GenerationStats]) -> int:
    return 0 if stats is None else stats.generated_tokens


async def measured_step(orchestrator: Any, engine: Optional[RolloutEngine], step: Step, progress: Progress,
                        play_engine: Optional[RolloutEngine] = None) -> Any:
    """``orchestrator.run_step(step)`` with the engine's figures added to its metrics.
    ``play_engine``: the client rank 0 plays its rollout shard with, when it is not ``engine``
    (its figures are added, and the other shards' tokens, which the step reports as
    ``engine/remote_generated_tokens``, join ``engine/generated_tokens``)."""
    async def ticker() -> None:
        last_tokens, last_time = _tokens(_stats(engine, play_engine)), time.perf_counter()
        while True:
            await asyncio.sleep(1.0)
            now, tokens = time.perf_counter(), _tokens(_stats(engine, play_engine))
            progress.update(tokens_per_s=(tokens - last_tokens) / max(now - last_time, 1e-9))
            last_tokens, last_time = tokens, now

    task = asyncio.create_task(ticker()) if progress.tty else None
    before = _stats(engine, play_engine)
    began = time.perf_counter()
    try:
        out = await orchestrator.run_step(step)
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    after = _stats(engine, play_engine)
    generated = _tokens(after) - _tokens(before)
    out.metrics.setdefault("time/gen_tokens_per_s", generated / max(time.perf_counter() - began, 1e-9))
    remote = out.metrics.pop("engine/remote_generated_tokens", 0.0)
    if before is not None and after is not None:
        busy = after.busy_s - before.busy_s
        out.metrics["engine/generated_tokens"] = float(generated) + remote
        out.metrics["time/engine_busy_s"] = busy
        out.metrics["time/engine_tokens_per_s"] = generated / busy if busy > 0 else 0.0
        if after.retries is not None and before.retries is not None:
            out.metrics["engine/retries"] = float(after.retries - before.retries)
    counters = {"admitted": out.metrics.get("env/admitted"),
                "episodes": out.metrics.get("agent/episodes", len(out.agent_samples))}
    progress.update(**{k: int(v) for k, v in counters.items() if v is not None})
    return out


# ------------------------------------------------------------------ the trainer's figures

def policy_lag(samples: list, version: int) -> dict[str, float]:
    """How many weight versions behind the policy being updated the samples were generated."""
    lags = [version - s.weight_version for s in samples if s.weight_version is not None]
    if not lags:
        return {}
    out = {"train/policy_lag_mean": sum(lags) / len(lags), "train/policy_lag_max": float(max(lags))}
    # The histogram: samples per lag (partial rollouts and overlap make lags above 0 common).
    out.update({f"train/policy_lag_count/{lag}": float(n) for lag, n in sorted(Counter(lags).items())})
    return out


def learning_signal(samples: Sequence[Any]) -> dict[str, float]:
    """``train/no_signal``: 1.0 when every sample's advantage is 0 (the update's loss and gradient
    are 0: every group's returns were equal), 0.0 when some sample has one; absent without samples.
    A per-token advantage array counts as a signal when any of its entries is not 0."""
    if not samples:
        return {}
    return {"train/no_signal": 0.0 if any(_has_advantage(s.advantages) for s in samples) else 1.0}


def _has_advantage(advantages: Any) -> bool:
    if isinstance(advantages, (int, float)):
        return advantages != 0
    return bool((torch.as_tensor(advantages) != 0).any())


def step_record(out: Any, *parts: dict[str, Any], times: dict[str, float]) -> dict[str, Any]:
    """The step's ``metrics.jsonl`` line: the orchestrator's figures (``out.metrics``) with the
    regeneration counts every line carries, then the trainer's ``parts`` (policy lag, update,
    engine, evaluation), then the step's times."""
    record: dict[str, Any] = dict(out.metrics)
    for key in REGENERATION_COUNTS:
        record.setdefault(key, 0.0)
    for part in parts:
        record.update(part)
    record.update(times)
    return record


def step_memory(phases: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """The step's peak-RSS metrics: its own phases (``memory/peak_rss_gb`` is their largest) and
    what ran between the line before and this step: the checkpoint written after the step before
    (``memory/peak_rss_gb/checkpoint``) or, on the first line, building the model, engine and
    sandbox (``memory/peak_rss_gb/build``). The run's peak is the largest ``memory/peak_rss_gb/*``."""
    out = dict(phases)
    prefix = "memory/peak_rss_gb/"
    out.update({key: value for key, value in before.items() if key.startswith(prefix)})
    return out


class StepMetrics:
    """The trainer's figures, step after step. ``writers`` is set on the rank that writes the
    lines (rank 0, once the run's ``metrics.jsonl`` is truncated for a resume); the other ranks
    measure and write nothing."""

    def __init__(self, progress: Progress, phase_memory: PhaseMemory):
        self.progress = progress
        self.phase_memory = phase_memory
        self.writers: Optional[MetricsWriter] = None

    def begin(self, step: Step) -> "StepMeter":
        return StepMeter(self, step)

    def close(self) -> None:
        if self.writers is not None:
            self.writers.close()


class StepMeter:
    """One step's figures as they come in, in the order of ``Trainer.one_step``."""

    def __init__(self, owner: StepMetrics, step: Step):
        self.owner = owner
        self.step = step
        owner.progress.start_step(step.updates_done)
        # peak RSS of what ran before the step: the checkpoint after the step before, or the build
        self.before = owner.phase_memory.metrics()
        owner.phase_memory.start()
        self.clock = {"started": time.perf_counter()}
        self.parts: list[dict[str, Any]] = []

    def mark(self, phase: str) -> None:
        """A phase of the step ended (its peak RSS): ``plays`` (every rank has the samples)."""
        self.owner.phase_memory.mark(phase)
        self.clock[phase] = time.perf_counter()

    def training(self, samples: list, version: int) -> None:
        """The update begins on ``samples``; ``version``: the weights the engine serves."""
        self.owner.progress.phase("training", samples=len(samples))
        self.parts.append(policy_lag(samples, version))

    def trained(self, samples: list, metrics: dict[str, Any]) -> None:
        self.clock["trained"] = time.perf_counter()
        self.parts.append({**metrics, **learning_signal(samples)})
        if not samples:
            self.owner.progress.message(f"step {self.step.updates_done}: no samples, the update is skipped")

    def synced(self, engine_metrics: dict[str, float]) -> None:
        """The new weights are published; ``engine_metrics``: the manager's figures of the step."""
        self.mark("sync")
        self.parts.append(engine_metrics)

    async def evaluated(self, evaluation: Awaitable[Optional[dict[str, Any]]]) -> None:
        """The in-loop evaluation (None: not due, or not this rank's), with its time."""
        began = time.perf_counter()
        out = await evaluation
        if out is not None:
            self.parts.append({**out, "time/eval_s": time.perf_counter() - began})

    def times(self) -> dict[str, float]:
        c = self.clock
        return {"time/rollout_s": c["plays"] - c["started"], "time/train_s": c["trained"] - c["plays"],
                "time/sync_s": c["sync"] - c["trained"], "time/step_s": c["sync"] - c["started"]}

    def record(self, out: Any) -> None:
        """Write the step's line (rank 0) and start the next phase's figure (every rank)."""
        owner = self.owner
        if owner.writers is not None:
            n = self.step.updates_done
            memory = step_memory(owner.phase_memory.metrics(), self.before)
            metrics = step_record(out, *self.parts, memory, times=self.times())
            owner.writers.write(n, metrics)
            owner.progress.end_step(n, metrics)
        owner.phase_memory.start()  # a checkpoint, if one follows, starts its own figure
