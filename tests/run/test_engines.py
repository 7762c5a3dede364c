"""spade.run.engines: model references resolved without loading, the one device/dtype resolver, the
commands' flags as shorthands for the ``engine:`` keys, and an opened checkpoint engine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from spade.config import ConfigError
from spade.run import engines
from spade.run.engines import EMBEDDED, ModelRefError, engine_settings, resolve_dtype, resolve_model

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu vme de pse tsc msr pae {extra} avx2 avx512f
bogomips\t: 4000.00
"""


def cpuinfo(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / f"cpuinfo-{extra or 'plain'}"
    path.write_text(CPUINFO.format(extra=extra))
    return path


@pytest.mark.parametrize("extra, native", [("", False), ("amx_bf16 amx_tile", True), ("avx512_bf16", True),
                                           ("avx512_bf16x", False)])
def test_native_bf16_is_read_from_the_cpu_flags(tmp_path, extra, native):
    assert engines.cpu_has_native_bf16(cpuinfo(tmp_path, extra)) is native


def test_native_bf16_is_false_without_a_cpuinfo(tmp_path):
    assert engines.cpu_has_native_bf16(tmp_path / "absent") is False


def test_auto_dtype_is_bf16_only_on_cuda_or_a_cpu_with_native_bf16():
    assert resolve_dtype("auto", "cpu", native_bf16=False).name == "float32"
    assert resolve_dtype("auto", "cpu", native_bf16=True).name == "bfloat16"
    assert resolve_dtype("auto", "cuda:1", native_bf16=False).name == "bfloat16"
    chosen = resolve_dtype("auto", "cpu", native_bf16=False)
    assert chosen.line().startswith("model.dtype auto: float32 (") and "AMX" in chosen.line()
    given = resolve_dtype("bfloat16", "cpu", native_bf16=False)
    assert given.name == "bfloat16" and given.line() == ""  # an explicit dtype is taken as it is, silently
    with pytest.raises(ModelRefError, match="allowed are auto, float32, bfloat16, float16"):
        resolve_dtype("fp8", "cpu")


def test_devices(monkeypatch):
    assert engines.resolve_device("cpu") == "cpu"
    assert engines.resolve_device("cuda:3") == "cuda:3"
    with pytest.raises(ModelRefError, match="auto, cpu, cuda, cuda:N"):
        engines.resolve_device("gpu0")


def test_flags_are_shorthands_for_the_engine_keys(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: {dtype: bfloat16}\nengine: {max_batch_size: 3, batch_wait_ms: 7.0}\n"
                      "selfplay: {k: 2}\n")  # other sections are not this command's business
    settings = engine_settings(str(config))
    assert (settings.kind, settings.dtype, settings.section.max_batch_size, settings.section.batch_wait_ms) == \
        ("hf", "bfloat16", 3, 7.0)
    overridden = engine_settings(str(config), ["engine.batch_wait_ms=1"], dtype="float32", max_batch_size=5,
                                 device="cuda:2")
    assert (overridden.dtype, overridden.section.max_batch_size, overridden.section.batch_wait_ms) == ("float32", 5, 1.0)
    assert overridden.device == "cuda:2" and overridden.section.device == "auto"
    sglang = engine_settings(engine="sglang", sglang_urls=["http://127.0.0.1:30000"], device="cpu")
    assert sglang.section.sglang.urls == ("http://127.0.0.1:30000",) and sglang.section.device == "cpu"
    with pytest.raises(ConfigError, match="engine.max_batch_size"):
        engine_settings(overrides=["engine.max_batch_size=0"])
    with pytest.raises(ConfigError, match="only engine"):
        engine_settings(overrides=["run.steps=3"])
    with pytest.raises(ModelRefError, match="--device"):
        engine_settings(device="tpu")


def hf_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": 64}))
    return path


def test_references(tmp_path):
    plain = resolve_model(str(hf_dir(tmp_path / "my-model")))
    assert (plain.kind, plain.label, plain.checkpoint) == ("hf", "my-model", None)
    with pytest.raises(ModelRefError, match="--model /no/such: no such directory"):
        resolve_model("/no/such")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelRefError, match="not an HF model directory"):
        resolve_model(str(tmp_path / "empty"))
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("run: {steps: 1}\n")
    with pytest.raises(ModelRefError, match="--designer .*no usable checkpoint"):
        resolve_model(str(run), key="--designer")


def test_embedded_is_one_constant():
    from spade.models.embedded import MODEL_NAME

    assert EMBEDDED == "embedded"
    ref = resolve_model(EMBEDDED)
    assert ref.kind == "embedded" and ref.label == MODEL_NAME and (ref.hf_dir / "config.json").is_file()


def test_a_checkpoint_opens_as_the_engine_of_its_weights(tmp_path):
    """A spade checkpoint written by the converter from a tiny HF model; its engine gives the HF
    model's own greedy token and log-prob (an independent forward through transformers)."""
    import sys

    import support.hf_fixtures as hx
    import torch
    from megatron_fixtures import ensure_megatron_world

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import convert_hf_to_mcore
    from _common import run as run_tool

    source = hx.save_tiny_hf("qwen3", tmp_path / "hf")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("run: {steps: 1}\n")
    checkpoint = run / "checkpoints" / "step_0"
    try:
        assert run_tool(convert_hf_to_mcore.main, ["--hf-dir", str(source), "--out", str(checkpoint)]) == 0
    finally:
        ensure_megatron_world()
    (run / "checkpoints" / "latest").write_text("step_0\n")
    # a run directory takes only checkpoints a resume would take: the converter writes no trainer state
    with pytest.raises(ModelRefError, match="no usable checkpoint.*trainer_state.json"):
        resolve_model(str(run))
    by_checkpoint = resolve_model(str(checkpoint))
    assert by_checkpoint.kind == "checkpoint" and by_checkpoint.checkpoint == checkpoint
    assert (by_checkpoint.step, by_checkpoint.label) == (0, "run@0")

    ids = [5, 17, 42, 9, 101]
    model = hx.load_hf(source)
    settings = engine_settings(dtype="float32", device="cpu", max_batch_size=1)

    async def score():
        opened = await engines.open_engine(by_checkpoint, settings, tokenizer=hx.make_tokenizer())
        try:
            from spade.rollout.engine import GenerationRequest, SamplingParams

            result = await opened.engine.generate(GenerationRequest(
                tuple(ids[:-1]), SamplingParams(temperature=0.0, max_new_tokens=1)))
            return opened, result
        finally:
            opened.close()

    opened, result = asyncio.run(score())
    assert opened.device == "cpu" and opened.dtype == "float32" and opened.max_context_tokens == \
        json.loads((source / "config.json").read_text())["max_position_embeddings"]
    logits = model(torch.tensor([ids[:-1]])).logits[0, -1]
    greedy = int(torch.argmax(logits))
    assert list(result.token_ids) == [greedy]
    assert result.logprobs[0] == pytest.approx(float(torch.log_softmax(logits.double(), -1)[greedy]), abs=1e-4)
