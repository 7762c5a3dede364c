"""Argument checks shared by the reward layer: finite numbers, a named condition, a finite mean.

Each raises ValueError naming the argument (or config key) it checks."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any


def check(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ValueError(f"{name}: {message}")


def require_finite(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name}: expected finite numbers, got {value!r}")
    return float(value)


def finite_mean(values: Sequence[float], name: str) -> float:
    if len(values) == 0:
        raise ValueError(f"{name}: empty; at least one return is needed")
    return math.fsum(require_finite(v, name) for v in values) / len(values)
