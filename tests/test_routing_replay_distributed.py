"""Routing replay under EP2 (2 ranks) and TP2 x EP2 with sequence parallelism (4 ranks) against
EP1 (one process), with ``tests/dist/routing_replay_worker.py`` under torchrun and a hard timeout.

With replay every layout must give the one-process log-probs, gradients and router agreement:
each rank's routers get the rows of its own tokens (its sequence chunk under sequence
parallelism, before the expert all-to-all). The one-process replay itself is checked against the
engine's routing in test_routing_replay.py; here the replayed log-probs must also differ from the
trainer's own routing (the perturbation moved some decisions, so a replay that did nothing fails).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import prewarmed
import pytest
import torch

from megatron_fixtures import free_port

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "dist" / "routing_replay_worker.py"
TIMEOUT_S = 240
TOL = 1e-5
CASES = {"ep2": 2, "tp2_ep2": 4}

pytestmark = pytest.mark.slow


def start(cmd: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def finish(process: subprocess.Popen, what: str) -> list[dict]:
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{what} did not finish within {TIMEOUT_S} s (hung collective?)\n{output[-6000:]}")
    if process.returncode != 0:
        pytest.fail(f"{what} exited with {process.returncode}\n{output[-8000:]}")
    return [json.loads(line[len("RESULT "):]) for line in output.splitlines() if line.startswith("RESULT ")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("routing_replay")
    reference = start([prewarmed.python(), str(WORKER), "--reference", "--out", str(out)])
    results = {"reference": finish(reference, "routing_replay_worker.py --reference")}
    for case, ranks in CASES.items():
        process = start([*prewarmed.torchrun(), "--nproc_per_node", str(ranks), "--master_addr", "127.0.0.1",
                         "--master_port", str(free_port()), str(WORKER), "--out", str(out), "--case", case])
        results[case] = finish(process, f"torchrun {case}")
        assert len(results[case]) == ranks
    return out, results


def merged(out: Path, mode: str, key: str) -> dict:
    total: dict = {}
    for path in sorted(out.glob(f"{mode}.rank*.pt")):
        for k, tensor in torch.load(path)[key].items():
            if k in total:
                torch.testing.assert_close(tensor, total[k], atol=TOL, rtol=0, msg=f"{mode}: ranks disagree on {k}")
            else:
                total[k] = tensor
    return total


@pytest.mark.parametrize("case", list(CASES))
def test_replayed_logprobs_gradients_and_agreement_equal_one_process(runs, case):
    out, results = runs
    expected = merged(out, "reference", "logprobs_replay")
    own = merged(out, "reference", "logprobs_own")
    got = merged(out, case, "logprobs_replay")
    assert sorted(got) == sorted(expected) == list(range(4))
    assert any((expected[i] - own[i]).abs().max() > 1e-3 for i in expected)  # replay changed something
    for index, values in expected.items():
        torch.testing.assert_close(got[index], values, atol=TOL, rtol=0, msg=f"{case} sample {index}")
    expected_grads, grads = merged(out, "reference", "grads"), merged(out, case, "grads")
    assert grads.keys() == expected_grads.keys()
    for name, tensor in expected_grads.items():
        torch.testing.assert_close(grads[name], tensor, atol=TOL, rtol=1e-4, msg=f"{case}: gradient of {name}")
    reference_agreement = results["reference"][0]["agreement"]
    assert 0.5 < reference_agreement < 1.0
    for rank_result in results[case]:
        assert rank_result["agreement"] == pytest.approx(reference_agreement, abs=1e-12)
