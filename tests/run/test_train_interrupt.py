"""Ctrl-C in a real ``spade train`` (issue 43): acknowledged at once, the step in progress
checkpointed, the stop message naming the step ``--resume`` starts at; a second Ctrl-C stops now
and says there is no checkpoint yet. The SIGINT goes to the run's whole process group, as a
terminal's Ctrl-C does. The resumed run then holds one step numbering in every artifact.

Subprocesses with hard timeouts; output lines are polled, nothing sleeps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from test_train_loop import ROOT, RUN_TIMEOUT_S, metrics, spade_cmd, tiny_hf, train_config  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3 * RUN_TIMEOUT_S + 60)]


class Run:
    """``spade train ARGS`` in its own process group, its stderr read line by line with arrival times."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(spade_cmd(*args), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.lines: list[tuple[float, str]] = []
        self.deadline = time.monotonic() + RUN_TIMEOUT_S

    def wait_for(self, pattern: str) -> str:
        """Read until a line matches ``pattern`` (a regex); the line."""
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line))
            if re.search(pattern, line):
                return line
            assert time.monotonic() < self.deadline, self.text()[-3000:]
        raise AssertionError(f"the run ended before {pattern!r}:\n{self.text()[-3000:]}")

    def ctrl_c(self) -> float:
        os.killpg(self.proc.pid, signal.SIGINT)
        return time.monotonic()

    def finish(self) -> int:
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line))
        return self.proc.wait(timeout=max(1.0, self.deadline - time.monotonic()))

    def text(self) -> str:
        return "".join(line for _, line in self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def test_ctrl_c_finishes_the_step_checkpoints_it_and_names_the_resume_step(train_config, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    # no checkpoint is due before the end: the one the stop writes is the stop's own
    run = Run("--config", str(train_config), "--run-dir", str(run_dir), "run.steps=4", "run.checkpoint_every=4")
    try:
        run.wait_for(r"step 1 \(2/4\) playing")  # step 0 has ended: its time is known
        sent = run.ctrl_c()
        ack = run.wait_for(r"Ctrl-C: ")
        acked_in = run.lines[-1][0] - sent
        code = run.finish()
    finally:
        run.kill()
    out = run.text()
    assert acked_in < 10.0, out
    assert re.search(r"Ctrl-C: stopping after step 1's checkpoint \(checkpoints/step_2, where a resume starts\), "
                     r"about \d+ s; Ctrl-C again to stop now", ack), ack
    assert code == 130, out
    assert "stopped after step 1 and its checkpoint (checkpoints/step_2). Continue at step 2 with:" in out, out
    assert "Traceback" not in out, out
    assert [r["step"] for r in metrics(run_dir)] == [0, 1]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_2"]
    assert (run_dir / "checkpoints" / "latest").read_text().strip().endswith("2")

    resumed = subprocess.run(spade_cmd("--resume", str(run_dir)), cwd=ROOT, capture_output=True, text=True,
                             timeout=RUN_TIMEOUT_S, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "(step 2;" in resumed.stderr, resumed.stderr[-3000:]  # "resumed from .../step_000002 (step 2; ..."
    assert "step 2 (3/4) |" in resumed.stderr and "step 0 (1/4) |" not in resumed.stderr, resumed.stderr[-3000:]
    assert_one_step_numbering(run_dir, run.text() + resumed.stderr, steps=4, k=2)


def test_a_second_ctrl_c_stops_now_and_says_there_is_no_checkpoint(train_config, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    run = Run("--config", str(train_config), "--run-dir", str(run_dir), "run.steps=4", "run.checkpoint_every=4")
    try:
        run.wait_for(r"step 0 \(1/4\) playing")
        run.ctrl_c()
        ack = run.wait_for(r"Ctrl-C: ")
        run.ctrl_c()
        code = run.finish()
    finally:
        run.kill()
    out = run.text()
    assert "stopping after step 0's checkpoint (checkpoints/step_1" in ack and "not known yet" in ack, ack
    assert code == 130, out
    assert "No checkpoint yet: nothing to continue from" in out, out
    assert not list((run_dir / "checkpoints").glob("step_*")) if (run_dir / "checkpoints").exists() else True


def assert_one_step_numbering(run_dir: Path, console: str, *, steps: int, k: int) -> None:
    """Every artifact names step ``s`` (the updates done before it) by the same number: the console
    (``step s (s+1/N)``), metrics.jsonl, TensorBoard, trajectories/, envs/ (regeneration steps),
    the explorer's and ``spade analyze``'s readers; checkpoints/step_s is where step s begins."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from spade.analysis.run_reader import read_run

    expected = list(range(steps))
    assert [r["step"] for r in metrics(run_dir)] == expected
    console_steps = sorted({int(m.group(1)) for m in re.finditer(r"step (\d+) \((\d+)/4\) \|", console)})
    assert console_steps == expected, console
    for m in re.finditer(r"step (\d+) \((\d+)/4\) \|", console):
        assert int(m.group(2)) == int(m.group(1)) + 1
    board = EventAccumulator(str(run_dir / "tensorboard"))
    board.Reload()
    assert sorted({e.step for e in board.Scalars("train/samples")}) == expected
    assert sorted(int(p.stem.split("_")[1]) for p in (run_dir / "trajectories").glob("step_*.jsonl")) == expected
    assert sorted(int(p.name.split("_")[1]) for p in (run_dir / "envs").glob("step_*")) == list(range(0, steps, k))
    run = read_run(run_dir)
    assert [int(r["step"]) for r in run.metrics] == expected
    # the final checkpoint is where a step after the last would begin
    assert (run_dir / "checkpoints" / f"step_{steps}").is_dir()
    state = json.loads((run_dir / "checkpoints" / f"step_{steps}" / "trainer_state.json").read_text())
    assert state["step"] == steps
