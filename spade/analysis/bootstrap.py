"""A seeded percentile bootstrap interval of the difference of two means (numpy).

``paired=True``: ``before[i]`` and ``after[i]`` are the same episode (problem and sampling seed)
before and after training; each resample draws episode indices with replacement and takes the mean
of their differences. ``paired=False``: the two samples are resampled independently and the
difference of their means is taken. The interval is the ``(1 - level) / 2`` and ``(1 + level) / 2``
quantiles of the resampled differences (numpy's default linear interpolation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class DifferenceInterval:
    """``after - before`` of the means, with its bootstrap interval."""

    mean_before: float
    mean_after: float
    low: float
    high: float
    n_before: int
    n_after: int
    paired: bool
    level: float
    resamples: int
    seed: int

    @property
    def difference(self) -> float:
        return self.mean_after - self.mean_before

    def contains_zero(self) -> bool:
        return self.low <= 0.0 <= self.high

    def above_zero(self) -> bool:
        return self.low > 0.0


def bootstrap_difference(before: Sequence[float], after: Sequence[float], *, paired: bool, resamples: int = 10000,
                         seed: int = 0, level: float = 0.95) -> DifferenceInterval:
    b = np.asarray(before, dtype=np.float64)
    a = np.asarray(after, dtype=np.float64)
    if b.size == 0 or a.size == 0:
        raise ValueError("bootstrap_difference needs at least one value on each side")
    if paired and b.size != a.size:
        raise ValueError(f"a paired bootstrap needs as many values after as before ({a.size} vs {b.size})")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    if paired:
        differences = a - b
        draws = differences[rng.integers(0, differences.size, size=(resamples, differences.size))].mean(axis=1)
    else:
        draws = (a[rng.integers(0, a.size, size=(resamples, a.size))].mean(axis=1)
                 - b[rng.integers(0, b.size, size=(resamples, b.size))].mean(axis=1))
    low, high = np.quantile(draws, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return DifferenceInterval(float(b.mean()), float(a.mean()), float(low), float(high), int(b.size), int(a.size),
                              paired, level, resamples, seed)
