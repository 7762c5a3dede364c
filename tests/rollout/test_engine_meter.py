"""Engine statistics are part of the engine interface: ``RolloutEngine.generation_stats`` (a typed
``GenerationStats``), implemented by both engines and read by the step meter
(``spade.run.step_metrics.measured_step``) without probing attributes."""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass, field
from typing import Optional

import pytest

from spade.rollout.engine import GenerationStats, RolloutEngine
from spade.rollout.sglang.engine import SGLangEngine
from spade.run.step_metrics import measured_step
from spade.run.progress import Progress
from spade.selfplay.step import Step
from test_rollout_engine import PROMPTS, make_engine, request
from test_sglang_engine import dead_url, req, servers  # noqa: F401  (servers: the fixture)

pytestmark = pytest.mark.timeout(120)


class CountingEngine(RolloutEngine):
    """Reports ``totals``; the step below moves them on as a real engine's generation would."""

    def __init__(self, totals: Optional[GenerationStats]) -> None:
        self.totals = totals

    @property
    def weight_version(self) -> int:
        return 0

    async def generate(self, request):
        raise AssertionError("the meter does not generate")

    async def update_weights(self, named_tensors, version: int) -> None:
        pass

    def close(self) -> None:
        pass

    def generation_stats(self) -> Optional[GenerationStats]:
        return self.totals


class SilentEngine(CountingEngine):
    """An engine that keeps no counters: the interface's default."""

    generation_stats = RolloutEngine.generation_stats


@dataclass
class Out:
    metrics: dict = field(default_factory=dict)
    agent_samples: list = field(default_factory=list)


class OneStep:
    def __init__(self, engine: CountingEngine, after: Optional[GenerationStats]) -> None:
        self.engine, self.after = engine, after

    async def run_step(self, step: Step) -> Out:
        self.engine.totals = self.after
        return Out()


def measure(engine: CountingEngine, after: Optional[GenerationStats]) -> dict:
    progress = Progress(1, stream=io.StringIO(), tty=False)
    return asyncio.run(measured_step(OneStep(engine, after), engine, Step(0), progress)).metrics


def test_the_step_figures_are_differences_of_the_engines_totals():
    metrics = measure(CountingEngine(GenerationStats(100, 2.0, retries=3)), GenerationStats(160, 3.5, retries=5))
    assert metrics["engine/generated_tokens"] == 60.0
    assert metrics["time/engine_busy_s"] == pytest.approx(1.5)
    assert metrics["time/engine_tokens_per_s"] == pytest.approx(60 / 1.5)
    assert metrics["engine/retries"] == 2.0
    assert metrics["time/gen_tokens_per_s"] > 0


def test_an_engine_without_retries_reports_none():
    metrics = measure(CountingEngine(GenerationStats(0, 0.0)), GenerationStats(8, 0.5))
    assert metrics["engine/generated_tokens"] == 8.0 and "engine/retries" not in metrics


def test_an_engine_that_keeps_no_counters_adds_no_engine_figures():
    engine = SilentEngine(None)
    assert engine.generation_stats() is None
    metrics = measure(engine, None)
    assert metrics == {"time/gen_tokens_per_s": 0.0}


def test_hf_engine_reports_its_generated_tokens_and_busy_time():
    engine = make_engine()
    assert engine.generation_stats() == GenerationStats(0, 0.0, None)
    requests = [request(PROMPTS[0], temperature=1.0, max_new_tokens=6, seed=1),
                request(PROMPTS[1], temperature=0.0, max_new_tokens=4)]

    async def main():
        return await asyncio.gather(*(engine.generate(r) for r in requests))

    results = asyncio.run(main())
    stats = engine.generation_stats()
    engine.close()
    assert stats.generated_tokens == sum(len(r.token_ids) for r in results) == 10
    assert stats.busy_s > 0 and stats.retries is None


def test_sglang_engine_reports_tokens_and_retries(servers):  # noqa: F811
    (a, b), _ = servers
    engine = SGLangEngine([dead_url(), b.url], max_retries=1)
    assert engine.generation_stats() == GenerationStats(0, 0.0, 0)

    async def main():
        first = await engine.generate_with_affinity(req(), "ep")  # the dead server first (fewest in flight)
        stats = engine.generation_stats()
        await engine.aclose()
        return first, stats

    result, stats = asyncio.run(main())
    assert len(result.token_ids) == 3 == stats.generated_tokens  # the test server answers three tokens
    assert stats.retries == engine.servers[0].failures == 1
    assert stats.busy_s > 0
