"""Wrong input gets one line and exit status 2, before anything is loaded or written; ``--check``
runs the checks of a start. Every case runs the real command as a subprocess with a hard timeout."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import prewarmed
import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "examples" / "smoke_cpu.yaml"
TIMEOUT_S = 120


def spade(*args: str, timeout: float = TIMEOUT_S, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return prewarmed.run(list(args), cwd=cwd, timeout=timeout)


def one_usage_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2 with exactly one line on stderr, ``spade: error: ...``, holding every needle."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("spade: error: "), proc.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def plain_template_model(tmp_path_factory) -> Path:
    """A tiny Qwen3 whose chat template renders no tool calls (ChatML only)."""
    from chat_templates import bpe_tokenizer
    from support.models import save_tiny_qwen3

    directory = tmp_path_factory.mktemp("plain_template")
    return save_tiny_qwen3(directory, bpe_tokenizer(), size="1x32", max_position_embeddings=512)


# ---------------------------------------------------------------------------- missing inputs


@pytest.mark.parametrize("command", [
    ["env", "check", "examples/envs/hidden_sequence.py"],
    ["demo", "examples/envs/hidden_sequence.py"],
    ["analyze", "runs/none"],
    ["eval", "--model", "embedded", "--benchmarks", "aime25", "--limit", "1"],
])
def test_a_missing_config_file_is_one_line(command):
    proc = spade(*command, "--config", "/no/such/config.yaml")
    one_usage_line(proc, "--config /no/such/config.yaml: no such file")


def test_a_run_dir_that_is_a_file_is_one_line(tmp_path):
    file = tmp_path / "taken"
    file.write_text("not a directory\n")
    proc = spade("train", "--config", str(SMOKE), "--run-dir", str(file))
    one_usage_line(proc, f"--run-dir {file}: is a file")
    under = spade("train", "--config", str(SMOKE), "--run-dir", str(file / "run"))
    one_usage_line(under, f"--run-dir {file / 'run'}: lies under the file {file}")
    assert file.read_text() == "not a directory\n"


def test_serve_refuses_a_busy_port_before_it_loads_the_model():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        # a model reference that would fail to load: the port is checked first
        proc = subprocess.run([sys.executable, "-m", "spade", "serve", "--model", "/no/such/model", "--port", str(port)],
                              cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    one_usage_line(proc, f"--port {port}: cannot listen on 127.0.0.1:{port}", "another --port")
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("args, needles", [
    (["--model", "/no/such/model"], ["--model /no/such/model: no such directory"]),
    (["--model", "embedded", "engine.max_batch_size=0"], ["engine.max_batch_size", "must be >= 1"]),
    (["--model", "embedded", "run.steps=3"], ["run.steps=3: only engine.* and model.dtype settings apply here"]),
    (["--model", "embedded", "--config", "/no/such/config.yaml"], ["/no/such/config.yaml"]),
])
def test_serve_refuses_a_model_or_engine_setting_before_loading(args, needles):
    proc = subprocess.run([sys.executable, "-m", "spade", "serve", "--port", "0", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    one_usage_line(proc, *needles)


def test_tool_use_with_a_template_without_tool_calls_fails_before_the_run_directory(tmp_path, plain_template_model):
    run = tmp_path / "run"
    overrides = [f"model.hf_dir={plain_template_model}", "selfplay.domain=tool_use"]
    for args in (["--run-dir", str(run)], ["--check"]):
        proc = spade("train", "--config", str(SMOKE), *args, *overrides)
        one_usage_line(proc, "selfplay.domain: tool_use", "renders no <tool_call> blocks")
        assert not run.exists()  # a rerun with the same --run-dir is not blocked


# ---------------------------------------------------------------------------- --check


def test_check_ends_with_one_ok_line_for_a_config_that_can_start():
    proc = spade("train", "--config", str(SMOKE), "--check", "run.steps=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "steps: 3" in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"spade train: check OK: {SMOKE} can start (model embedded, 3 steps, engine hf)")


@pytest.mark.parametrize("override, key", [
    ("model.hf_dir=/no/such/model", "model.hf_dir"),
    ("selfplay.memory_seed_dir=/no/such/seeds", "selfplay.memory_seed_dir"),
])
def test_check_refuses_what_a_start_refuses(override, key):
    proc = spade("train", "--config", str(SMOKE), "--check", override)
    one_usage_line(proc, key)
    assert proc.stdout == ""  # no resolved config for a run that cannot start


def test_check_refuses_a_missing_corpus_and_pool(tmp_path):
    corpus = tmp_path / "corpus.yaml"
    corpus.write_text(f"include: {SMOKE}\ncorpus: {{paths: [/no/such/corpus.jsonl]}}\nselfplay: {{use_corpus: true}}\n")
    one_usage_line(spade("train", "--config", str(corpus), "--check"), "corpus.paths")
    pool = tmp_path / "pool.yaml"
    pool.write_text(f"include: {SMOKE}\nselfplay: {{designer_enabled: false, fixed_env_dir: /no/such/pool}}\n")
    refused = spade("train", "--config", str(pool), "--check")  # this message goes on with the ways to make a pool
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("spade: error: selfplay.fixed_env_dir: /no/such/pool is not a pool")


def test_launch_script_stops_at_the_check(tmp_path):
    """examples/launch/single_node.sh runs --check before torchrun: a config that cannot start stops
    there, with the check's line, and no torchrun is started."""
    proc = subprocess.run(["bash", str(ROOT / "examples" / "launch" / "single_node.sh"), str(SMOKE),
                           str(tmp_path / "run"), "model.hf_dir=/no/such/model"],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "spade: error: model.hf_dir: /no/such/model" in proc.stderr
    assert "ranks, config" not in proc.stderr  # the line printed just before torchrun starts
    assert not (tmp_path / "run").exists()


def test_launch_scripts_start_the_pythons_own_torchrun():
    for name in ("single_node.sh", "multi_node.sh"):
        text = (ROOT / "examples" / "launch" / name).read_text()
        commands = [line.strip() for line in text.splitlines() if not line.lstrip().startswith("#")]
        assert not any(line.startswith(("torchrun", "exec torchrun")) for line in commands), name
        assert 'exec "$PYTHON" -m torch.distributed.run' in text, name


# ---------------------------------------------------------------------------- score


def test_score_takes_embedded_as_every_command_does(tmp_path):
    """``spade score --model embedded``: the embedded model's log-probs, checked against a
    transformers forward of the same directory."""
    import torch
    from transformers import AutoModelForCausalLM

    from spade.run.engines import resolve_model

    ids = [1, 504, 3456, 28, 1122, 30]
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"token_ids": ids}) + "\n")
    proc = spade("score", "--model", "embedded", "--input", str(source), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scored = json.loads(proc.stdout)["logprobs"]
    model = AutoModelForCausalLM.from_pretrained(resolve_model("embedded").hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
    assert scored[0] is None
    assert scored[1:] == pytest.approx([float(logp[i, ids[i + 1]]) for i in range(len(ids) - 1)], abs=1e-3)


def test_a_run_directory_that_holds_a_run_is_refused_and_kept(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {hf_dir: embedded}\n")
    proc = spade("train", "--config", str(SMOKE), "--run-dir", str(run))
    one_usage_line(proc, f"{run} already holds a run", f"spade train --resume {run}")
    assert (run / "config.yaml").read_text() == "model: {hf_dir: embedded}\n"
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]
