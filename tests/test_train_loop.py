"""``spade train`` end to end on CPU: a tiny random Qwen3 model, the real sandbox, the real HF
engine, the real Megatron train step, run as subprocesses with hard timeouts.

* a 2-step run writes metrics.jsonl (2 lines, the required keys), checkpoints, TensorBoard events;
* resume equality: 1 step, stop, ``--resume`` to 2 steps == 2 steps straight (metrics without
  ``time/`` keys, and bit-identical model weights in the final checkpoint);
* a SIGKILL in the middle of step 2 (after step 1's checkpoint), then ``--resume``: same result.

The tiny model plays the fixed-pool baseline (two example environments): a random model cannot
write an admissible environment, and the fixed pool still runs admission, plays, the GRPO update,
weight sync and the orchestrator's state.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
RUN_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    from chat_templates import bpe_tokenizer
    from transformers import AutoModelForCausalLM, Qwen3Config

    directory = tmp_path_factory.mktemp("tiny_qwen3")
    tokenizer = bpe_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                         rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False,
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def train_config(tiny_hf, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("train_cfg")
    envs = work / "envs"
    envs.mkdir()
    for name in ("hidden_sequence.py", "remainder_oracle.py"):
        shutil.copy(ROOT / "examples" / "envs" / name, envs / name)
    path = work / "tiny.yaml"
    path.write_text(f"""
model: {{hf_dir: {tiny_hf}, dtype: float32}}
optimizer: {{lr: 1.0e-3}}
selfplay:
  k: 2
  envs_per_set: 2
  g_nohint: 2
  g_hint: 2
  designer_enabled: false
  fixed_env_dir: {envs}
  use_corpus: false
  agent_max_tokens: 12
  hint_max_tokens: 12
  designer_max_tokens: 16
  max_turns: 2
  max_context_tokens: 1024
sandbox: {{load_timeout_s: 10.0, reset_timeout_s: 5.0, step_timeout_s: 5.0, memory_limit_mb: 256}}
engine: {{max_batch_size: 1}}   # batch-invariant rollout log-probs: exact resume down to the last bit
run: {{steps: 2, checkpoint_every: 1, seed: 7, micro_batch_tokens: 2048}}
""")
    return path


def spade_cmd(*args: str) -> list[str]:
    return [PYTHON, "-m", "spade", "train", *args]


def run_spade(*args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    proc = subprocess.run(spade_cmd(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"spade train {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return proc


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def without_time(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def checkpoint_tensors(directory: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = directory.parent / f"{directory.name}.pt"
    dcp_to_torch_save(str(directory), str(out))
    state = torch.load(out, weights_only=False)
    out.unlink()
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}{key}.", item)
        elif isinstance(value, torch.Tensor):
            flat[prefix.rstrip(".")] = value

    walk("", state)
    return flat


@pytest.fixture(scope="module")
def straight_run(train_config, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("straight") / "run"
    run_spade("--config", str(train_config), "--run-dir", str(run))
    return run


def test_two_steps_write_the_run_directory(straight_run):
    records = metrics(straight_run)
    assert [r["step"] for r in records] == [0, 1]
    for record in records:
        for key in ("env/admitted", "env/rejected", "agent/return_mean", "train/loss", "time/step_s",
                    "time/train_s", "time/sync_s"):
            assert key in record, key
        assert {k.split("/")[0] for k in record if "/" in k} <= {"agent", "designer", "env", "train", "time"}
    assert records[0]["env/admitted"] == 2
    assert records[0]["train/samples"] > 0 and records[0]["train/loss"] is not None
    assert (straight_run / "config.yaml").is_file()
    assert (straight_run / "memory.sqlite").is_file()
    assert (straight_run / "checkpoints" / "latest").read_text().strip() == "step_2"
    for step in (1, 2):
        assert (straight_run / "checkpoints" / f"step_{step}" / "spade_checkpoint.json").is_file()
        state = json.loads((straight_run / "checkpoints" / f"step_{step}" / "trainer_state.json").read_text())
        assert state["step"] == step and state["orchestrator"]["envs"]
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return
    assert list((straight_run / "tensorboard").glob("events.out.tfevents.*"))


def assert_same_run(a: Path, b: Path) -> None:
    assert without_time(metrics(a)) == without_time(metrics(b))
    ta, tb = checkpoint_tensors(a / "checkpoints" / "step_2"), checkpoint_tensors(b / "checkpoints" / "step_2")
    model_keys = [k for k in ta if k.startswith(("embedding.", "decoder.", "output_layer."))]
    assert model_keys and set(ta) == set(tb)
    for key in ta:
        assert torch.equal(ta[key], tb[key]), key
    # the first update changed the weights (the comparison above is not vacuous)
    t0 = checkpoint_tensors(a / "checkpoints" / "step_1")
    assert any(not torch.equal(t0[k], ta[k]) for k in model_keys)


def test_resume_equals_straight_run(straight_run, train_config, tmp_path):
    run = tmp_path / "run"
    run_spade("--config", str(train_config), "--run-dir", str(run), "run.steps=1")
    assert [r["step"] for r in metrics(run)] == [0]
    proc = run_spade("--resume", str(run), "run.steps=2")
    assert "resumed from" in proc.stderr
    assert_same_run(straight_run, run)


def test_kill_mid_step_then_resume(straight_run, train_config, tmp_path):
    run = tmp_path / "run"
    latest = run / "checkpoints" / "latest"
    proc = subprocess.Popen(spade_cmd("--config", str(train_config), "--run-dir", str(run)), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if latest.is_file() and latest.read_text().strip() == "step_1":
                break
            time.sleep(0.01)
        assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stderr.read()[-3000:]}"
        # step 2 (rollouts, update) is underway: kill now
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert latest.read_text().strip() == "step_1"
    run_spade("--resume", str(run))
    assert_same_run(straight_run, run)
