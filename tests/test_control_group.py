"""Control messages between training ranks outlive the default process group's timeout.

While rank 0 runs rollouts and evaluation the other ranks wait for its next command (the step's
samples, or "restart a server and re-send the weights"); in a real run that wait lasts as long as
the rollout phase. On GPUs the default group is NCCL with a 30-minute watchdog, so the wait must
not be a collective of the default group: the control messages go over a gloo group with a long
timeout that ``init_parallel`` makes. Here two gloo ranks (tests/dist/control_worker.py) run with
a default-group timeout of ``TIMEOUT_S`` while rank 0 takes ``DELAY_S`` before each command; rank 1
must get the right samples, serve a recovery (restart + CUDA-IPC weight update, whose barrier it
waits in while rank 0 posts to the server), and take part in a weight publish, in which rank 0
resumes the servers' KV cache only after rank 1's parameters have left the device. The worker
also checks the premise: a lone wait on the default group does time out.

The worker runs as a subprocess with a hard timeout: a collective that never completes hangs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "dist" / "control_worker.py"
TIMEOUT_S = 2.0  # the default group's timeout in the worker
DELAY_S = 3.5  # what rank 0 takes before each command: longer than TIMEOUT_S
SCENARIOS = ("samples", "recover", "publish", "barrier", "premise")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_ranks_waiting_for_rank_0_outlive_the_default_group_timeout(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(WORKER), str(tmp_path), str(TIMEOUT_S), str(DELAY_S)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=180)
    results = {}
    for rank in (0, 1):
        path = tmp_path / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote nothing:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        results[rank] = json.loads(path.read_text())
    for rank, result in results.items():
        assert "setup" not in result, result["setup"]
        for name in SCENARIOS:
            assert result.get(name) == "ok", f"rank {rank}, {name}: {result.get(name)}"
