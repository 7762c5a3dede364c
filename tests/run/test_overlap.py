"""One step off policy (``run.overlap: 1``, issue 26): ``spade train`` on the tiny model, the hf
engine and the real sandbox, 4 steps with a checkpoint every 2.

With overlap the rollout of step t+1 runs while step t trains, on the weights step t started from,
and is trained on by step t+1: every sample of steps 1-3 is exactly one weight version behind the
policy it updates (``train/policy_lag_*``), step 0's none. The checkpoint after step 2 holds step 2's
rollout, played and not yet trained on; a run killed while step 3 (1-based 4/4) trains resumes from
it and must equal the straight run (metrics bit for bit without ``time/`` keys, final weights).
Subprocesses with hard timeouts; slow.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from spade.config import ConfigError
from test_resume_kills import STEPS, kill_when_step_starts  # noqa: F401
from test_train_loop import (PARAM_TOL, RUN_TIMEOUT_S, assert_same_metrics, checkpoint_tensors,  # noqa: F401
                             graded_config, metrics, run_spade, tiny_hf, train_config, without_engine_keys,
                             without_time)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3 * RUN_TIMEOUT_S + 60)]


@pytest.fixture(scope="module")
def overlap_config(graded_config, tmp_path_factory) -> Path:
    text = graded_config.read_text().replace("run: {steps: 2,", "run: {overlap: 1, steps: 2,", 1)
    assert "overlap: 1" in text
    path = tmp_path_factory.mktemp("overlap") / "overlap.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def overlap_straight(overlap_config, tmp_path_factory) -> Path:
    """4 steps with overlap on the hf engine, straight."""
    straight = tmp_path_factory.mktemp("overlap_straight") / "run"
    run_spade("--config", str(overlap_config), "--run-dir", str(straight), *STEPS, env={"OMP_NUM_THREADS": "1"})
    return straight


def test_overlap_trains_one_step_off_policy_and_resumes_exactly(overlap_config, overlap_straight, tmp_path):
    straight = overlap_straight
    records = metrics(straight)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all(r["train/samples"] > 0 and r["train/grad_norm"] > 0 for r in records)
    assert records[0]["train/policy_lag_max"] == 0.0
    for r in records[1:]:  # every sample one version behind, none older
        assert (r["train/policy_lag_mean"], r["train/policy_lag_max"]) == (1.0, 1.0)
        assert r["train/policy_lag_count/1"] == r["train/samples"]
    saved = json.loads((straight / "checkpoints" / "step_2" / "trainer_state.json").read_text())
    assert saved["ready_rollout"]["step"] == 2 and saved["ready_rollout"]["samples"]
    last = json.loads((straight / "checkpoints" / "step_4" / "trainer_state.json").read_text())
    assert "ready_rollout" not in last  # the last step plays nothing beyond run.steps

    run = tmp_path / "killed"
    kill_when_step_starts(overlap_config, run, "step 3 (4/4) training")
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_2"
    proc = run_spade("--resume", str(run), env={"OMP_NUM_THREADS": "1"})
    assert "resumed from" in proc.stderr
    assert without_time(metrics(run)) == without_time(records)
    final = {r: checkpoint_tensors(r / "checkpoints" / "step_4") for r in (straight, run)}
    assert set(final[straight]) == set(final[run])
    assert [k for k in final[straight] if not torch.equal(final[straight][k], final[run][k])] == []


def test_overlap_values_and_sglang_are_refused_by_name():
    from spade.train_config import TrainConfig, from_dict

    with pytest.raises(ConfigError, match=r"run\.overlap.*allowed: 0 .* or 1"):
        from_dict({"run": {"overlap": 2}})
    with pytest.raises(ConfigError, match=r"run\.overlap.*colocated SGLang.*allowed: engine\.kind: hf, or "
                                          r"disaggregated servers"):
        from_dict({"run": {"overlap": 1}, "engine": {"kind": "sglang"}})
    disaggregated = {"kind": "sglang", "sglang": {"urls": ["http://10.0.0.2:30000"]}}
    assert from_dict({"run": {"overlap": 1}, "engine": disaggregated}).run.overlap == 1
    assert from_dict({"run": {"overlap": 1}}).run.overlap == 1  # the hf engine
    assert TrainConfig().run.overlap == 0


def test_overlap_on_disaggregated_sglang_servers(overlap_config, overlap_straight, tmp_path):
    """``engine.sglang.urls`` (servers spade did not launch; here the tests' stand-in, SGLang needs
    a GPU): the server keeps taking requests through every update (no release, admission never
    closed: step t+1's rollout runs while step t trains) and gets the new weights by broadcast at
    the step boundary, after that rollout is done. The run equals the hf engine's overlap run
    (the stand-in samples as the hf engine does): same play and lag metrics, ``train/`` within the
    distributed tolerance, same final weights."""
    from sglang_standin import standin_launcher

    hf_dir = next(line for line in overlap_config.read_text().splitlines() if "hf_dir" in line)
    hf_dir = hf_dir.split("hf_dir:", 1)[1].split(",")[0].strip()
    log_path = tmp_path / "external.log"
    run = tmp_path / "run"

    async def play() -> None:
        server = standin_launcher(hf_dir, log_path=log_path)
        await server.start()
        try:
            await asyncio.to_thread(run_spade, "--config", str(overlap_config), "--run-dir", str(run), *STEPS,
                                    "engine.kind=sglang", f"engine.sglang.urls=[{server.url}]",
                                    env={"OMP_NUM_THREADS": "1"})
        finally:
            await server.close()

    asyncio.run(play())
    records = metrics(run)
    for r in records[1:]:
        assert (r["train/policy_lag_mean"], r["train/policy_lag_max"]) == (1.0, 1.0)
    assert_same_metrics(metrics(overlap_straight), without_engine_keys(records))
    final = {r: checkpoint_tensors(r / "checkpoints" / "step_4") for r in (overlap_straight, run)}
    keys = [k for k in final[run] if k.startswith(("embedding.", "decoder.", "output_layer."))]
    assert keys and max((final[run][k].double() - final[overlap_straight][k].double()).abs().max().item()
                        for k in keys) <= PARAM_TOL
    log = log_path.read_text()
    assert log.count("/update_weights_from_distributed -> 200") >= 4
    assert "/release_memory_occupation" not in log and "/pause_generation" not in log
