"""A 2-D map of environments: scikit-learn's t-SNE on the cosine distances of their embeddings.

Perplexity is ``min(30, (n - 1) / 3)`` so small sets work; with fewer than 4 environments there is
nothing to embed and the points are laid on a line. The coordinates are scaled to ``[0, 1]``;
``random_state`` fixes the layout for a given set.

Identical embeddings (a collapsed designer writes the same environment again and again) share one
point: t-SNE runs on the distinct rows only, since scikit-learn's PCA initialisation divides by a
zero variance on identical rows and its Barnes-Hut step then crashes the process. Distinct rows
that span fewer than two dimensions start from a random layout instead of PCA.
"""

from __future__ import annotations

import numpy as np


def tsne_coordinates(embeddings: np.ndarray, seed: int = 0) -> np.ndarray:
    n = len(embeddings)
    if n == 0:
        return np.zeros((0, 2))
    if n < 4:
        coords = np.stack([np.linspace(0.0, 1.0, n) if n > 1 else np.array([0.5]), np.full(n, 0.5)], axis=1)
        return coords
    points = np.asarray(embeddings, dtype=np.float64)
    distinct, where = np.unique(points, axis=0, return_inverse=True)
    if len(distinct) < n:
        return tsne_coordinates(distinct, seed)[where.reshape(-1)]
    from sklearn.manifold import TSNE

    perplexity = float(min(30.0, (n - 1) / 3.0))
    flat = np.linalg.matrix_rank(points - points.mean(axis=0)) < 2
    tsne = TSNE(n_components=2, perplexity=perplexity, metric="cosine", init="random" if flat else "pca",
                random_state=seed, max_iter=500 if n < 200 else 1000)
    coords = tsne.fit_transform(points)
    low, high = coords.min(axis=0), coords.max(axis=0)
    span = np.where(high - low > 0, high - low, 1.0)
    return (coords - low) / span
