"""The learning check's control (``loss.control_shuffle_advantages``, docs/learning.md): each
step's advantages permuted among the step's samples before the loss, so the update has the size and
the token counts of a real one but a direction unrelated to which plays did well. Only the control
arm of benchmarks/learning.py turns it on.
"""

from __future__ import annotations

import dataclasses
import numbers
import random
from typing import Sequence

from ..rl.samples import TrainSample

CONTROL_SEED = 41  # with the step's newest weight version: a different permutation every step


def shuffle_seed(samples: Sequence[TrainSample]) -> int:
    """A seed that changes from step to step and is the same on every rank and on resume."""
    versions = [s.weight_version for s in samples if s.weight_version is not None]
    return CONTROL_SEED * 1_000_003 + (max(versions) if versions else 0)


def shuffle_advantages(samples: Sequence[TrainSample], seed: int) -> list[TrainSample]:
    """``samples`` with their (scalar) advantages permuted among them by ``random.Random(seed)``."""
    values = [s.advantages for s in samples]
    if not all(isinstance(v, numbers.Real) for v in values):
        raise ValueError("loss.control_shuffle_advantages permutes one advantage per sample; "
                         "these samples carry per-token advantages")
    order = list(range(len(values)))
    random.Random(seed).shuffle(order)
    return [dataclasses.replace(s, advantages=values[j]) for s, j in zip(samples, order)]
