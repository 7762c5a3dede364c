"""Held-out evaluation: benchmarks, scorers, the resumable runner, in-loop evaluation and the report
tables. Above rollout/envs/agent; nothing below imports it. See docs/evaluation.md."""

from .benchmark import Benchmark
from .types import (BenchmarkScore, BenchmarkUnavailable, EvalItem, ItemRecord, SampleRecord,
                    SamplingSettings)

__all__ = ["Benchmark", "BenchmarkScore", "BenchmarkUnavailable", "EvalItem", "ItemRecord", "SampleRecord",
           "SamplingSettings"]
