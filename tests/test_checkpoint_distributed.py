"""Checkpoints across parallel layouts: 2 gloo ranks under torchrun against this process at TP=1.

This process (a world of one) converts tiny HF models, saves them at TP=1 and records reference
logits and an uninterrupted TP=1 training run; ``tests/dist/checkpoint_worker.py`` then loads at
TP=2 and EP=2, and trains/saves/resumes at TP=2 and at DP=2 with the distributed optimizer. Back
here, the TP=2 and DP=2 checkpoints are resumed at TP=1 and continued for a step. ``spade score
--tp 2`` under torchrun is compared with scoring at TP=1.

Every torchrun runs as a subprocess with a hard timeout: a collective that never completes hangs.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import prewarmed
import pytest
import torch

import support.hf_fixtures as hx
from megatron_fixtures import ensure_megatron_world, free_port
from spade.models import ParallelLayout

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "dist" / "checkpoint_worker.py"
TIMEOUT = 180
LOGIT_TOL = 1e-5  # TP/EP sharding changes the summation order only
LOSS_TOL = 1e-5
# Parameters after two Adam steps (lr 1e-2) when step 1 ran at another layout: Adam divides by
# sqrt(v), which magnifies the rounding differences of step 1 (1.9e-5 measured); losing the
# optimizer state would move parameters by ~lr.
PARAM_TOL = 1e-4

pytestmark = pytest.mark.slow


def torchrun(*args: str, timeout: int = TIMEOUT) -> subprocess.CompletedProcess[str]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [*prewarmed.torchrun(), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def tp1_training_reference(hf_dir: Path, distributed_optimizer: bool) -> tuple[list[float], dict]:
    """Two uninterrupted steps at TP=1: losses and final HF-named parameters."""
    model, spec = hx.megatron_model(hf_dir, ParallelLayout())
    ddp, optimizer = hx.trainer(model, distributed_optimizer=distributed_optimizer)
    losses = [hx.train_step(ddp, optimizer, hx.batch(1)), hx.train_step(ddp, optimizer, hx.batch(2))]
    return losses, hx.hf_state(model, spec, ParallelLayout())


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    from spade.training.checkpoint import save_checkpoint

    ensure_megatron_world()
    work = tmp_path_factory.mktemp("layouts")
    ids = hx.batch(9, rows=2, length=10)
    reference = {"ids": ids}
    for kind, name in (("dense", "qwen3"), ("moe", "qwen3-moe")):
        hf_dir = hx.save_tiny_hf(name, work / f"hf-{kind}")
        model, _ = hx.megatron_model(hf_dir, ParallelLayout())
        save_checkpoint(work / f"ckpt-{kind}-tp1", [model], layout=ParallelLayout(),
                        hf_config=json.loads((hf_dir / "config.json").read_text()), tokenizer_dir=hf_dir)
        reference[kind] = hx.full_logits(model, ids)
    torch.save(reference, work / "reference.pt")
    return work


@pytest.fixture(scope="module")
def results(work) -> dict:
    done = torchrun(str(WORKER), str(work))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert done.stdout.count("OK rank") == 2, output[-6000:]
    return json.loads((work / "results.json").read_text())


def test_tp1_checkpoint_loads_at_tp2(results):
    assert results["tp2_saved_layout"] == [1, 1]
    assert results["tp2_logits_diff"] < LOGIT_TOL


def test_tp1_moe_checkpoint_loads_at_ep2(results):
    assert results["ep2_logits_diff"] < LOGIT_TOL


@pytest.mark.parametrize("name", ["tp2", "dp2-distopt"])
def test_resume_at_the_same_layout_is_exact(results, name):
    assert results[f"{name}_step"] == 1
    assert results[f"{name}_contents"] == ["model", "optimizer", "rng"]
    assert results[f"{name}_resumed_loss"] == results[f"{name}_continued_loss"]
    assert results[f"{name}_params_equal"]
    assert results[f"{name}_rng_equal"]


@pytest.mark.parametrize("name, distributed_optimizer", [("tp2", False), ("dp2-distopt", True)])
def test_resume_at_tp1_matches_an_uninterrupted_tp1_run(work, results, name, distributed_optimizer,
                                                         caplog):
    """Model + optimizer saved at TP=2 (plain optimizer: state resharded over TP) or at DP=2
    (distributed optimizer, dp_reshardable: resharded over DP), loaded at TP=1 x DP=1."""
    from spade.training.checkpoint import load_checkpoint

    hf_dir = work / "hf-dense"
    losses, expected = tp1_training_reference(hf_dir, distributed_optimizer)
    model, spec = hx.megatron_model(hf_dir, ParallelLayout(), load_weights=False, seed=3)
    ddp, optimizer = hx.trainer(model, distributed_optimizer=distributed_optimizer)
    with caplog.at_level("WARNING", logger="spade.training.rng_state"):
        info = load_checkpoint(work / f"ckpt-dense-{name}-step1", [ddp], optimizer=optimizer)
    assert info.step == 1
    assert info.layout == (ParallelLayout(tp=2) if name == "tp2" else ParallelLayout())
    assert "reseeded" in caplog.text  # RNG state of another layout is not restored

    # resharding is exact: parameters (and Adam moments) as the other layout saved them
    snapshot = torch.load(work / f"{name}-step1-snapshot.pt")
    loaded = hx.hf_state(model, spec, ParallelLayout())
    if not distributed_optimizer:
        loaded.update(hx.adam_moments(model, optimizer, spec, ParallelLayout()))
    assert loaded.keys() == snapshot.keys()
    assert [k for k in snapshot if not torch.equal(loaded[k], snapshot[k])] == []

    # and the next step is the uninterrupted run's, up to the other layout's rounding in step 1
    loss = hx.train_step(ddp, optimizer, hx.batch(2))
    assert abs(loss - losses[1]) < LOSS_TOL
    assert abs(loss - results[f"{name}_continued_loss"]) < LOSS_TOL
    state = hx.hf_state(model, spec, ParallelLayout())
    assert state.keys() == expected.keys()
    worst = max((state[k] - expected[k]).abs().max().item() for k in state)
    assert worst < PARAM_TOL, worst


def test_score_tp2_under_torchrun_matches_tp1(work, tmp_path):
    """``spade score --tp 2`` on the MoE checkpoint saved at TP=1 vs. scoring it here at TP=1."""
    from spade.cli.score import load_model, resolve_model, score_batch

    sequences = [hx.batch(s, rows=1, length=n)[0].tolist() for s, n in ((1, 9), (2, 4), (3, 13))]
    lines = [json.dumps({"token_ids": s}) for s in sequences]
    lines.insert(1, json.dumps({"text": "the cat sat on the mat"}))
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    done = torchrun("-m", "spade", "score", "--tp", "2", "--model", str(work / "ckpt-moe-tp1"),
                    "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl"),
                    "--batch-tokens", "20")
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    scored = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(scored) == 4

    ensure_megatron_world()
    source = resolve_model(str(work / "ckpt-moe-tp1"))
    model, spec = load_model(source, ParallelLayout())
    for item in scored:
        (expected,) = score_batch(model, [item["token_ids"]], spec.vocab_size)
        assert item["logprobs"][0] is None and expected[0] is None
        worst = max(abs(a - b) for a, b in zip(item["logprobs"][1:], expected[1:]))
        assert worst < 1e-5, worst
