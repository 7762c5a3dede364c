"""No process outlives ``spade train``, whatever kills it.

A tiny run (random tiny Qwen3, the fixed pool of two example games, the real sandbox and the real
Megatron checkpoints) is SIGKILLed -- the main process alone, as ``kill -9 PID`` does -- after its
first checkpoint, while step 2 runs. Every process it started (the sandbox supervisor and its
bubblewrap sandboxes, anything a checkpoint save started) must then be gone. Descendants are found
two ways: the process tree just before the kill, and a unique environment variable that every
process inheriting the trainer's environment carries (bubblewrap clears it inside the sandbox;
those are in the tree).

Before the fix, megatron-core's filesystem writer left a multiprocessing ``resource_tracker`` and
a ``spawn_main`` Manager (~330 MB) behind, reparented to PID 1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from support.configs import example_envs, write_config

ROOT = Path(__file__).resolve().parents[2]
TAG_ENV = "SPADE_TEST_ORPHAN_TAG"
RUN_TIMEOUT_S = 300

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_TIMEOUT_S + 120)]


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    from chat_templates import bpe_tokenizer
    from support.models import save_tiny_qwen3

    work = tmp_path_factory.mktemp("orphans")
    hf = work / "hf"
    tokenizer = bpe_tokenizer()
    save_tiny_qwen3(hf, tokenizer, special_ids=True)
    envs = example_envs(work / "envs")
    path = work / "tiny.yaml"
    write_config(path, {
        "model": {"hf_dir": hf, "dtype": "float32"},
        "selfplay": {
            "k": 2,
            "envs_per_set": 2,
            "g_nohint": 2,
            "g_hint": 2,
            "designer_enabled": False,
            "fixed_env_dir": envs,
            "use_corpus": False,
            "sampling": {"designer": {"max_tokens": 8}, "agent": {"max_tokens": 8}, "hint": {"max_tokens": 8}},
            "max_turns": 1,
            "max_context_tokens": 1024,
        },
        "engine": {"max_batch_size": 8},
        "run": {"steps": 4, "checkpoint_every": 1, "seed": 7, "micro_batch_tokens": 2048},
    })
    return path


def tagged(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TAG_ENV) == tag:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def describe(procs) -> list[str]:
    out = []
    for proc in procs:
        try:
            out.append(f"{proc.pid} (parent {proc.ppid()}): {' '.join(proc.cmdline())[:160]}")
        except psutil.Error:
            continue
    return out


def _cmdline(process: psutil.Process) -> str:
    """The command line of a process that may exit (or linger as a zombie) while it is read."""
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return ""


def test_sigkill_of_spade_train_leaves_no_process(tiny_config, tmp_path):
    run = tmp_path / "run"
    latest = run / "checkpoints" / "latest"
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG_ENV: tag, "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "train.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "spade", "train", "--config", str(tiny_config),
                             "--run-dir", str(run)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # a group of its own: the cleanup below kills it whole
    main = psutil.Process(proc.pid)
    try:
        # the first checkpoint is complete once 'latest' names it; step 2 then runs
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (latest.is_file() and latest.read_text().strip() == "step_1"):
            assert proc.poll() is None, f"the run ended before it could be killed:\n{(tmp_path / 'train.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no checkpoint within the time limit"
            try:
                main.wait(timeout=0.05)  # returns early only if the run exits
            except psutil.TimeoutExpired:
                pass
        tree = main.children(recursive=True)
        names = " ".join(_cmdline(p) for p in tree)
        assert "spade.envs.sandbox.supervisor" in names, names  # the kill below is not vacuous
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(tree, timeout=30)
        survivors = {p.pid: p for p in alive + tagged(tag) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE}
        assert describe(survivors.values()) == []
    finally:
        for leftover in tagged(tag):  # never leave them to the next test
            try:
                leftover.kill()
            except psutil.Error:
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


HOST = """
import asyncio, sys
from spade.envs.sandbox.client import SandboxService
from spade.envs.sandbox.config import SandboxConfig

async def main():
    service = await SandboxService.start(SandboxConfig())
    print(service._process.pid, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_the_sandbox_supervisor_dies_with_its_client_even_when_it_cannot_notice():
    """The supervisor stops when its socket closes; one that is stopped (SIGSTOP: it reads nothing)
    still dies with the process that started it: the kernel's parent-death signal."""
    host = subprocess.Popen([sys.executable, "-c", HOST], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    supervisor = None
    try:
        line = host.stdout.readline()
        assert line.strip().isdigit(), f"the sandbox service did not start (exit {host.poll()})"
        supervisor = psutil.Process(int(line))
        sandboxes = supervisor.children(recursive=True)
        assert sandboxes, "the supervisor started no sandbox"
        supervisor.suspend()
        os.kill(host.pid, signal.SIGKILL)
        host.wait(timeout=30)
        _, alive = psutil.wait_procs([supervisor, *sandboxes], timeout=30)
        assert describe(p for p in alive if p.status() != psutil.STATUS_ZOMBIE) == []
    finally:
        if supervisor is not None and supervisor.is_running():
            supervisor.kill()
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
            host.wait(timeout=30)


TORCHRUN = Path(sys.executable).parent / "torchrun"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_sigkill_of_torchrun_leaves_no_rank(tiny_config, tmp_path):
    """torchrun starts each rank in a session of its own; SIGKILLed, it cannot stop them. Each rank
    must die anyway (its parent-death signal), and with rank 0 its sandbox. Killed once the first
    step's metrics line is written: both ranks are in the training loop. The ranks are stopped
    (SIGSTOP) just before, so that they cannot die of anything they would notice themselves."""
    assert TORCHRUN.exists(), f"torchrun not found next to {sys.executable}"
    run = tmp_path / "run"
    metrics = run / "metrics.jsonl"
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG_ENV: tag, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = open(tmp_path / "torchrun.log", "w+")
    proc = subprocess.Popen([str(TORCHRUN), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                             "--master_port", str(free_port()), "-m", "spade", "train", "--config", str(tiny_config),
                             "--run-dir", str(run), "run.steps=20"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    main = psutil.Process(proc.pid)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (metrics.is_file() and metrics.read_text().count("\n") >= 1):
            assert proc.poll() is None, f"the run ended before it could be killed:\n{(tmp_path / 'torchrun.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no metrics line within the time limit"
            try:
                main.wait(timeout=0.05)  # returns early only if torchrun exits
            except psutil.TimeoutExpired:
                pass
        tree = main.children(recursive=True)
        ranks = [p for p in tree if "spade" in " ".join(p.cmdline()) and "train" in p.cmdline()]
        names = " ".join(_cmdline(p) for p in tree)
        assert len(ranks) == 2 and "spade.envs.sandbox.supervisor" in names, names  # not a vacuous kill
        assert all(os.getsid(p.pid) != os.getsid(proc.pid) for p in ranks)  # out of reach of torchrun's group
        for rank in ranks:  # stopped ranks notice nothing (a lost store, a broken collective): only the
            rank.suspend()  # kernel's parent-death SIGKILL can end them
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(tree, timeout=30)
        survivors = {p.pid: p for p in alive + tagged(tag) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE}
        assert describe(survivors.values()) == []
    finally:
        for leftover in tagged(tag):
            try:
                leftover.kill()
            except psutil.Error:
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()
