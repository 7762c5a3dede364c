"""The rollout half of a step, measured: ``orchestrator.run_step`` with the engine's own figures.

``engine/generated_tokens``, ``time/engine_busy_s`` and ``time/engine_tokens_per_s`` come from the
engine's generation-only clock (no sandbox or designer waits: the figure to set beside a serving
benchmark); ``time/gen_tokens_per_s`` is over the whole rollout phase. On a terminal a ticker feeds
the progress line tokens/s while the step runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from ..selfplay.step import Step
from .progress import Progress


async def measured_step(orchestrator: Any, engine: Any, step: Step, progress: Progress) -> Any:
    stats = getattr(engine, "stats", None)

    async def ticker() -> None:
        last_tokens, last_time = getattr(stats, "generated_tokens", 0), time.perf_counter()
        while True:
            await asyncio.sleep(1.0)
            now, tokens = time.perf_counter(), getattr(stats, "generated_tokens", 0)
            progress.update(tokens_per_s=(tokens - last_tokens) / max(now - last_time, 1e-9))
            last_tokens, last_time = tokens, now

    task = asyncio.create_task(ticker()) if progress.tty else None
    tokens_before = getattr(stats, "generated_tokens", 0)
    busy_before = getattr(stats, "busy_s", 0.0)
    retries_before = getattr(stats, "retries", 0)
    began = time.perf_counter()
    try:
        out = await orchestrator.run_step(step)
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    generated = getattr(stats, "generated_tokens", 0) - tokens_before
    out.metrics.setdefault("time/gen_tokens_per_s", generated / max(time.perf_counter() - began, 1e-9))
    if stats is not None:
        busy = getattr(stats, "busy_s", 0.0) - busy_before
        out.metrics["engine/generated_tokens"] = float(generated)
        out.metrics["time/engine_busy_s"] = busy
        out.metrics["time/engine_tokens_per_s"] = generated / busy if busy > 0 else 0.0
        if hasattr(stats, "retries"):
            out.metrics["engine/retries"] = float(stats.retries - retries_before)
    counters = {"admitted": out.metrics.get("env/admitted"),
                "episodes": out.metrics.get("agent/episodes", len(out.agent_samples))}
    progress.update(**{k: int(v) for k, v in counters.items() if v is not None})
    return out
