"""``Learner.build`` under torchrun (2 ranks, gloo, CPU): each rank reads only its part of the HF
checkpoint and its parameters equal the full-read shards (issue 21, fault 5).

``tests/dist/rank_read_worker.py`` counts the bytes each rank takes from the safetensors files
(``safetensors.safe_open`` wrapped). Before the fix every rank read the whole checkpoint.
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

from support.hf_fixtures import save_tiny_hf

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "dist" / "rank_read_worker.py"
TIMEOUT_S = 180

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(hf_dir: Path, layout: str, out_dir: Path) -> dict[int, dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [*prewarmed.torchrun(), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
           str(free_port()), str(WORKER), "--hf-dir", str(hf_dir), "--layout", layout, "--out-dir", str(out_dir)]
    process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"rank_read_worker {layout} did not finish within {TIMEOUT_S} s\n{output[-6000:]}")
    if process.returncode != 0:
        pytest.fail(f"rank_read_worker {layout} exited with {process.returncode}\n{output[-8000:]}")
    found = {}
    for path in sorted(out_dir.glob("rank*.json")):
        result = json.loads(path.read_text())
        found[result["rank"]] = result
    assert sorted(found) == [0, 1], output[-4000:]
    return found


@pytest.mark.parametrize("name,layout", [("qwen3", "tp2"), ("llama-tied", "pp2")])
def test_learner_build_reads_only_this_ranks_part(tmp_path, name, layout):
    hf_dir = save_tiny_hf(name, tmp_path / name)
    out_dir = tmp_path / "results"
    out_dir.mkdir()
    for rank, result in launch(hf_dir, layout, out_dir).items():
        assert result["same_names"] and not result["mismatched"], (rank, result)
        # the rank's shards (vocabulary padding rows are zeros, not read) and nothing else
        assert 0 < result["bytes_read"] <= result["shard_bytes"], (rank, result)
        assert result["bytes_read"] < 0.8 * result["checkpoint_bytes"], (rank, result)
