"""The one builder of tiny random Qwen3 models for the tests, and the ``model_dir`` fixture family.

Every variant a test relies on is a parameter, never a copy: the size (``"2x64"``: 2 layers of 64,
or ``"1x32"``: 1 layer of 32), the context length, the seed, ``randomize`` (hf_fixtures' weights,
norms away from 1), ``rope_theta``, the tokenizer's end-of-turn and pad ids written into the config
(``special_ids``), and ``eos_bias`` (an lm_head bias on end-of-turn, so replies end). The weights of
a given set of parameters are exactly those the tests built inline before (same config, same seed,
same order of random draws).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

SIZES: dict[str, dict[str, int]] = {
    "2x64": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16),
    "1x32": dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16),
}


def _vocab_size(vocab: Any) -> int:
    return vocab if isinstance(vocab, int) else len(vocab)


def qwen3_config(vocab: Any, *, size: str = "2x64", max_position_embeddings: int = 2048,
                 special_ids: bool = False, **overrides: Any):
    """A tiny ``Qwen3Config`` (untied embeddings) for ``vocab``: a tokenizer or a vocabulary size.
    ``special_ids`` writes the tokenizer's ``<|im_end|>`` and pad ids into the config; ``overrides``
    (``rope_theta``, ``rms_norm_eps``, ``torch_dtype``, a size field...) go to the config as given."""
    from transformers import Qwen3Config

    fields: dict[str, Any] = dict(vocab_size=_vocab_size(vocab), **SIZES[size],
                                  max_position_embeddings=max_position_embeddings, tie_word_embeddings=False)
    if special_ids:
        fields.update(eos_token_id=vocab.convert_tokens_to_ids("<|im_end|>"), pad_token_id=vocab.pad_token_id)
    fields.update(overrides)
    return Qwen3Config(**fields)


def tiny_qwen3(vocab: Any, *, seed: int = 0, randomize: bool = False, eos_bias: float = 0.0, **config: Any):
    """A random tiny ``Qwen3ForCausalLM`` in eval mode, built after ``torch.manual_seed(seed)``.
    ``randomize`` redraws the weights as hf_fixtures does; ``eos_bias`` adds a bias to the lm_head,
    zero but on ``<|im_end|>`` (``vocab`` must then be the tokenizer). ``config``: see ``qwen3_config``."""
    from transformers import AutoModelForCausalLM

    from support.hf_fixtures import randomize_

    model_config = qwen3_config(vocab, **config)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(model_config).eval()  # in the config's torch_dtype, if given
    if randomize:
        randomize_(model)
    if eos_bias:
        eos = vocab.convert_tokens_to_ids("<|im_end|>")
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(model_config.vocab_size))
        with torch.no_grad():
            model.lm_head.bias[eos] = eos_bias
    return model


def save_tiny_qwen3(directory: Path, tokenizer, *, dtype: torch.dtype | None = None, **model: Any) -> Path:
    """``tiny_qwen3(tokenizer, **model)`` saved with ``tokenizer`` (unless a vocabulary size is
    given) to ``directory``; returns it. ``dtype`` casts the weights before saving."""
    directory = Path(directory)
    built = tiny_qwen3(tokenizer, **model)
    if dtype is not None:
        built = built.to(dtype)
    built.save_pretrained(directory)
    if tokenizer is not None and not isinstance(tokenizer, int):
        tokenizer.save_pretrained(directory)
    return directory


def tiny_hf_dir_fixture(name: str = "qwen3", scope: str = "module"):
    """The ``model_dir`` fixture: hf_fixtures' tiny ``name`` model (and its tokenizer) saved once
    per ``scope``. In a test module: ``model_dir = tiny_hf_dir_fixture("qwen3-moe")``."""
    from support.hf_fixtures import save_tiny_hf

    @pytest.fixture(scope=scope)
    def model_dir(tmp_path_factory) -> Path:
        return save_tiny_hf(name, tmp_path_factory.mktemp(name) / "model")

    return model_dir
