"""Which checkpoint is best: the in-loop held-out evaluation's score of each checkpointed step.

The paper selects, for each run, the checkpoint with the best suite average of its held-out
evaluation (the ablation tables; shared notes/eval_protocol.md). The trainer evaluates the weights
after ``N`` updates (``eval/step`` = N) just before it may save them as ``checkpoints/step_N``; when
both happen at one step, the checkpoint's score on ``run.best_metric`` is recorded in
``checkpoints/best`` (``RunDir.record_score``) and the best-scoring checkpoint is kept by pruning.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

MEAN_KEY = "eval/mean"
_NOT_SCORES = ("eval/step", MEAN_KEY)


def benchmark_scores(evaluated: Mapping[str, Any]) -> dict[str, float]:
    """The per-benchmark scores of one in-loop evaluation (``eval/<benchmark>``; skipped ones and
    ``eval/step`` left out)."""
    return {key: float(value) for key, value in evaluated.items()
            if key.startswith("eval/") and key.count("/") == 1 and key not in _NOT_SCORES}


def suite_mean(evaluated: Mapping[str, Any]) -> dict[str, float]:
    """``{"eval/mean": ...}``: the unweighted mean of the benchmarks scored (the paper's Avg over
    the suite's columns); empty when none was scored (all skipped)."""
    scores = benchmark_scores(evaluated)
    return {MEAN_KEY: sum(scores.values()) / len(scores)} if scores else {}


def checkpoint_score(evaluated: Mapping[str, Any], metric: str) -> Optional[float]:
    """The score to compare checkpoints on (None: ``metric`` is ``none``, or the evaluation has no
    finite value for it, e.g. its benchmark was skipped)."""
    if metric == "none":
        return None
    value = evaluated.get(metric)
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None
