"""The rollout half of a step, measured: ``orchestrator.run_step`` with the engine's own figures.

``engine/generated_tokens``, ``time/engine_busy_s`` and ``time/engine_tokens_per_s`` come from the
engine's generation-only clock (``RolloutEngine.generation_stats``: no sandbox or designer waits,
the figure to set beside a serving benchmark); ``engine/retries`` from an engine that re-sends
failed requests; ``time/gen_tokens_per_s`` is over the whole rollout phase. An engine that keeps no
counters (``generation_stats`` is None) adds none of these but ``time/gen_tokens_per_s`` (0). On a
terminal a ticker feeds the progress line tokens/s while the step runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Optional

from ..rollout.engine import GenerationStats, RolloutEngine
from ..selfplay.step import Step
from .progress import Progress


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
    """``play_engine``: the client rank 0 plays its rollout shard with, when it is not ``engine``
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
