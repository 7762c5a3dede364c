"""A trained model goes to the next tool: the run directory of a one-step ``spade train`` (tiny random
Qwen3, bf16 training, the real sandbox and Megatron step) is served by ``spade serve --model RUN`` over
real HTTP to the openai client, scored by ``spade score --model RUN``, and exported by
tools/convert_mcore_to_hf.py to a Hugging Face directory that transformers loads.

References are independent of the path under test: the served greedy tokens and their log-probs are
checked against transformers' forward over the export, and the export's log-probs against the
Megatron forward of ``spade score`` on the checkpoint itself.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import prewarmed
import pytest
import torch
from support.configs import SANDBOX_LIMITS, example_envs, write_config
from test_train_loop import tiny_hf  # noqa: F401  (the tiny Qwen3 of the train-loop tests)

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def trained_run(tiny_hf, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("handoff")
    envs = example_envs(work / "envs")
    config = work / "tiny.yaml"
    write_config(config, {
        "model": {"hf_dir": tiny_hf, "dtype": "bfloat16"},
        "optimizer": {"lr": 0.01},
        "selfplay": {
            "k": 2,
            "envs_per_set": 2,
            "g_nohint": 2,
            "g_hint": 2,
            "designer_enabled": False,
            "fixed_env_dir": envs,
            "use_corpus": False,
            "sampling": {"agent": {"max_tokens": 8}, "hint": {"max_tokens": 8}},
            "max_turns": 2,
            "max_context_tokens": 1024,
        },
        "sandbox": SANDBOX_LIMITS,
        "engine": {"max_batch_size": 4},
        "run": {"steps": 1, "checkpoint_every": 1, "seed": 3, "micro_batch_tokens": 2048},
    })
    run = work / "run"
    done = prewarmed.run(["train", "--config", str(config), "--run-dir", str(run)], timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (run / "checkpoints" / "step_1" / "spade_checkpoint.json").is_file()
    return run


PROMPT_IDS = [11, 40, 7, 93, 150, 21, 64, 5]


def serve(model: str, *extra: str) -> tuple[subprocess.Popen, str]:
    """``spade serve --model MODEL --port 0`` until it prints its URL."""
    proc = subprocess.Popen([prewarmed.python(), "-m", "spade", "serve", "--model", model, "--port", "0",
                             "--served-model-name", "tiny", "--dtype", "float32", *extra],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + TIMEOUT_S
    lines = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"on (http://\S+/v1)", line)
        if found:
            return proc, found.group(1)
    proc.kill()
    raise AssertionError("spade serve did not start:\n" + "".join(lines)[-4000:])


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def served(trained_run):
    """Greedy tokens and their log-probs from ``spade serve --model RUN`` over HTTP."""
    import openai

    proc, url = serve(str(trained_run))
    try:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        completion = client.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=4, temperature=0,
                                               logprobs=0, extra_body={"ignore_eos": True})
        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                              max_tokens=3, temperature=0)
    finally:
        stop(proc)
    assert chat.choices[0].finish_reason in ("stop", "length")
    return completion.choices[0]


@pytest.fixture(scope="module")
def exported(trained_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "hf"
    done = subprocess.run([prewarmed.python(), str(ROOT / "tools" / "convert_mcore_to_hf.py"), "--ckpt",
                           str(trained_run), "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_export_is_a_directory_other_users_and_tools_read(exported):
    from safetensors import safe_open

    umask = os.umask(0)
    os.umask(umask)
    for file in exported.iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o666 & ~umask, file.name
    with safe_open(str(exported / "model.safetensors"), framework="pt") as handle:
        stored = {handle.get_slice(name).get_dtype() for name in handle.keys()}
    assert stored == {"BF16"}  # trained in bf16: the checkpoint's dtype, kept
    assert json.loads((exported / "config.json").read_text())["dtype"] == "bfloat16"  # the source said float32


def export_logprobs(exported: Path, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)


def test_served_run_matches_transformers_on_the_export(served, exported):
    """The served completion is the export's greedy path: the same text, the same log-probs."""
    from transformers import AutoTokenizer

    ids = list(PROMPT_IDS)
    expected = []
    for _ in range(4):
        row = export_logprobs(exported, ids)[-1]
        token = int(torch.argmax(row))
        expected.append(float(row[token]))
        ids.append(token)
    assert served.text == AutoTokenizer.from_pretrained(exported).decode(ids[len(PROMPT_IDS):])
    assert served.logprobs.token_logprobs == pytest.approx(expected, abs=2e-4)


def test_score_on_the_run_matches_the_export(trained_run, exported, tmp_path):
    ids = [3, 17, 42, 9, 101, 7, 250]
    line = tmp_path / "in.jsonl"
    line.write_text(json.dumps({"token_ids": ids}) + "\n")
    done = prewarmed.run(["score", "--model", str(trained_run), "--input", str(line)], timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    scored = json.loads(done.stdout)["logprobs"]
    logp = export_logprobs(exported, ids)
    expected = [None] + [float(logp[i, ids[i + 1]]) for i in range(len(ids) - 1)]
    assert scored[0] is None
    assert scored[1:] == pytest.approx(expected[1:], abs=2e-4)


def test_eval_takes_the_run(trained_run, tmp_path):
    """``spade eval --model RUN`` evaluates the run's newest checkpoint, and says which."""
    out = tmp_path / "results"
    done = prewarmed.run(["eval", "--model", str(trained_run), "--benchmarks", "aime25", "--data",
                          str(ROOT / "tests" / "fixtures" / "eval"), "--limit", "1", "--samples", "1",
                          "--max-new-tokens", "4", "--dtype", "float32", "--out", str(out)], timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    checkpoint = trained_run / "checkpoints" / "step_1"
    assert (summary["resolved_model"], summary["step"], summary["label"]) == (str(checkpoint), 1, "run@1")
    assert summary["benchmarks"]["aime25"]["items"] == 1
