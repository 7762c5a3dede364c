"""Runs that learn nothing say so (issue 43): ``spade train`` on the tiny model, the hf engine and
the real sandbox.

On the tiny random model every play of the plain config ends with return 0, so every group's
returns are equal, every advantage is 0 and the update has loss 0 and gradient norm 0: each step
carries ``train/no_signal`` 1.0, its console line says ``NO LEARNING SIGNAL`` and the summary counts
the updates. The graded config's groups have spread (a real policy gradient): 0.0, and no flag.
``agent/group_return_std`` and ``agent/flat_groups`` are checked against the returns the run itself
logged per environment (``RUN/trajectories/``), computed here by hand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from test_train_loop import (RUN_TIMEOUT_S, graded_config, graded_single_run, metrics, run_spade,  # noqa: F401
                             tiny_hf, train_config)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)]


def logged_groups(run: Path, step: int) -> list[list[float]]:
    """Each environment's no-hint returns of ``step``, as the run's trajectory log holds them."""
    path = run / "trajectories" / f"step_{step:06d}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [row["nohint_returns"] for row in rows if row["kind"] == "env_returns" and row["nohint_returns"]]


def spread(groups: list[list[float]]) -> float:
    stds = []
    for returns in groups:
        mean = sum(returns) / len(returns)
        stds.append(math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns)))
    return sum(stds) / len(stds)


def test_steps_with_equal_returns_in_every_group_are_flagged_and_counted(train_config, tmp_path):
    run = tmp_path / "run"
    proc = run_spade("--config", str(train_config), "--run-dir", str(run), env={"OMP_NUM_THREADS": "1"})
    records = metrics(run)
    assert [r["step"] for r in records] == [0, 1]
    for r in records:
        groups = logged_groups(run, r["step"])
        assert groups and all(len(set(g)) == 1 for g in groups)  # the premise: no spread anywhere
        assert r["train/samples"] > 0
        assert (r["train/loss"], r["train/grad_norm"]) == (0.0, 0.0)
        assert r["train/no_signal"] == 1.0
        assert r["agent/group_return_std"] == 0.0
        assert r["agent/flat_groups"] == float(len(groups))
    lines = [line for line in proc.stderr.splitlines() if "| trained " in line]
    assert len(lines) == 2, proc.stderr[-3000:]
    flat = len(logged_groups(run, 0))
    assert all(f"NO LEARNING SIGNAL: every advantage was 0 ({flat} groups with equal returns)" in line
               for line in lines), lines
    assert "signal     2 of 2 updates had no learning signal" in proc.stderr
    assert "(steps 0, 1)" in proc.stderr  # numbered as metrics.jsonl numbers them


def test_steps_with_spread_are_not_flagged(graded_single_run):
    records = metrics(graded_single_run)
    for r in records:
        groups = logged_groups(graded_single_run, r["step"])
        assert r["train/no_signal"] == 0.0 and r["train/grad_norm"] > 0.0
        assert r["agent/group_return_std"] == pytest.approx(spread(groups), abs=1e-12) and r["agent/group_return_std"] > 0
        assert r["agent/flat_groups"] == float(sum(len(set(g)) == 1 for g in groups))


def test_the_signal_is_any_advantage_that_is_not_zero():
    import torch

    from spade.rl.samples import TrainSample
    from spade.run.console import step_line
    from spade.run.step_metrics import learning_signal

    def sample(advantages):
        return TrainSample(token_ids=torch.tensor([1, 2, 3]), loss_mask=torch.tensor([1, 1]), advantages=advantages)

    assert learning_signal([]) == {}
    assert learning_signal([sample(0.0), sample(0.0)]) == {"train/no_signal": 1.0}
    assert learning_signal([sample(0.0), sample(-0.5)]) == {"train/no_signal": 0.0}
    assert learning_signal([sample(torch.zeros(2)), sample(torch.tensor([0.0, 1e-3]))]) == {"train/no_signal": 0.0}
    assert learning_signal([sample(torch.zeros(2))]) == {"train/no_signal": 1.0}
    trained = {"agent/episodes": 4.0, "agent/return_mean": 0.5, "train/loss": -0.2, "train/grad_norm": 0.8,
               "train/samples": 4.0}
    assert "LEARNING SIGNAL" not in step_line(0, 2, {**trained, "train/no_signal": 0.0})
    assert step_line(0, 2, {**trained, "train/no_signal": 1.0, "agent/flat_groups": 1.0}).endswith(
        "NO LEARNING SIGNAL: every advantage was 0 (1 group with equal returns)")
