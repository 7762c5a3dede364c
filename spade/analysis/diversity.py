"""Vendi score of a set of environments (SPEC 6; Friedman and Dieng's definition).

With unit-norm embeddings ``E`` (one row per environment), ``K = E Eᵀ`` is the cosine similarity
matrix; with ``λ`` the eigenvalues of ``K / n`` (they sum to 1), the Vendi score is
``exp(-Σ λ log λ)``, the effective number of distinct environments, between 1 (all the same) and
``n`` (mutually orthogonal). ``Vendi/n`` divides by the set size: 1/n for n identical
environments, 1 for orthogonal ones. The paper reports Vendi/n on samples of 100 environments,
averaged over 20 draws (full SPADE 0.68, no-corpus ablation 0.04); ``sampled_vendi_per_n`` does
that, and takes the whole pool once when it holds no more than the sample size.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

SAMPLE_SIZE = 100
DRAWS = 20


def vendi_score(embeddings: np.ndarray) -> float:
    n = len(embeddings)
    if n == 0:
        return 0.0
    e = np.asarray(embeddings, dtype=np.float64)
    norms = np.linalg.norm(e, axis=1, keepdims=True)
    e = e / np.where(norms > 0, norms, 1.0)
    k = e @ e.T
    eigenvalues = np.linalg.eigvalsh(k / n)
    eigenvalues = eigenvalues[eigenvalues > 1e-12]
    eigenvalues = eigenvalues / eigenvalues.sum()  # they sum to 1 but for rounding (unit diagonal)
    entropy = -float(np.sum(eigenvalues * np.log(eigenvalues)))
    return math.exp(entropy)


def vendi_per_n(embeddings: np.ndarray) -> float:
    n = len(embeddings)
    return vendi_score(embeddings) / n if n else float("nan")


def sampled_vendi_per_n(embeddings: np.ndarray, sample_size: int = SAMPLE_SIZE, draws: int = DRAWS,
                        seed: int = 0) -> dict[str, Any]:
    """Mean (and spread) of Vendi/n over ``draws`` random samples of ``sample_size`` environments."""
    n = len(embeddings)
    if n == 0:
        return {"vendi_per_n": None, "vendi_per_n_std": None, "sample_size": 0, "draws": 0}
    if n <= sample_size:
        return {"vendi_per_n": vendi_per_n(embeddings), "vendi_per_n_std": 0.0, "sample_size": n, "draws": 1}
    rng = random.Random(seed)
    values = [vendi_per_n(embeddings[rng.sample(range(n), sample_size)]) for _ in range(draws)]
    return {"vendi_per_n": float(np.mean(values)), "vendi_per_n_std": float(np.std(values)),
            "sample_size": sample_size, "draws": draws}
