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
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import prewarmed
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
RUN_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    from chat_templates import bpe_tokenizer
    from support.models import save_tiny_qwen3

    directory = tmp_path_factory.mktemp("tiny_qwen3")
    return save_tiny_qwen3(directory, bpe_tokenizer(), special_ids=True, rope_theta=1e6)


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
  sampling:
    designer: {{max_tokens: 16}}
    agent: {{max_tokens: 12}}
    hint: {{max_tokens: 12}}
  max_turns: 2
  max_context_tokens: 1024
sandbox: {{load_timeout_s: 10.0, reset_timeout_s: 5.0, step_timeout_s: 5.0, memory_limit_mb: 256}}
engine: {{max_batch_size: 1}}   # batch-invariant rollout log-probs: exact resume down to the last bit
run: {{steps: 2, checkpoint_every: 1, seed: 7, micro_batch_tokens: 2048}}
""")
    return path


def spade_cmd(*args: str) -> list[str]:
    return [PYTHON, "-m", "spade", "train", *args]


def run_spade(*args: str, timeout: float = RUN_TIMEOUT_S, env: dict | None = None) -> subprocess.CompletedProcess:
    """``spade train ARGS`` run to completion (forked from the prewarmed interpreter: tests/prewarmed.py)."""
    proc = prewarmed.run(["train", *args], timeout=timeout, env=None if env is None else {**os.environ, **env})
    assert proc.returncode == 0, f"spade train {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return proc


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def without_time(records: list[dict]) -> list[dict]:
    """Without the measured figures: ``time/`` and the peak RSS ``memory/`` of each phase."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))} for r in records]


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
def straight_run(graded_single_run) -> Path:
    """Two steps straight, on the config whose updates carry a real policy gradient."""
    return graded_single_run


def test_two_steps_write_the_run_directory(straight_run):
    records = metrics(straight_run)
    assert [r["step"] for r in records] == [0, 1]
    for record in records:
        for key in ("env/admitted", "env/rejected", "agent/return_mean", "train/loss", "time/step_s",
                    "time/train_s", "time/sync_s"):
            assert key in record, key
        assert {k.split("/")[0] for k in record if "/" in k} <= {"agent", "designer", "env", "train", "time", "engine",
                                                                 "pool", "rlve", "memory"}  # pool, rlve: a source's own
        phases = {k.rsplit("/", 1)[1] for k in record if k.startswith("memory/peak_rss_gb/")}
        assert {"plays", "forward_backward", "optimizer", "sync"} <= phases, phases  # issue 25
        assert record["memory/peak_rss_gb"] >= record["memory/peak_rss_gb/forward_backward"] > 0
        assert record["engine/generated_tokens"] > 0 and record["time/engine_tokens_per_s"] > 0
    assert records[0]["env/admitted"] == 2
    assert records[0]["train/samples"] > 0 and records[0]["train/loss"] is not None
    assert (straight_run / "config.yaml").is_file()
    assert (straight_run / "memory.sqlite").is_file()
    assert (straight_run / "checkpoints" / "latest").read_text().strip() == "step_2"
    for step in (1, 2):
        assert (straight_run / "checkpoints" / f"step_{step}" / "spade_checkpoint.json").is_file()
        state = json.loads((straight_run / "checkpoints" / f"step_{step}" / "trainer_state.json").read_text())
        assert state["step"] == step and state["orchestrator"]["envs"]
    assert list((straight_run / "tensorboard").glob("events.out.tfevents.*"))  # tensorboard: requirements.txt


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


def test_resume_equals_straight_run(straight_run, graded_config, tmp_path):
    run = tmp_path / "run"
    run_spade("--config", str(graded_config), "--run-dir", str(run), "run.steps=1")
    assert [r["step"] for r in metrics(run)] == [0]
    proc = run_spade("--resume", str(run), "run.steps=2")
    assert "resumed from" in proc.stderr
    assert_same_run(straight_run, run)


def kill_once_latest_is(cmd: list[str], run: Path, checkpoint: str, env: dict | None = None) -> None:
    """Start ``cmd`` in its own process group and SIGKILL the whole group as soon as
    ``run/checkpoints/latest`` names ``checkpoint`` (the next step is then underway)."""
    latest = run / "checkpoints" / "latest"
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if latest.is_file() and latest.read_text().strip() == checkpoint:
                break
            time.sleep(0.01)
        assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stderr.read()[-3000:]}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert latest.read_text().strip() == checkpoint


def test_kill_mid_step_then_resume(straight_run, graded_config, tmp_path):
    run = tmp_path / "run"
    kill_once_latest_is(spade_cmd("--config", str(graded_config), "--run-dir", str(run)), run, "step_1")
    run_spade("--resume", str(run))
    assert_same_run(straight_run, run)


# ---------------------------------------------------------------------- under torchrun (2 gloo ranks)

TRAIN_TOL = dict(rel=1e-5, abs=1e-6)  # train/ floats: rank splits and TP shards reorder fp sums only
PARAM_TOL = 1e-5  # weights after 2 Adam steps (lr 1e-3): rounding, magnified by Adam's 1/sqrt(v)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_torchrun_spade(*args: str, timeout: float = RUN_TIMEOUT_S, env: dict | None = None,
                       program: tuple[str, ...] = ("-m", "spade")) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 2 -m spade train ARGS`` (or ``PROGRAM train ARGS``) in its own
    process group, killed whole (agent and both ranks) when it outlives ``timeout``: a collective
    that never completes hangs."""
    cmd = [*prewarmed.torchrun(), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
           str(free_port()), *program, "train", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {}),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=30)
        pytest.fail(f"torchrun spade train {' '.join(args)} hung past {timeout:.0f} s (killed):\n{stderr[-6000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 0, (f"torchrun spade train {' '.join(args)} failed ({proc.returncode}):\n"
                                  f"{stdout[-2000:]}\n{stderr[-8000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


PER_RANK_KEYS = ("train/micro_batches",)  # rank 0's own count (len of its micro-batches), not a global sum


def assert_same_metrics(single: list[dict], distributed: list[dict]) -> None:
    """Same steps and keys; ``agent/``, ``env/``, ``designer/`` values equal; ``train/`` within
    ``TRAIN_TOL`` (exact for counts); ``time/`` ignored; ``PER_RANK_KEYS`` at most the single
    process's value (rank 0 holds only its share of the micro-batches)."""
    assert [r["step"] for r in distributed] == [r["step"] for r in single]
    mismatches = []
    for a, b in zip(without_time(single), without_time(distributed)):
        assert set(a) == set(b), set(a) ^ set(b)
        for key in sorted(a):
            if key in PER_RANK_KEYS:
                same = 1 <= b[key] <= a[key]
            elif key.startswith("train/") and isinstance(a[key], float) and isinstance(b[key], float):
                same = b[key] == pytest.approx(a[key], **TRAIN_TOL)
            else:
                same = b[key] == a[key]
            if not same:
                mismatches.append((a["step"], key, a[key], b[key]))
    assert not mismatches, "\n".join(f"step {s} {k}: single {x!r} != distributed {y!r}" for s, k, x, y in mismatches)


def assert_torchrun_run(run: Path, proc: subprocess.CompletedProcess, single_run: Path) -> None:
    records = metrics(run)
    # one writer: rank 1 appends nothing (two ranks writing would give 4 lines or repeated steps)
    assert [r["step"] for r in records] == [0, 1], [r.get("step") for r in records]
    for record in records:
        for key in ("step", "env/admitted", "env/rejected", "agent/return_mean", "train/loss", "time/step_s"):
            assert key in record, key
    assert records[0]["env/admitted"] == 2 and records[0]["train/samples"] > 0
    assert proc.stderr.count("run directory") == 1  # rank 0 alone created it
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_2"
    for step in (1, 2):
        directory = run / "checkpoints" / f"step_{step}"
        assert (directory / "spade_checkpoint.json").is_file()
        assert json.loads((directory / "trainer_state.json").read_text())["step"] == step
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) <= 1
    assert_same_metrics(metrics(single_run), records)
    # the final weights (layout-independent checkpoints) match the single process's, and moved
    ta, tb = (checkpoint_tensors(r / "checkpoints" / "step_2") for r in (single_run, run))
    model_keys = [k for k in ta if k.startswith(("embedding.", "decoder.", "output_layer."))]
    assert model_keys and set(model_keys) <= set(tb)
    worst = max((ta[k].double() - tb[k].double()).abs().max().item() for k in model_keys)
    assert worst <= PARAM_TOL, worst
    t0 = checkpoint_tensors(single_run / "checkpoints" / "step_1")
    assert max((t0[k] - ta[k]).abs().max().item() for k in model_keys) > 100 * PARAM_TOL


# A one-turn game whose reward grows with the action's length, played by a tiny model that ends
# its reply early (P(<|im_end|>) ~ 0.22 a token at temperature 1: most replies stop within
# sampling.agent.max_tokens): the plays of one environment get different rewards, so the GRPO advantages, the loss and the
# gradients are not zero. (With the example games and the plain random model every reply runs
# out of tokens before <|im_end|>, every return is 0, the loss and gradient are 0, and a loss
# comparison across layouts would be vacuous.)
GRADED_ENV = """
class LongAnswerEnv:
    def __init__(self, max_turns: int = 1):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        self.done = False
        return "Say anything. Longer answers score higher (reward = length / 40).", {}

    def step(self, action):
        if self.done:
            return "The game is over.", 0.0, True, False, {}
        self.done = True
        return "Thanks.", min(len(str(action)), 40) / 40.0, True, False, {}
"""


@pytest.fixture(scope="module")
def graded_config(tiny_hf, train_config, tmp_path_factory) -> Path:
    """The tiny config with an early-stopping model and a fixed pool of LongAnswerEnv and
    hidden_sequence (a non-zero loss)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = tmp_path_factory.mktemp("graded_cfg")
    hf = work / "hf"
    tokenizer = AutoTokenizer.from_pretrained(tiny_hf)
    model = AutoModelForCausalLM.from_pretrained(tiny_hf, dtype=torch.float32).eval()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():  # a large residual feature 0 on every token; <|im_end|> reads only it
        model.model.embed_tokens.weight[:, 0] += 4.0
        model.lm_head.weight[eos] = 0.0
        model.lm_head.weight[eos, 0] = 0.6
    model.save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    envs = work / "envs"
    envs.mkdir()
    (envs / "long_answer.py").write_text(GRADED_ENV)
    shutil.copy(ROOT / "examples" / "envs" / "hidden_sequence.py", envs / "hidden_sequence.py")
    text = train_config.read_text()
    old_envs = next(line for line in text.splitlines() if "fixed_env_dir:" in line).split(":", 1)[1].strip()
    assert str(tiny_hf) in text and old_envs
    path = work / "graded.yaml"
    text = text.replace(old_envs, str(envs)).replace(str(tiny_hf), str(hf))
    # plain sampling, so that <|im_end|> keeps its ~0.22 (top-k 20 at temperature 0.6 would pick it
    # almost always: empty replies, reward 0)
    plain = "top_k: null, top_p: 1.0"
    text = re.sub(r"\n    (designer|hint): \{(max_tokens: \d+)\}", rf"\n    \1: {{\2, {plain}}}", text)
    text = text.replace("\n    agent: {max_tokens: 12}",
                        f"\n    agent: {{max_tokens: 12, temperature: 1.0, {plain}}}\n    screen: {{{plain}}}")
    assert text.count("top_k: null") == 4
    # LongAnswerEnv rewards length by design (a graded return for a real gradient): admission's
    # long-reply probes rightly call it degenerate, so this pool is admitted without the probes
    text = text.replace("\n  k: 2\n", "\n  k: 2\n  admission: {probes: false}\n")
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def graded_single_run(graded_config, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("graded_single") / "run"
    run_spade("--config", str(graded_config), "--run-dir", str(run))
    records = metrics(run)
    # the comparison below is not vacuous: real rewards, a real loss and gradient in both steps
    assert all(r["train/loss"] != 0.0 and r["train/grad_norm"] > 0.0 for r in records), records
    return run


def test_torchrun_two_data_parallel_ranks_match_single_process(graded_single_run, graded_config, tmp_path):
    """``spade train`` under ``torchrun --nproc_per_node 2`` (gloo, CPU), parallel.tp=1: two
    data-parallel ranks. Rank 0 alone plays (sandbox, engine, orchestrator), broadcasts the samples,
    each rank trains on its ``data_parallel_shard``; the loss and its gradients are sums divided by
    the global token count, all-reduced over the ranks, so the step equals the single-process step
    up to the order of floating-point sums. The metrics therefore match the single-process run of
    the same config and seed: play metrics exactly, ``train/`` within ``TRAIN_TOL``, the step-2
    weights within ``PARAM_TOL`` (~1e-6 measured).

    What legitimately differs: ``time/`` keys, and ``train/micro_batches``, which is the length of
    rank 0's own micro-batch list (``len(micro_batches)`` in ``train_step``, not all-reduced): rank
    0 packs only its half of the samples (1 micro-batch here against 2 in one process).
    Step 1's play metrics are equal because the engine samples with per-request seeds and the
    ~1e-7 weight differences after step 0 move no sampled token (a draw would have to fall within
    ~1e-7 of a token boundary of the sampling CDF)."""
    run = tmp_path / "run"
    proc = run_torchrun_spade("--config", str(graded_config), "--run-dir", str(run))
    assert_torchrun_run(run, proc, graded_single_run)


TRAIN_THEN_REPORT_GROUPS = """
import glob, sys, time
import torch.distributed as dist
from spade.cli import main

code = main(sys.argv[1:])
deadline = time.monotonic() + 10  # the thread that ran the last collective can hold a group a moment longer
while (gloo := sorted(n for n in (open(p).read().strip() for p in glob.glob("/proc/self/task/*/comm")) if "gloo" in n)) \
        and time.monotonic() < deadline:
    time.sleep(0.01)
print(f"exit {code}, group still initialised: {dist.is_initialized()}, gloo threads: {gloo}")
"""


def test_a_finished_torchrun_run_tears_its_process_groups_down(graded_config, tmp_path):
    """When ``spade train`` ends cleanly, every rank has destroyed the default group and the
    control group, and gloo's threads have been joined: a group left to interpreter exit can abort
    a rank after a run that succeeded (a gloo thread releasing a tensor once Python has begun to
    finalize: SIGABRT, "terminate called without an active exception"), and torchrun would then
    report the run as failed."""
    script = tmp_path / "train_then_report_groups.py"
    script.write_text(TRAIN_THEN_REPORT_GROUPS)
    run = tmp_path / "run"
    proc = run_torchrun_spade("--config", str(graded_config), "--run-dir", str(run), "run.steps=1",
                              program=(str(script),))
    reports = [line for line in proc.stdout.splitlines() if line.startswith("exit ")]
    assert reports == ["exit 0, group still initialised: False, gloo threads: []"] * 2, proc.stdout[-2000:]
    assert [r["step"] for r in metrics(run)] == [0]


@pytest.mark.slow
def test_torchrun_kill_mid_step_then_resume(graded_single_run, graded_config, tmp_path):
    """SIGKILL of the whole torchrun group (agent and both ranks) while step 2 runs, then a resume
    under torchrun: the run ends equal to the single-process straight run (the tolerances of the
    two-rank comparison above), having lost only the step after its last checkpoint."""
    run = tmp_path / "run"
    # The real torchrun and interpreters: each rank arms its parent-death signal against its parent,
    # which for a program of prewarmed.python() is the zygote, not torchrun.
    cmd = [str(Path(PYTHON).parent / "torchrun"), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "spade", "train", "--config", str(graded_config), "--run-dir",
           str(run)]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    kill_once_latest_is(cmd, run, "step_1", env=env)
    assert [r["step"] for r in metrics(run)] == [0]
    resumed = run_torchrun_spade("--resume", str(run))
    assert "resumed from" in resumed.stderr
    records = metrics(run)
    assert [r["step"] for r in records] == [0, 1]
    assert_same_metrics(metrics(graded_single_run), records)
    ta, tb = (checkpoint_tensors(r / "checkpoints" / "step_2") for r in (graded_single_run, run))
    model_keys = [k for k in ta if k.startswith(("embedding.", "decoder.", "output_layer."))]
    assert model_keys and set(model_keys) <= set(tb)
    assert max((ta[k].double() - tb[k].double()).abs().max().item() for k in model_keys) <= PARAM_TOL


def test_torchrun_tensor_parallel_two_matches_single_process(graded_single_run, graded_config, tmp_path):
    """The same under parallel.tp=2 (one data-parallel rank, the model split in two): the weight
    sync gathers the TP shards into the rank-0 engine, and the run matches the single-process run."""
    run = tmp_path / "run"
    proc = run_torchrun_spade("--config", str(graded_config), "--run-dir", str(run), "parallel.tp=2")
    assert_torchrun_run(run, proc, graded_single_run)


# ---------------------------------------------------------------------- engine.kind: sglang (stand-in servers)

STANDIN = ROOT / "tests" / "sglang_standin" / "server.py"


def sglang_overrides(servers_per_node: int = 1, **server_env: str) -> list[str]:
    """Run the rollouts on SGLang-protocol servers launched by spade itself: the tests' stand-in
    (SGLang cannot run without a GPU), which serves the same model with the same seeded sampler as
    the in-process HF engine."""
    overrides = ["engine.kind=sglang", f"engine.sglang.server_command=[{prewarmed.python()}, {STANDIN}]",
                 f"engine.sglang.port={free_port()}", f"engine.sglang.servers_per_node={servers_per_node}",
                 "engine.sglang.start_timeout_s=120"]
    if server_env:
        overrides.append("engine.sglang.server_env={" + ", ".join(f"{k}: '{v}'" for k, v in server_env.items()) + "}")
    return overrides


SGLANG_ONLY_KEYS = ("engine/restarted_servers", "engine/restarts_total", "engine/retries", "engine/offloaded_gib")


def without_engine_keys(records: list[dict]) -> list[dict]:
    """The metrics only the sglang engine reports (restarts, re-sent requests) left out."""
    return [{k: v for k, v in r.items() if k not in SGLANG_ONLY_KEYS} for r in records]


def assert_same_weights(a: Path, b: Path) -> None:
    ta, tb = (checkpoint_tensors(r / "checkpoints" / "step_2") for r in (a, b))
    model_keys = [k for k in ta if k.startswith(("embedding.", "decoder.", "output_layer."))]
    assert model_keys and set(model_keys) <= set(tb)
    worst = max((ta[k].double() - tb[k].double()).abs().max().item() for k in model_keys)
    assert worst <= PARAM_TOL, worst


def test_sglang_engine_run_matches_hf_engine_run(graded_single_run, graded_config, tmp_path):
    """``engine.kind: sglang`` end to end in one process: spade launches the server (ServerLauncher,
    the production argv with the module swapped for the stand-in), waits for its health, sends the
    trainer's weights as serialized tensor handles inside a begin/end update session before step 0
    and after each update, releases and resumes its memory around the train step (the stand-in
    refuses generation while released and updates outside a session), and stops it at the end. The
    stand-in samples with the request seeds like the in-process engine, so the run reproduces the
    HF-engine run: play metrics exactly, train metrics within TRAIN_TOL, weights within PARAM_TOL.
    Every sample records the weight version that generated it.

    SPADE_OFFLOAD_ON_CPU=1 makes the training-memory offload really free and restore the model's
    and optimizer's storages on this CPU run (as it does on a GPU), so a use of the training state
    while it is on "host" (train step, weight sync, checkpoint) would fail here."""
    run = tmp_path / "run"
    run_spade("--config", str(graded_config), "--run-dir", str(run), *sglang_overrides(),
              env={"SPADE_OFFLOAD_ON_CPU": "1"})
    records = metrics(run)
    assert [r["engine/restarts_total"] for r in records] == [0.0, 0.0]
    assert all(r["engine/offloaded_gib"] > 0 for r in records)  # the training state went to "host"
    # on-policy: step 1's rollouts came from the weights of step 0's update (the server reported
    # version 1 through its weight_version), so no sample lags behind the policy it trains
    assert [r["train/policy_lag_max"] for r in records] == [0.0, 0.0]
    assert_same_metrics(metrics(graded_single_run), without_engine_keys(records))
    assert_same_weights(graded_single_run, run)
    log = (run / "logs" / "sglang-server-0.log").read_text()
    assert "ready to roll" in log and log.count("/update_weights_from_tensor -> 200") >= 3  # start + 2 steps
    assert "/generate -> 400" not in log  # never asked to generate while its memory was released


def test_torchrun_two_servers_one_dies_mid_rollout(graded_single_run, graded_config, tmp_path):
    """Two ranks, two servers (one per rank: each server's worker is fed by the rank on its
    "GPU"), and one server exits on its 3rd request during step 0's rollouts. Rank 0 tells rank 1,
    the owner (local rank 0) restarts it, both ranks re-send the current weights to it, the failed
    request is retried there, and the step completes. The retried request has the same seed and
    the restarted server the same weights, so the run still equals the single-process HF run.
    The offload really moves the training state (SPADE_OFFLOAD_ON_CPU=1): the recovery brings the
    parameters back for the re-send and sends them away again."""
    marker = tmp_path / "died-once"
    run = tmp_path / "run"
    run_torchrun_spade("--config", str(graded_config), "--run-dir", str(run),
                       *sglang_overrides(servers_per_node=2, SPADE_STANDIN_DIE_AFTER_GENERATES="3",
                                         SPADE_STANDIN_DIE_ONCE_FILE=str(marker)),
                       env={"SPADE_OFFLOAD_ON_CPU": "1"})
    assert marker.is_file(), "the fault was never injected"
    records = metrics(run)
    assert records[-1]["engine/restarts_total"] == 1.0
    assert records[0]["engine/retries"] >= 1 and records[0]["engine/restarted_servers"] == 0.0  # mid-rollout
    assert_same_metrics(metrics(graded_single_run), without_engine_keys(records))
    assert_same_weights(graded_single_run, run)
    logs = [(run / "logs" / f"sglang-server-{i}.log").read_text() for i in (0, 1)]
    assert sum(log.count("fault injection") for log in logs) == 1
    assert sum(log.count("ready to roll") for log in logs) == 3  # two starts and one restart


def test_disaggregated_servers_get_weights_by_broadcast(graded_single_run, graded_config, tmp_path):
    """``engine.sglang.urls``: a server spade did not launch (started here, as a plain process).
    Weights go by the broadcast path: rank 0 opens a process group with the server
    (/init_weights_update_group; gloo on CPU, NCCL on GPUs) and broadcasts every tensor while
    posting /update_weights_from_distributed inside an update session. The run again equals the
    HF-engine run, and the server's log shows the group and the updates."""
    import urllib.request

    from sglang_standin import standin_argv

    from spade.rollout.sglang.launcher import sglang_argv

    port = free_port()
    log_path = tmp_path / "external.log"
    hf_dir = next(line for line in graded_config.read_text().splitlines() if "hf_dir" in line)
    hf_dir = hf_dir.split("hf_dir:", 1)[1].split(",")[0].strip()
    with open(log_path, "wb") as log:
        server = subprocess.Popen(standin_argv(sglang_argv(hf_dir, port=port)), cwd=ROOT, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        run = tmp_path / "run"
        run_spade("--config", str(graded_config), "--run-dir", str(run), "engine.kind=sglang",
                  f"engine.sglang.urls=[http://127.0.0.1:{port}]")
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
    records = metrics(run)
    assert_same_metrics(metrics(graded_single_run), without_engine_keys(records))
    assert_same_weights(graded_single_run, run)
    log = log_path.read_text()
    assert "/init_weights_update_group -> 200" in log
    assert log.count("/update_weights_from_distributed -> 200") >= 3 and "/update_weights_from_tensor" not in log
    assert "/release_memory_occupation" not in log  # not colocated: nothing to make room for


def test_torchrun_pipeline_parallel_two_matches_single_process(graded_single_run, graded_config, tmp_path):
    """parallel.pp=2: rank 0 holds the first stage only, so the weight sync broadcasts the second
    stage's tensors to it (StageBroadcast) before they reach the engine; the run matches the
    single-process run."""
    run = tmp_path / "run"
    proc = run_torchrun_spade("--config", str(graded_config), "--run-dir", str(run), "parallel.pp=2")
    assert_torchrun_run(run, proc, graded_single_run)


def test_a_server_that_cannot_start_fails_the_run_with_its_log(graded_config, tmp_path):
    """A server that exits at start (here: a command that prints a CUDA-style error and exits)
    stops ``spade train`` before the model is built, with the server's last log lines in the error."""
    run = tmp_path / "run"
    fake = "import sys; print('RuntimeError: no CUDA GPUs are available', flush=True); sys.exit(3)"
    proc = subprocess.run(spade_cmd("--config", str(graded_config), "--run-dir", str(run), "engine.kind=sglang",
                                    f"engine.sglang.server_command=[{PYTHON}, -c, \"{fake}\"]",
                                    f"engine.sglang.port={free_port()}"),
                          cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode != 0
    assert "SGLang servers failed to start" in proc.stderr and "exited with code 3" in proc.stderr
    assert "no CUDA GPUs are available" in proc.stderr  # the log tail
    assert not (run / "checkpoints" / "latest").exists()


def test_sglang_run_resumes_exactly(graded_single_run, graded_config, tmp_path):
    """Stop after step 1 and ``--resume`` with engine.kind sglang: the resumed process launches a
    fresh server, sends it the checkpoint's weights before the first step (version 1), and the
    two halves together equal the straight HF-engine run."""
    run = tmp_path / "run"
    run_spade("--config", str(graded_config), "--run-dir", str(run), "run.steps=1", *sglang_overrides())
    proc = run_spade("--resume", str(run), "run.steps=2")
    assert "resumed from" in proc.stderr
    records = metrics(run)
    assert [r["step"] for r in records] == [0, 1]
    assert_same_metrics(metrics(graded_single_run), without_engine_keys(records))
    assert_same_weights(graded_single_run, run)


def test_a_server_that_keeps_dying_ends_the_run_after_max_restarts(graded_config, tmp_path):
    """A server that dies on every 2nd request is restarted engine.sglang.max_restarts times, then
    the run stops with an error that says so and shows the server's last log lines."""
    run = tmp_path / "run"
    proc = subprocess.run(
        spade_cmd("--config", str(graded_config), "--run-dir", str(run), "engine.sglang.max_restarts=1",
                  *sglang_overrides(SPADE_STANDIN_DIE_AFTER_GENERATES="2")),
        cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode != 0
    assert "died more than engine.sglang.max_restarts = 1 times" in proc.stderr, proc.stderr[-3000:]
    assert "fault injection: exiting on /generate #2" in proc.stderr  # the log tail
    log = (run / "logs" / "sglang-server-0.log").read_text()
    assert log.count("ready to roll") == 2  # the first start and the one restart allowed


def test_sglang_run_with_a_kl_reference_model_offloads_it(graded_config, tmp_path):
    """loss.kl_coef > 0 (the 8B recipe) keeps a frozen reference model; colocated, its parameters
    are on the GPU only while they score the step's samples. With SPADE_OFFLOAD_ON_CPU=1 any use
    of it while offloaded would crash this CPU run; the KL term is computed and finite."""
    run = tmp_path / "run"
    run_spade("--config", str(graded_config), "--run-dir", str(run), "loss.kl_coef=0.01", *sglang_overrides(),
              env={"SPADE_OFFLOAD_ON_CPU": "1"})
    records = metrics(run)
    assert [r["step"] for r in records] == [0, 1]
    assert records[1]["train/kl_mean"] > 0 and math.isfinite(records[1]["train/loss"])


def test_sglang_run_refuses_an_interpreter_without_sglang_before_launching(graded_config, tmp_path):
    """Colocated servers launched with spade's own command line: the start-up check compares this
    process's torch/NCCL with the SGLang interpreter's and refuses before any server or model is
    started. The servers' interpreter cannot import sglang (a shadowing package on their PYTHONPATH
    makes that so here and in the GPU image, where sglang is installed), so the run stops at once
    with both sides named."""
    run = tmp_path / "run"
    shadow = tmp_path / "no-sglang"
    (shadow / "sglang").mkdir(parents=True)
    (shadow / "sglang" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'sglang'\", name='sglang')\n")
    proc = subprocess.run(spade_cmd("--config", str(graded_config), "--run-dir", str(run), "engine.kind=sglang",
                                    f"engine.sglang.port={free_port()}",
                                    f"engine.sglang.server_env={{PYTHONPATH: {shadow}}}"),
                          cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode != 0
    assert "sglang: not importable" in proc.stderr, proc.stderr[-3000:]
    assert not (run / "logs" / "sglang-server-0.log").exists()  # no server was launched


def test_in_loop_evaluation_logs_held_out_scores(graded_config, tmp_path):
    """eval.every: 2 evaluates the published policy after step 1 (2 updates) on the configured
    benchmarks, through the training engine; a benchmark without data is reported as skipped."""
    run = tmp_path / "run"
    fixtures = ROOT / "tests" / "fixtures" / "eval"
    run_spade("--config", str(graded_config), "--run-dir", str(run), "eval.every=2", "eval.limit=1",
              "eval.samples=1", "eval.max_new_tokens=8", "eval.benchmarks=[aime25, aime26]",
              f"eval.data_dir={fixtures}")
    records = metrics(run)
    assert "eval/aime25" not in records[0]
    assert records[1]["eval/skipped/aime26"] == 1.0 and "eval/aime26" not in records[1]
    # the logged score is the evaluation's own records' mean, made by the weights of update 2
    (line,) = (run / "eval" / "step_2" / "aime25.jsonl").read_text().splitlines()
    item = json.loads(line)
    fixture_ids = [json.loads(row)["id"] for row in (fixtures / "aime2025.jsonl").read_text().splitlines()]
    assert item["item_id"] in fixture_ids and item["weight_version"] == 2
    (sample,) = item["samples"]
    assert sample["completion_tokens"] <= 8 and sample["score"] == float(sample["correct"])
    assert records[1]["eval/step"] == 2 and records[1]["eval/aime25"] == sample["score"]
    # run.best_metric (default eval/mean, the suite average of the scored benchmarks): the score of
    # checkpoint step_2, whose weights were evaluated, is recorded and marks it best
    assert records[1]["eval/mean"] == records[1]["eval/aime25"]
    best = json.loads((run / "checkpoints" / "best").read_text())
    assert best["scores"] == {"2": records[1]["eval/mean"]} and (run / "checkpoints" / "step_2").is_dir()


# ---------------------------------------------------------------------- selfplay.rollout_shards: 2
# ``spade train`` with two rollout shards under ``torchrun --nproc_per_node 2``: each rank is a shard
# (two one-process "nodes") with its own sandbox service and its own engine (the hf engine in each
# rank, or its block of the stand-in SGLang servers), and the run equals the single-process run of
# the same config and seed: a play's seeds do not depend on the shard that plays it, and rank 1's
# engine serves every step from the weights just published (a stale engine would change the step-2
# returns and the policy lag). docs/rollout_shards.md.

SHARD_KEYS = ("rollout/shards", "rollout/shard_rounds", "rollout/shard_plays_max", "rollout/shard_plays_min",
              "time/shard_wait_s", "time/shard_play_max_s", "time/shard_play_min_s")


def split_shard_keys(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the records without the shard figures, the shard figures of each)."""
    return ([{k: v for k, v in r.items() if k not in SHARD_KEYS} for r in records],
            [{k: r[k] for k in SHARD_KEYS} for r in records])


def assert_two_shards_of_two_plays(shard_figures: list[dict]) -> None:
    for figures in shard_figures:  # 2 envs x 2 plays a step: two plays on each rank, one round
        assert figures["rollout/shards"] == 2 and figures["rollout/shard_rounds"] == 1
        assert figures["rollout/shard_plays_max"] == figures["rollout/shard_plays_min"] == 2


def test_two_hf_shards_match_the_single_process_run(graded_single_run, graded_config, tmp_path):
    run = tmp_path / "run"
    run_torchrun_spade("--config", str(graded_config), "--run-dir", str(run), "selfplay.rollout_shards=2")
    records, shard_figures = split_shard_keys(metrics(run))
    assert_two_shards_of_two_plays(shard_figures)
    # engine/generated_tokens counts both ranks' engines: equal to the one engine's
    assert_same_metrics(metrics(graded_single_run), records)
    assert_same_weights(graded_single_run, run)


def test_two_sglang_shards_match_the_single_process_run(graded_single_run, graded_config, tmp_path):
    run = tmp_path / "run"
    run_torchrun_spade("--config", str(graded_config), "--run-dir", str(run), "selfplay.rollout_shards=2",
                       *sglang_overrides(servers_per_node=2))
    records, shard_figures = split_shard_keys(metrics(run))
    assert_two_shards_of_two_plays(shard_figures)
    assert_same_metrics(metrics(graded_single_run), without_engine_keys(records))
    assert_same_weights(graded_single_run, run)
    logs = [(run / "logs" / f"sglang-server-{i}.log").read_text() for i in (0, 1)]
    assert all("POST /generate -> 200" in log for log in logs), "a shard's server served no rollout"
