"""Ctrl-C in a real ``spade eval --out DIR`` (issue 43): exit 130, the finished items kept and
counted, and the printed command resumes with only the rest. The SIGINT goes to the whole process
group, as a terminal's Ctrl-C does; output is polled, nothing sleeps longer than a poll."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_eval_runner import tiny_model  # noqa: F401 - the fixture

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parents[1] / "fixtures" / "eval"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_ctrl_c_keeps_the_finished_items_and_says_how_to_resume(tiny_model, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    args = ["eval", "--model", str(tiny_model), "--benchmarks", "aime25,gpqa_diamond", "--data", str(FIXTURES),
            "--samples", "6", "--max-new-tokens", "24", "--concurrency", "1", "--limit", "3", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "spade", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    results = out / "aime25.jsonl"
    try:
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            if results.is_file() and results.read_text().count("\n") >= 1:
                break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    kept = len(results.read_text().splitlines())
    assert 1 <= kept < 3
    match = re.search(r"spade eval: stopped\. Finished items kept in (\S+) \(aime25 (\d+)\); run the same command "
                      r"again to resume with only the rest:\n  spade (.+)\n", stderr)
    assert match, stderr[-3000:]
    assert match.group(1) == str(out) and int(match.group(2)) == kept
    assert shlex.split(match.group(3)) == args

    resumed = subprocess.run([sys.executable, "-m", "spade", *shlex.split(match.group(3))], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    progress = [line.strip() for line in resumed.stderr.splitlines() if line.strip().startswith("aime25:")]
    assert progress[0] == f"aime25: {kept}/3 items"  # it started past the kept items
    ids = [json.loads(line)["item_id"] for line in results.read_text().splitlines()]
    assert sorted(ids) == ["fx-1", "fx-2", "fx-3"]


def test_ctrl_c_without_out_says_nothing_was_kept(tiny_model, tmp_path):  # noqa: F811
    proc = subprocess.Popen([sys.executable, "-m", "spade", "eval", "--model", str(tiny_model), "--benchmarks",
                             "aime25", "--data", str(FIXTURES), "--samples", "6", "--max-new-tokens", "24",
                             "--concurrency", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    seen = []
    try:
        for line in proc.stderr:  # the engine is open once the first progress line is out
            seen.append(line)
            if "aime25:" in line:
                break
        os.killpg(proc.pid, signal.SIGINT)
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    stderr = "".join(seen) + rest
    assert proc.returncode == 130, stderr[-3000:]
    assert "spade eval: stopped. Nothing was kept (no --out): give --out DIR" in stderr, stderr[-3000:]
