"""The Megatron train path under two-rank layouts against a one-rank TP1 reference.

``tests/dist/train_worker.py`` runs every case twice: once under ``torchrun --nproc_per_node 2``
(gloo; TP2, TP2 + sequence parallel, PP2, DP2, DP2 + distributed optimizer, EP2 and TP2 for MoE,
several cases per launch), once as a plain single process (TP1, one micro-batch for the whole
batch). Both launches run under a hard timeout: a hung collective fails the test instead of
hanging it. Tiny random models (2 layers, hidden 64, fp32) with fixed seeds.

Compared per case: the samples' log-probs, the loss metrics of one forward/backward, the
gradients (exported under HF names through the weight map, so TP shards, pipeline stages and
expert ranks merge into full tensors) and, where the case trains, the losses of 3 Adam steps.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import prewarmed
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "dist" / "train_worker.py"
TIMEOUT_S = 180
TOL = 1e-5

pytestmark = pytest.mark.slow

# name: (computes gradients, trains 3 steps) -- must agree with CASES in the worker
CASES = {
    "tp2": (True, True),
    "tp2_sp": (True, False),
    "pp2": (True, True),
    "pp2_tied": (True, False),
    "dp2": (True, True),
    "dp2_turns": (True, False),  # sample_mean over per-turn samples weighted as episodes
    "dp2_distopt": (False, True),
    "moe_ep2": (True, False),
    "moe_tp2": (True, False),
}
TRAINING_CASES = [name for name, (_, trains) in CASES.items() if trains]
GRADIENT_CASES = [name for name, (grads, _) in CASES.items() if grads]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(cmd: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    # A session of its own, so that a timeout can kill torchrun and its workers together.
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def finish(process: subprocess.Popen, what: str) -> str:
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{what} did not finish within {TIMEOUT_S} s (hung collective?)\n{output[-6000:]}")
    if process.returncode != 0:
        pytest.fail(f"{what} exited with {process.returncode}\n{output[-8000:]}")
    return output


def results(output: str) -> dict[tuple[str, int], dict]:
    out = {}
    for line in output.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            out[(result["case"], result["rank"])] = result
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both launches, run side by side; returns (out_dir, reference results, parallel results)."""
    out = tmp_path_factory.mktemp("train_worker")
    cases = ",".join(CASES)
    reference = start([prewarmed.python(), str(WORKER), "--reference", "--out", str(out), "--cases", cases])
    port = free_port()
    parallel = start([*prewarmed.torchrun(), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                      "--master_port", str(port), str(WORKER), "--out", str(out), "--cases", cases])
    parallel_output = finish(parallel, "torchrun --nproc_per_node 2 train_worker.py")
    reference_output = finish(reference, "train_worker.py --reference")
    ref, par = results(reference_output), results(parallel_output)
    for name in CASES:
        assert (name, 0) in ref, f"no reference result for {name}\n{reference_output[-4000:]}"
        assert (name, 0) in par and (name, 1) in par, f"missing rank results for {name}\n{parallel_output[-4000:]}"
    return out, ref, par


def merged(out: Path, name: str, mode: str, key: str) -> dict:
    """Union over ranks of one saved dict; entries present on several ranks must agree."""
    total: dict = {}
    for path in sorted(out.glob(f"{name}.{mode}.rank*.pt")):
        for k, tensor in torch.load(path)[key].items():
            if k in total:
                torch.testing.assert_close(tensor, total[k], atol=TOL, rtol=0, msg=f"{name}: ranks disagree on {k}")
            else:
                total[k] = tensor
    return total


@pytest.mark.parametrize("name", list(CASES))
def test_logprobs_match_reference(runs, name):
    out, _, _ = runs
    expected = merged(out, name, "reference", "logprobs")
    got = merged(out, name, "parallel", "logprobs")
    assert sorted(got) == sorted(expected) == list(range(8))
    for index, values in expected.items():
        torch.testing.assert_close(got[index], values, atol=TOL, rtol=0, msg=f"{name} sample {index}")


@pytest.mark.parametrize("name", list(CASES))
def test_loss_metrics_match_reference(runs, name):
    _, ref, par = runs
    expected = ref[(name, 0)]["summary"]
    for rank in (0, 1):
        got = par[(name, rank)]["summary"]
        for key in ("loss_tokens", "tokens", "samples"):
            assert got[key] == expected[key], (name, rank, key)
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, abs=TOL), (name, rank, key)


@pytest.mark.parametrize("name", GRADIENT_CASES)
def test_gradients_match_reference(runs, name):
    out, _, _ = runs
    expected = merged(out, name, "reference", "grads")
    got = merged(out, name, "parallel", "grads")
    assert got.keys() == expected.keys()
    for key, tensor in expected.items():
        torch.testing.assert_close(got[key], tensor, atol=TOL, rtol=1e-4, msg=f"{name}: gradient of {key}")
    assert any(t.abs().max() > 1e-3 for t in expected.values())  # gradients are not trivially zero


@pytest.mark.parametrize("name", TRAINING_CASES)
def test_optimizer_steps_match_reference_and_lower_the_loss(runs, name):
    _, ref, par = runs
    expected = ref[(name, 0)]["losses"]
    assert len(expected) == 3 and expected[-1] < expected[0] - 0.05
    for rank in (0, 1):
        assert par[(name, rank)]["losses"] == pytest.approx(expected, abs=TOL), (name, rank)
        # the norm that clipping uses counts every shard once, whatever the layout
        assert par[(name, rank)]["grad_norms"] == pytest.approx(ref[(name, 0)]["grad_norms"], rel=1e-5), (name, rank)


@pytest.mark.parametrize("name", list(CASES))
def test_every_rank_streams_the_whole_model_for_weight_sync(runs, name):
    """all_hf_weights: TP shards gathered and, under EP, the other ranks' experts, under PP the
    other stages' tensors, so every rank holds exactly the single-process model (what a colocated
    server worker is fed)."""
    out, _, _ = runs
    expected = torch.load(out / f"{name}.reference.rank0.pt")["full_weights"]
    assert expected
    for rank in (0, 1):
        got = torch.load(out / f"{name}.parallel.rank{rank}.pt")["full_weights"]
        assert sorted(got) == sorted(expected), (name, rank)
        for key, tensor in expected.items():
            assert torch.equal(got[key], tensor), (name, rank, key)


def test_split_and_layout_do_not_change_the_loss(runs):
    """The train cases share model and samples: every layout gives the same per-step losses, and
    the split cases really did use several micro-batches per rank."""
    _, ref, par = runs
    baseline = ref[("tp2", 0)]["losses"]
    for name in TRAINING_CASES:
        assert ref[(name, 0)]["losses"] == pytest.approx(baseline, abs=TOL)
        assert par[(name, 0)]["losses"] == pytest.approx(baseline, abs=TOL), name
    assert par[("dp2", 0)]["micro_batches"] > 1 and par[("pp2", 0)]["micro_batches"] > 1
    assert ref[("dp2", 0)]["micro_batches"] == 1
    assert {par[("dp2", r)]["dp_rank"] for r in (0, 1)} == {0, 1}
    # uneven micro-batch counts over data-parallel ranks: the short rank runs a filler
    # micro-batch so that every expert-parallel all-to-all has both ranks
    assert par[("moe_ep2", 0)]["micro_batches"] != par[("moe_ep2", 1)]["micro_batches"]
