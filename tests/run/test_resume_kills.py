"""Kill -9 at more moments than ``test_train_loop``'s (just after ``latest`` moved), then resume;
the resumed run must equal the straight one (metrics bit for bit without ``time/`` keys, with
``engine.max_batch_size: 1``; the final weights bit for bit).

Both runs have 4 steps and ``run.checkpoint_every: 2`` and are killed when step 4 (0-based 3)
starts, found by its progress line: step 3's metrics line is written, the newest checkpoint is
``step_2``. The resume must drop that line (metrics truncation) and replay steps 2 and 3.

* fixed pool (the graded game, a real gradient): the kill falls after a metrics line and before
  the next checkpoint;
* designer on (``selfplay.k: 1``, a regeneration every step; the memory seeded with
  examples/seed_envs): the kill falls as step 3's regeneration starts; the resumed memory must
  equal the straight run's (rolled back, not seeded twice). The tiny random model admits nothing
  (its 1,024-token context cannot even hold the seeded designer prompt), so neither admitted
  memory records nor designer samples in the delay buffer are exercised here;
* external designer (``selfplay.designer_endpoint`` on a canned OpenAI-compatible server in this
  process, the real client and admission; ``k: 2``): every regeneration admits environments, so the
  checkpoint at step 2 holds memory records and pending designer entries of step 0 that the replayed
  step 2 must release (the delay buffer restored), and step 2's records are rolled back.

Subprocesses with hard timeouts; slow (about a minute each on 2 cores).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

import torch

from test_train_loop import (ROOT, RUN_TIMEOUT_S, checkpoint_tensors, graded_config, metrics, run_spade,  # noqa: F401
                             spade_cmd, tiny_hf, train_config, without_time)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3 * RUN_TIMEOUT_S + 60)]

STEPS = ("run.steps=4", "run.checkpoint_every=2")


@pytest.fixture(scope="module")
def designer_config(train_config, tmp_path_factory) -> Path:
    """The tiny config with the designer on: the random model writes the environments (rejected,
    each a designer sample), the seed examples in its prompts, a regeneration every step."""
    text = train_config.read_text()
    pool = next(line for line in text.splitlines() if "fixed_env_dir:" in line)
    text = text.replace(pool + "\n", f"  memory_seed_dir: {ROOT / 'examples' / 'seed_envs'}\n")
    text = text.replace("designer_enabled: false", "designer_enabled: true").replace("\n  k: 2\n", "\n  k: 1\n")
    assert "memory_seed_dir" in text and "k: 1" in text and "designer_enabled: true" in text
    path = tmp_path_factory.mktemp("designer_cfg") / "designer.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def external_designer_config(designer_config, tmp_path):
    """The designer config with the designer served by a canned endpoint (not trained), k 2."""
    from test_external_designer import MODEL, CannedEndpoint

    server = CannedEndpoint(key=None)
    text = designer_config.read_text().replace("\n  k: 1\n", "\n  k: 2\n")
    text = text.replace("selfplay:\n", "selfplay:\n  train_designer: false\n"
                        "  no_corpus_prompt: corpus_without_document\n"  # the system prompt the server answers
                        f"  designer_endpoint: {{url: '{server.url}', model: {MODEL}, api_key_env: null, backoff_s: 0.0}}\n")
    assert "k: 2" in text and "designer_endpoint" in text
    path = tmp_path / "external.yaml"
    path.write_text(text)
    yield path
    server.close()


def memory_records(run: Path) -> list[tuple]:
    with sqlite3.connect(run / "memory.sqlite") as db:
        return db.execute("SELECT env_id, skill, step, win_rate, regret, source, hint FROM records ORDER BY seq").fetchall()


def kill_when_step_starts(config: Path, run: Path, step_line: str) -> str:
    """Start a run, SIGKILL its process group once stderr shows ``step_line``; the stderr so far."""
    proc = subprocess.Popen(spade_cmd("--config", str(config), "--run-dir", str(run), *STEPS), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    seen = []
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S  # the line arrives or the run ends: no window
        for line in proc.stderr:
            seen.append(line)
            if step_line in line:
                os.killpg(proc.pid, signal.SIGKILL)
                break
            assert time.monotonic() < deadline, "".join(seen)[-3000:]
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, f"the run ended before it was killed:\n{''.join(seen)[-3000:]}"
    return "".join(seen)


@pytest.mark.parametrize("kind", ["fixed pool", "designer", "external designer"])
def test_kill_between_checkpoints_then_resume(kind, graded_config, designer_config, request, tmp_path):  # noqa: F811
    config = {"fixed pool": graded_config, "designer": designer_config}.get(kind) \
        or request.getfixturevalue("external_designer_config")
    straight = tmp_path / "straight"
    run_spade("--config", str(config), "--run-dir", str(straight), *STEPS, env={"OMP_NUM_THREADS": "1"})
    records = metrics(straight)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    if kind == "designer":  # what the resume must restore is there
        assert all(r["designer/attempts"] > 0 for r in records), records
    if kind == "external designer":  # admitted at both regenerations; step 2 releases step 0's entries
        assert records[0]["env/admitted"] > 0 and records[2]["env/admitted"] > 0, records
        assert records[2]["designer/released"] == records[0]["env/admitted"] and "designer/reward_mean" in records[2]
        assert records[1]["designer/pending"] == records[0]["env/admitted"]

    run = tmp_path / "killed"
    kill_when_step_starts(config, run, "step 3 (4/4) ")
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_2"
    assert [r["step"] for r in metrics(run)] == [0, 1, 2]  # a line the checkpoint does not cover
    proc = run_spade("--resume", str(run), env={"OMP_NUM_THREADS": "1"})
    assert "resumed from" in proc.stderr
    assert without_time(metrics(run)) == without_time(records)
    final = {r: checkpoint_tensors(r / "checkpoints" / "step_4") for r in (straight, run)}
    model_keys = [k for k in final[straight] if k.startswith(("embedding.", "decoder.", "output_layer."))]
    assert model_keys and set(final[straight]) == set(final[run])
    assert [k for k in final[straight] if not torch.equal(final[straight][k], final[run][k])] == []
    assert memory_records(run) == memory_records(straight)  # rolled back, not seeded twice
    if kind == "fixed pool":  # steps 2-3 (the replayed ones) moved the weights: not a vacuous comparison
        middle = checkpoint_tensors(straight / "checkpoints" / "step_2")
        assert any(not torch.equal(middle[k], final[straight][k]) for k in model_keys)
