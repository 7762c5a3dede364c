"""``spade train --resume`` of a run whose optimizer never stepped (issue 12).

A fixed pool whose only environment fails admission gives no samples, so every step skips the
update (as the smoke config does when the designer gets nothing admitted) and each checkpoint
holds an optimizer without state, which megatron-core 0.16.1 could not load. 2 steps, then
``--resume run.steps=3``: exits 0 and continues with step 2. Subprocesses with hard timeouts.
"""

from __future__ import annotations

import json
import subprocess

import prewarmed
import pytest

from test_no_orphans import ROOT, tiny_config  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def spade_train(*args: str) -> subprocess.CompletedProcess:
    return prewarmed.run(["train", *args], cwd=ROOT, timeout=280)


def test_a_run_that_never_updated_resumes(tiny_config, tmp_path):  # noqa: F811
    envs = tmp_path / "envs"
    envs.mkdir()
    (envs / "broken.py").write_text("class BrokenEnv:\n    def reset(self, seed=None:\n        pass\n")
    run = tmp_path / "run"
    first = spade_train("--config", str(tiny_config), "--run-dir", str(run), "run.steps=2",
                        f"selfplay.fixed_env_dir={envs}")
    assert first.returncode == 0, first.stderr[-4000:]
    info = json.loads((run / "checkpoints" / "step_2" / "spade_checkpoint.json").read_text())
    assert info.get("optimizer_state", False) is False  # the case under test: no update happened yet
    resumed = spade_train("--resume", str(run), "run.steps=3")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_3"
