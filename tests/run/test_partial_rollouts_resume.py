"""Partial rollouts survive a kill -9 (issue 26): ``spade train`` on the tiny model, the hf engine
and the real sandbox, with ``selfplay.partial_rollouts`` on (half the set's groups end a step, one
play at a time so which group is carried does not depend on timing).

4 steps, a checkpoint every 2, ``k: 2``: step 1 carries the second environment's group into the
checkpoint ``step_2``; the run is killed when step 3 (0-based) starts; the resume replays step 2,
whose regeneration first finishes that carried group. The resumed run must equal the straight one
(metrics bit for bit without ``time/`` keys, the final orchestrator state with its carried groups,
the final weights), and every no-hint play started is accounted for exactly once: trained in some
step, dropped as aborted, or still carried at the end. Subprocesses with hard timeouts; slow.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from test_resume_kills import STEPS, kill_when_step_starts  # noqa: F401
from test_train_loop import (RUN_TIMEOUT_S, checkpoint_tensors, graded_config, metrics, run_spade,  # noqa: F401
                             tiny_hf, train_config, without_time)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3 * RUN_TIMEOUT_S + 60)]


@pytest.fixture
def partial_config(graded_config, tmp_path) -> Path:
    text = graded_config.read_text()
    text = text.replace("selfplay:\n", "selfplay:\n  plays: {max_concurrent: 1}\n"
                        "  partial_rollouts: {enabled: true, complete_fraction: 0.5, max_carry_steps: 1}\n", 1)
    assert "partial_rollouts" in text and "\n  k: 2\n" in text and "g_nohint: 2" in text
    path = tmp_path / "partial.yaml"
    path.write_text(text)
    return path


def final_state(run: Path) -> dict:
    return json.loads((run / "checkpoints" / "step_4" / "trainer_state.json").read_text())["orchestrator"]


def test_carried_plays_survive_a_kill_and_resume(partial_config, tmp_path):
    straight = tmp_path / "straight"
    run_spade("--config", str(partial_config), "--run-dir", str(straight), *STEPS, env={"OMP_NUM_THREADS": "1"})
    records = metrics(straight)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    carried = [r["rollout/carried_over"] for r in records]
    assert carried == [0.0, 2.0, 0.0, 2.0]  # regenerations (0, 2) carry nothing out; the others one group
    state = final_state(straight)
    left = sum(len(g["finished"]) + len(g["unfinished"]) for g in state["carried"])
    started = 4 * 2 * 2  # steps x environments x g_nohint
    assert sum(r["rollout/completed"] + r["rollout/aborted"] for r in records) + left == started
    assert records[2]["rollout/completed"] == records[2]["agent/episodes"] + 2  # step 1's carried group

    run = tmp_path / "killed"
    kill_when_step_starts(partial_config, run, "step 3 (4/4) ")
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_2"
    saved = json.loads((run / "checkpoints" / "step_2" / "trainer_state.json").read_text())["orchestrator"]
    assert [len(g["unfinished"]) for g in saved["carried"]] == [2]  # what the resume must continue
    proc = run_spade("--resume", str(run), env={"OMP_NUM_THREADS": "1"})
    assert "resumed from" in proc.stderr
    assert without_time(metrics(run)) == without_time(records)
    assert final_state(run) == state
    final = {r: checkpoint_tensors(r / "checkpoints" / "step_4") for r in (straight, run)}
    assert set(final[straight]) == set(final[run])
    assert [k for k in final[straight] if not torch.equal(final[straight][k], final[run][k])] == []
