"""The benchmark base class: a held-out benchmark's items, sampling settings and scorer."""

from __future__ import annotations

import abc
from typing import Optional, Sequence

from .chat_interface import ChatModelLike
from .extract import strip_thinking
from .types import BenchmarkScore, EvalItem, ItemRecord, SampleRecord, SamplingSettings


class Benchmark(abc.ABC):
    """One held-out benchmark: its items, its sampling settings and its scorer.

    ``play`` is one sample of one item; the default sends the item's chat once and scores the
    completion's answer (the text after any reasoning; none when the reply never left a ``<think>``
    block) with ``score``. Multi-turn benchmarks (BFCL) override ``play``.
    """

    name: str = ""
    metric: str = "accuracy"
    sampling: SamplingSettings = SamplingSettings()
    needs_sandbox: bool = False

    @abc.abstractmethod
    def load(self, seed: int, limit: Optional[int] = None) -> list[EvalItem]:
        """The items (deterministic in ``seed``); ``limit`` keeps the first N. Raises
        BenchmarkUnavailable when data or package is missing."""

    async def score(self, item: EvalItem, text: str) -> SampleRecord:
        raise NotImplementedError

    async def play(self, item: EvalItem, model: ChatModelLike, seed: int) -> SampleRecord:
        completion = await model.complete(item.messages, self.sampling, seed)
        inside = bool(getattr(completion, "reasoning_open", False))
        record = await self.score(item, strip_thinking(completion.text, inside=inside))
        return SampleRecord(completion.text, record.answer, record.score, record.correct,
                            completion.finish_reason, completion.tokens, record.detail)

    def summarize(self, records: Sequence[ItemRecord]) -> BenchmarkScore:
        """Default: mean over samples of ``correct`` (pooled over items), per group too, in %."""
        samples = [s for r in records for s in r.samples]
        groups: dict[str, list[bool]] = {}
        for record in records:
            groups.setdefault(record.group, []).extend(s.correct for s in record.samples)
        score = 100.0 * sum(s.correct for s in samples) / len(samples) if samples else None
        return BenchmarkScore(self.name, score, len(records), len(samples),
                              {g: 100.0 * sum(v) / len(v) for g, v in sorted(groups.items()) if g and v},
                              metric=self.metric)

    async def close(self) -> None:
        """Release what ``load`` or ``play`` started (a sandbox service)."""
