"""Evaluation between training steps, on the training engine after weight sync.

The trainer calls ``evaluate_in_loop(engine, tokenizer, settings, step)`` every ``settings.every``
steps; it returns ``{"eval/<benchmark>": score}`` (skipped benchmarks are left out, and named under
``eval/skipped/<benchmark>`` = 1.0 so a missing file shows in the metrics) for metrics.jsonl and
TensorBoard, and writes the item records under ``<out_dir>/step_<N>/`` when ``out_dir`` is given.
The default protocol is spade's own (``protocol: spade``); ``in_loop`` / ``offline`` select the
released evaluation configurations (spade/eval/protocol.py, docs/evaluation.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from ..rollout.engine import RolloutEngine
from .protocol import DEFAULT_PROTOCOL, check_protocol
from .runner import ChatModel, run_suite
from .suites import BenchmarkOptions, benchmark_names, build_benchmarks


@dataclass(frozen=True)
class EvalSettings:
    """The ``eval:`` section: ``every`` 0 = off; ``protocol`` spade (default), in_loop or offline
    (the released evaluation configurations); ``suite`` or an explicit ``benchmarks`` list;
    ``limit`` items per benchmark (Reasoning-Gym: episodes per task); ``data_dir`` the benchmark
    data; ``rg_episodes`` Reasoning-Gym episodes per task (null: the protocol's, 4 or 8); ``concurrency``
    generations in flight; ``max_new_tokens`` / ``samples`` override the paper defaults;
    ``seed`` the evaluation seed (the same items and sample seeds at every step)."""

    every: int = 0
    protocol: str = DEFAULT_PROTOCOL
    suite: str = "games"
    benchmarks: tuple[str, ...] = ()
    limit: Optional[int] = None
    data_dir: Optional[str] = None
    rg_episodes: Optional[int] = None
    concurrency: int = 64
    max_new_tokens: Optional[int] = None
    samples: Optional[int] = None
    seed: int = 0
    # LiveCodeBench: only problems released on or after this date (YYYY-MM-DD); null = the suite's window
    lcb_start_date: Optional[str] = None
    lcb_end_date: Optional[str] = None  # LiveCodeBench: only problems released on or before this date (YYYY-MM-DD)

    def __post_init__(self) -> None:
        check_protocol(self.protocol, "eval.protocol")
        if self.rg_episodes is not None and self.rg_episodes < 1:
            raise ValueError(f"eval.rg_episodes must be >= 1 or null, got {self.rg_episodes}")
        if self.every < 0:
            raise ValueError(f"eval.every must be >= 0, got {self.every}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"eval.limit must be >= 1 or null, got {self.limit}")
        if self.concurrency < 1:
            raise ValueError(f"eval.concurrency must be >= 1, got {self.concurrency}")
        benchmark_names(self.suite, list(self.benchmarks) or None)  # unknown names fail at load time

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0


async def evaluate_in_loop(engine: RolloutEngine, tokenizer: Any, settings: EvalSettings, step: int, *,
                           out_dir: Optional[Path] = None, sandbox: Any = None,
                           max_context_tokens: Optional[int] = None,
                           chat_template_kwargs: Optional[Mapping[str, Any]] = None) -> dict[str, float]:
    names = benchmark_names(settings.suite, list(settings.benchmarks) or None)
    options = BenchmarkOptions(protocol=settings.protocol, data_dir=Path(settings.data_dir) if settings.data_dir else None,
                               n=settings.samples, max_new_tokens=settings.max_new_tokens,
                               rg_episodes=settings.rg_episodes, lcb_start_date=settings.lcb_start_date,
                               lcb_end_date=settings.lcb_end_date, sandbox=sandbox)
    model = ChatModel(engine, tokenizer, concurrency=settings.concurrency, max_context_tokens=max_context_tokens,
                      chat_template_kwargs=chat_template_kwargs)
    directory = Path(out_dir) / f"step_{step}" if out_dir is not None else None
    scores = await run_suite(build_benchmarks(names, options), model, seed=settings.seed, limit=settings.limit,
                             out_dir=directory, info={"step": step, "label": f"in-loop@{step}",
                                                               "protocol": settings.protocol})
    metrics: dict[str, float] = {}
    for name, score in scores.items():
        if score.score is None:
            metrics[f"eval/skipped/{name}"] = 1.0
        else:
            metrics[f"eval/{name}"] = float(score.score)
    metrics["eval/step"] = float(step)
    return metrics
