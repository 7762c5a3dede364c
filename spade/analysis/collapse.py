"""Collapse: streaks of near-duplicate environments in generation order (the failure the paper
shows for its no-corpus ablation, one maze emitted 41 times in a row).

The environments of a run are put in generation order (regeneration step, then slot). Two
neighbours are near-duplicates when the cosine similarity of their embeddings is at least
``SIMILARITY_THRESHOLD`` (0.95) or their class names are equal once case, digits, underscores
and a trailing ``Env`` are ignored (``MazeEnv``, ``Maze2Env``, ``maze_env``). A streak is a maximal
chain of environments each a near-duplicate of the one before it; a streak of length 1 is an
environment unlike its predecessor. Reported: the longest streak, how many streaks reach
``MIN_STREAK`` (3), the share of environments inside those, and, per regeneration step, the share
of the set's environments with a near-duplicate elsewhere in the same set.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

SIMILARITY_THRESHOLD = 0.95
MIN_STREAK = 3


def class_key(class_name: str) -> str:
    key = re.sub(r"[\d_\s]+", "", class_name.lower())
    return key[:-3] if key.endswith("env") and len(key) > 3 else key


def near_duplicate(a_vec: np.ndarray, b_vec: np.ndarray, a_class: str, b_class: str,
                   threshold: float = SIMILARITY_THRESHOLD) -> bool:
    if a_class and b_class and class_key(a_class) == class_key(b_class):
        return True
    return float(np.dot(a_vec, b_vec)) >= threshold


def streaks(embeddings: np.ndarray, class_names: Sequence[str], threshold: float = SIMILARITY_THRESHOLD) -> list[tuple[int, int]]:
    """``(start, length)`` of every maximal streak, in order; lengths sum to ``len(class_names)``."""
    n = len(class_names)
    out: list[tuple[int, int]] = []
    start = 0
    for i in range(1, n + 1):
        if i == n or not near_duplicate(embeddings[i - 1], embeddings[i], class_names[i - 1], class_names[i], threshold):
            out.append((start, i - start))
            start = i
    return out


def collapse_summary(embeddings: np.ndarray, class_names: Sequence[str], labels: Sequence[str] | None = None,
                     threshold: float = SIMILARITY_THRESHOLD, min_streak: int = MIN_STREAK) -> dict[str, Any]:
    found = streaks(embeddings, class_names, threshold)
    n = len(class_names)
    long = [(s, length) for s, length in found if length >= min_streak]
    top = sorted(long, key=lambda x: -x[1])[:10]
    return {
        "longest_streak": max((length for _, length in found), default=0),
        "streaks_at_least_min": len(long),
        "min_streak": min_streak,
        "share_in_streaks": (sum(length for _, length in long) / n) if n else None,
        "top_streaks": [{"start": s, "length": length, "class_name": class_names[s],
                         "first": labels[s] if labels else s, "last": labels[s + length - 1] if labels else s + length - 1}
                        for s, length in top],
        "threshold": threshold,
    }


def set_duplicate_share(embeddings: np.ndarray, class_names: Sequence[str],
                        threshold: float = SIMILARITY_THRESHOLD) -> float | None:
    """Share of a set's environments that have a near-duplicate elsewhere in the set."""
    n = len(class_names)
    if n == 0:
        return None
    duplicated = 0
    for i in range(n):
        if any(near_duplicate(embeddings[i], embeddings[j], class_names[i], class_names[j], threshold)
               for j in range(n) if j != i):
            duplicated += 1
    return duplicated / n
