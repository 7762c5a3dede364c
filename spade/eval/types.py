"""The typed records of held-out evaluation: settings, items, samples, item records, scores.

A benchmark turns its data into :class:`EvalItem` s (a chat to send and a reference to check
against), each item is sampled ``SamplingSettings.n`` times, every sample is scored into a
:class:`SampleRecord`, and the samples of one item form one :class:`ItemRecord` (one line of
``DIR/<benchmark>.jsonl``). :class:`BenchmarkScore` is a benchmark's line in ``summary.json``: a
score, or ``skipped`` with the reason (never a zero for missing data). The benchmark base class is
in ``benchmark.py``, the model's interface in ``chat_interface.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional


class BenchmarkUnavailable(RuntimeError):
    """The benchmark's data or package is missing: the benchmark is skipped with this reason."""


@dataclass(frozen=True)
class SamplingSettings:
    """How each item is sampled: ``n`` samples at these settings (``temperature == 0``: greedy)."""

    n: int = 1
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: Optional[int] = None
    max_new_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def replace(self, **changes: Any) -> "SamplingSettings":
        values = asdict(self)
        values.update({k: v for k, v in changes.items() if v is not None})
        return SamplingSettings(**values)


@dataclass(frozen=True)
class EvalItem:
    """One held-out problem. ``group`` pools items for sub-scores (a Reasoning-Gym task, a BFCL
    category); ``reference`` is what the scorer needs (JSON-serialisable where it is recorded)."""

    item_id: str
    messages: tuple[Mapping[str, Any], ...]
    reference: Any = None
    group: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SampleRecord:
    """One scored sample: the completion, the answer extracted from it (None: none found), the
    score in [0, 1], whether it counts as a success, and scorer details (verdicts, errors)."""

    text: str
    answer: Optional[str]
    score: float
    correct: bool
    finish_reason: str = "stop"
    completion_tokens: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "answer": self.answer, "score": self.score, "correct": self.correct,
                "finish_reason": self.finish_reason, "completion_tokens": self.completion_tokens,
                "detail": dict(self.detail)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "SampleRecord":
        return cls(str(data["text"]), data.get("answer"), float(data["score"]), bool(data["correct"]),
                   str(data.get("finish_reason", "stop")), int(data.get("completion_tokens", 0)),
                   dict(data.get("detail") or {}))


@dataclass(frozen=True)
class ItemRecord:
    """Every sample of one item: one line of ``DIR/<benchmark>.jsonl``."""

    item_id: str
    group: str
    samples: tuple[SampleRecord, ...]
    seed: int
    weight_version: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "group": self.group, "seed": self.seed,
                "weight_version": self.weight_version,
                "answers": [s.answer for s in self.samples], "scores": [s.score for s in self.samples],
                "samples": [s.to_json() for s in self.samples]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ItemRecord":
        return cls(str(data["item_id"]), str(data.get("group", "")),
                   tuple(SampleRecord.from_json(s) for s in data["samples"]), int(data["seed"]),
                   int(data.get("weight_version", 0)))


@dataclass(frozen=True)
class BenchmarkScore:
    """A benchmark's result: ``score`` in percent (None when skipped, with ``skipped`` the reason),
    sub-scores per group, and counts. ``off_protocol``: why the run departs from the paper's
    protocol (e.g. a self-simulated user in tau2/ACEBench); such a score is reported but never
    fills a paper column."""

    name: str
    score: Optional[float]
    items: int = 0
    samples: int = 0
    groups: Mapping[str, float] = field(default_factory=dict)
    skipped: Optional[str] = None
    metric: str = "accuracy"
    notes: Mapping[str, str] = field(default_factory=dict)
    off_protocol: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "score": self.score, "metric": self.metric, "items": self.items,
                "samples": self.samples, "groups": dict(self.groups), "skipped": self.skipped,
                "notes": dict(self.notes), "off_protocol": self.off_protocol}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "BenchmarkScore":
        return cls(str(data["name"]), data.get("score"), int(data.get("items", 0)),
                   int(data.get("samples", 0)), dict(data.get("groups") or {}), data.get("skipped"),
                   str(data.get("metric", "accuracy")), dict(data.get("notes") or {}), data.get("off_protocol"))
