"""Learnable share and the distributions of win rate and regret over a set (SPEC 6).

An environment is *learnable* when its no-hint win rate (share of no-hint plays at its
regeneration step with return > 0, the memory's definition) lies in ``[0.2, 0.8]``; the paper's
share rises from 0.16 early to 0.31 late. Environments without plays are left out of the share.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

LEARNABLE_BAND = (0.2, 0.8)
HISTOGRAM_BINS = 10


def is_learnable(win_rate: float | None, band: tuple[float, float] = LEARNABLE_BAND) -> bool | None:
    if win_rate is None:
        return None
    return band[0] <= win_rate <= band[1]


def learnable_share(win_rates: Iterable[float | None], band: tuple[float, float] = LEARNABLE_BAND) -> float | None:
    known = [w for w in win_rates if w is not None]
    if not known:
        return None
    return sum(1 for w in known if band[0] <= w <= band[1]) / len(known)


def distribution(values: Sequence[float | None], low: float, high: float, bins: int = HISTOGRAM_BINS) -> dict[str, Any]:
    """Mean, quantiles and a fixed-range histogram (values outside ``[low, high]`` go to the end bins)."""
    known = np.array([v for v in values if v is not None], dtype=np.float64)
    if len(known) == 0:
        return {"n": 0, "mean": None, "p10": None, "median": None, "p90": None,
                "histogram": [0] * bins, "edges": list(np.linspace(low, high, bins + 1))}
    counts, edges = np.histogram(np.clip(known, low, high), bins=bins, range=(low, high))
    return {"n": int(len(known)), "mean": float(known.mean()), "p10": float(np.quantile(known, 0.1)),
            "median": float(np.median(known)), "p90": float(np.quantile(known, 0.9)),
            "histogram": [int(c) for c in counts], "edges": [float(e) for e in edges]}
