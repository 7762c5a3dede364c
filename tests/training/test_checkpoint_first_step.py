"""Checkpoints saved before the optimizer's first step, under ``torchrun --nproc_per_node 2``
(gloo): TP=2 with the plain optimizer and DP=2 with the distributed optimizer resume exactly at
their layout, and the TP=2 one also at TP=1 here, equal to a fresh start. The torchrun runs as a
subprocess with a hard timeout (a collective that never completes hangs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import support.hf_fixtures as hx
from megatron_fixtures import ensure_megatron_world
from spade.models import ParallelLayout
from test_checkpoint_distributed import ROOT, torchrun

WORKER = ROOT / "tests" / "dist" / "checkpoint_first_step_worker.py"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("first-step")
    hx.save_tiny_hf("qwen3", work / "hf-dense")
    done = torchrun(str(WORKER), str(work))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert done.stdout.count("OK rank") == 2, output[-6000:]
    return work


@pytest.mark.parametrize("name", ["tp2", "dp2-distopt"])
def test_resume_from_before_the_first_step_at_the_same_layout_is_exact(work, name):
    results = json.loads((work / "results.json").read_text())
    assert results[f"{name}_optimizer_state"] is False and results[f"{name}_step"] == 0
    assert results[f"{name}_resumed_losses"] == results[f"{name}_continued_losses"]
    assert results[f"{name}_params_equal"] and results[f"{name}_rng_equal"]
    assert results[f"{name}_problems"] == []
    assert results["children"] == [[], []]  # no writer, Manager or resource tracker on any rank


def test_both_ranks_files_are_in_the_manifest(work):
    results = json.loads((work / "results.json").read_text())
    assert results["dp2-distopt_distcp_ranks"] == ["0", "1"]  # __<rank>_<n>.distcp of each writer


def test_tp2_checkpoint_from_before_the_first_step_resumes_at_tp1(work):
    from spade.training.checkpoint import load_checkpoint

    ensure_megatron_world()
    hf_dir = work / "hf-dense"
    model, spec = hx.megatron_model(hf_dir, ParallelLayout())
    ddp, optimizer = hx.trainer(model)
    losses = [hx.train_step(ddp, optimizer, hx.batch(1)), hx.train_step(ddp, optimizer, hx.batch(2))]
    expected = hx.hf_state(model, spec, ParallelLayout())

    fresh, _ = hx.megatron_model(hf_dir, ParallelLayout(), load_weights=False, seed=3)
    fresh_ddp, fresh_optimizer = hx.trainer(fresh)
    info = load_checkpoint(work / "ckpt-tp2-step0", [fresh_ddp], optimizer=fresh_optimizer)
    assert info.layout == ParallelLayout(tp=2)
    resumed = [hx.train_step(fresh_ddp, fresh_optimizer, hx.batch(1)),
               hx.train_step(fresh_ddp, fresh_optimizer, hx.batch(2))]
    assert max(abs(a - b) for a, b in zip(resumed, losses)) < 1e-5  # TP=2 vs TP=1 rounding only
    state = hx.hf_state(fresh, spec, ParallelLayout())
    assert max((state[k] - expected[k]).abs().max().item() for k in expected) < 1e-4
