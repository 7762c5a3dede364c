"""tools/convert_hf_to_mcore.py and tools/convert_mcore_to_hf.py: HF -> Megatron -> HF is bit-exact.

Tiny random Llama (tied and untied), Qwen3 (bf16, sharded safetensors in and out) and Qwen3-MoE.
Every tensor of the exported directory must equal the source tensor (``torch.equal``, same dtype),
and transformers must load the export and give identical logits. Most conversions call the tools'
``main`` in this process; the MoE model goes through the command lines, and one conversion runs
under ``torchrun --nproc_per_node 2 ... --tp 2``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import prewarmed
import pytest
import torch

import support.hf_fixtures as hx
from megatron_fixtures import ensure_megatron_world, free_port

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
sys.path.insert(0, str(TOOLS))

import convert_hf_to_mcore  # noqa: E402
import convert_mcore_to_hf  # noqa: E402
from _common import run  # noqa: E402

TIMEOUT = 180


@pytest.fixture(autouse=True)
def restore_megatron_world():
    """The tools tear down Megatron's parallel state; later tests in this process expect one."""
    yield
    ensure_megatron_world()


def safetensors_state(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        state.update(load_file(str(file)))
    return state


def assert_same_model(source: Path, exported: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    expected, got = safetensors_state(source), safetensors_state(exported)
    assert sorted(got) == sorted(expected)
    different = [k for k in expected if got[k].dtype != expected[k].dtype or not torch.equal(got[k], expected[k])]
    assert different == []
    assert json.loads((exported / "config.json").read_text()) == json.loads((source / "config.json").read_text())
    ids = hx.batch(5, rows=2, length=11)
    with torch.no_grad():
        logits = [AutoModelForCausalLM.from_pretrained(d).eval()(ids).logits for d in (source, exported)]
    assert torch.equal(logits[0], logits[1])
    text = "the cat sat on the mat"
    assert AutoTokenizer.from_pretrained(exported)(text)["input_ids"] == \
        AutoTokenizer.from_pretrained(source)(text)["input_ids"]


def convert_in_process(hf_dir: Path, ckpt: Path, out: Path, *export_args: str) -> None:
    assert run(convert_hf_to_mcore.main, ["--hf-dir", str(hf_dir), "--out", str(ckpt)]) == 0
    assert run(convert_mcore_to_hf.main, ["--ckpt", str(ckpt), "--out", str(out), *export_args]) == 0


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize("name", ["llama-tied", "llama-untied"])
def test_llama_round_trip_is_bit_exact(tmp_path, name):
    source = hx.save_tiny_hf(name, tmp_path / "hf")
    convert_in_process(source, tmp_path / "ckpt", tmp_path / "back")
    assert_same_model(source, tmp_path / "back")
    info = json.loads((tmp_path / "ckpt" / "spade_checkpoint.json").read_text())
    assert (info["step"], info["contents"], info["architecture"]) == (0, ["model"], "LlamaForCausalLM")
    assert (tmp_path / "ckpt" / "hf" / "tokenizer.json").is_file()


def test_qwen3_bf16_sharded_round_trip_is_bit_exact(tmp_path):
    from transformers import AutoModelForCausalLM

    source = tmp_path / "hf"
    hx.tiny_model("qwen3").to(torch.bfloat16).save_pretrained(source, max_shard_size="60KB")
    hx.make_tokenizer().save_pretrained(source)
    assert (source / "model.safetensors.index.json").is_file()
    convert_in_process(source, tmp_path / "ckpt", tmp_path / "back", "--max-shard-size", "50KB")
    back = tmp_path / "back"
    assert (back / "model.safetensors.index.json").is_file()
    index = json.loads((back / "model.safetensors.index.json").read_text())
    files = sorted(back.glob("model-*.safetensors"))
    assert len(files) > 2 and sorted(set(index["weight_map"].values())) == [f.name for f in files]
    assert all(f.stat().st_size < 50_000 + 10_000 for f in files)  # bounded (+ header)
    assert {t.dtype for t in safetensors_state(back).values()} == {torch.bfloat16}
    assert_same_model(source, back)
    assert AutoModelForCausalLM.from_pretrained(back).dtype == torch.bfloat16


def test_qwen3_moe_round_trip_through_the_command_lines(tmp_path):
    source = hx.save_tiny_hf("qwen3-moe", tmp_path / "hf")
    for script, args in (("convert_hf_to_mcore.py", ["--hf-dir", source, "--out", tmp_path / "ckpt"]),
                         ("convert_mcore_to_hf.py", ["--ckpt", tmp_path / "ckpt", "--out", tmp_path / "back"])):
        done = subprocess.run([prewarmed.python(), str(TOOLS / script), *map(str, args)], cwd=ROOT,
                              env=subprocess_env(), capture_output=True, text=True, timeout=TIMEOUT)
        assert done.returncode == 0, done.stderr[-4000:]
    assert_same_model(source, tmp_path / "back")


@pytest.mark.slow
def test_conversion_under_torchrun_at_tp2(tmp_path):
    source = hx.save_tiny_hf("qwen3", tmp_path / "hf", seed=3)
    done = subprocess.run(
        [*prewarmed.torchrun(), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
         str(free_port()), str(TOOLS / "convert_hf_to_mcore.py"), "--hf-dir", str(source),
         "--out", str(tmp_path / "ckpt"), "--tp", "2"],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    info = json.loads((tmp_path / "ckpt" / "spade_checkpoint.json").read_text())
    assert info["layout"]["tp"] == 2
    assert run(convert_mcore_to_hf.main, ["--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path / "back")]) == 0
    assert_same_model(source, tmp_path / "back")


def test_help_says_the_checkpoint_is_layout_independent():
    assert "layout-independent" in convert_hf_to_mcore.DESCRIPTION


def test_bad_inputs_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert run(convert_hf_to_mcore.main, ["--hf-dir", str(tmp_path / "empty"), "--out", str(tmp_path / "x")]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert run(convert_mcore_to_hf.main, ["--ckpt", str(tmp_path / "empty"), "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert "not a spade checkpoint" in err and str(tmp_path / "empty") in err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    assert run(convert_mcore_to_hf.main, ["--ckpt", str(tmp_path / "empty"), "--out", str(tmp_path / "full")]) == 2
    assert "not an empty directory" in capsys.readouterr().err
