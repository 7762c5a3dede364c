"""What ``spade train`` checks before it writes anything: a bad model directory, corpus or fixed
pool fails here, in seconds, leaving no run directory behind (and before the sandbox and the model
load). Each problem names the config key."""

from __future__ import annotations

from pathlib import Path

from ..train_config import EMBEDDED, TrainConfig
from .run_dir import RunDirError


def preflight(config: TrainConfig) -> None:
    """Raise ``RunDirError`` for the first input of ``config`` that cannot be used."""
    if config.model.hf_dir != EMBEDDED:
        path = Path(config.model.hf_dir)
        if not (path / "config.json").is_file():
            raise RunDirError(f"model.hf_dir: {path} is not a Hugging Face model directory (no config.json)")
    sp = config.selfplay
    if sp.designer_enabled and sp.use_corpus:
        if not config.corpus.paths:
            raise RunDirError("corpus.paths is empty but selfplay.use_corpus is true: give a corpus "
                              "(e.g. examples/corpus/demo.jsonl.gz) or set selfplay.use_corpus: false")
        from ..designer.corpus import Corpus

        try:
            corpus = Corpus(config.corpus)  # opens every file and reads its records
        except (OSError, ValueError) as exc:
            raise RunDirError(f"corpus.paths: {exc}") from None
        if len(corpus) == 0:
            raise RunDirError(f"corpus.paths: no usable document in {', '.join(map(str, corpus.files))}")
    if sp.env_source == "fixed_pool":
        pool = Path(sp.fixed_env_dir or "")
        if not pool.is_dir() or not any(pool.glob("*.py")):
            raise RunDirError(f"selfplay.fixed_env_dir: {pool} is not a directory of environment .py files")
    if sp.memory_seed_dir is not None and not Path(sp.memory_seed_dir).is_dir():
        raise RunDirError(f"selfplay.memory_seed_dir: {sp.memory_seed_dir} is not a directory")
