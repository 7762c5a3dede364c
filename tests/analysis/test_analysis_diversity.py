"""Vendi/n on real all-MiniLM-L6-v2 embeddings (the packaged model, offline)."""

from __future__ import annotations

import numpy as np
import pytest

from spade.analysis.diversity import vendi_per_n
from spade.analysis.embeddings import MiniLMEmbedder, model_dir
from test_analysis_fixture import EXAMPLES


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    return MiniLMEmbedder()


def test_identical_environments_have_vendi_per_n_one_over_n(embedder: MiniLMEmbedder) -> None:
    source = (EXAMPLES / "switchboard.py").read_text()
    vectors = embedder.embed([source] * 6)
    assert vectors.shape == (6, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vendi_per_n(vectors) == pytest.approx(1 / 6, abs=1e-4)


def test_different_games_are_more_diverse_than_copies(embedder: MiniLMEmbedder) -> None:
    sources = [p.read_text() for p in sorted(EXAMPLES.glob("*.py"))]
    different = vendi_per_n(embedder.embed(sources))
    assert 1 / len(sources) + 0.1 < different <= 1.0
    # a comment's worth of change is still nearly the same environment
    similar = embedder.embed([sources[0], "# tweaked\n" + sources[0]])
    assert float(similar[0] @ similar[1]) > 0.95


def test_plain_transformers_pooling_matches_sentence_transformers(embedder: MiniLMEmbedder) -> None:
    import sentence_transformers
    texts = ["class MazeEnv:\n    pass", "A knapsack whose weights are hidden.", (EXAMPLES / "foggy_grid.py").read_text()]
    reference = sentence_transformers.SentenceTransformer(str(model_dir()), device="cpu").encode(
        texts, normalize_embeddings=True)
    assert np.allclose(embedder.embed(texts), reference, atol=1e-5)
