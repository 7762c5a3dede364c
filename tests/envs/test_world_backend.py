"""Which collective backend a world is made on: NCCL where CUDA is, gloo elsewhere, for spade's
ranks and for the tests' single-process Megatron world alike. Megatron's DDP issues coalesced
collectives on CUDA tensors, which gloo refuses (all-reduce) or has no CUDA path for (all-gather),
so a GPU test built on gloo fails at its first gradient reduction.

This machine has no CUDA: the test reports CUDA available to a fresh interpreter and records the
backend ``init_process_group`` is asked for (the real call then runs on gloo, the only backend
that can start here). The GPU tests themselves run the real NCCL world (tools/device_check.sh).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PRETEND_CUDA = """
import json, sys
import torch, torch.distributed as dist
import megatron_patches
megatron_patches.apply_all()  # as on CPU: the fixture's own call is then a no-op
asked = []
real = dist.init_process_group
def recording(backend, *args, **kwargs):
    asked.append(backend)
    return real("gloo", *args, **kwargs)
dist.init_process_group = recording
torch.cuda.is_available = lambda: True
torch.cuda.set_device = lambda device: asked.append(f"set_device({device})")
from spade.training.parallel import default_backend
import megatron_fixtures
try:
    megatron_fixtures.ensure_megatron_world()
except Exception as exc:  # megatron's own CUDA calls past the world: not what is under test
    pass
print(json.dumps({"default": default_backend(), "asked": asked}))
"""


def test_the_tests_megatron_world_uses_nccl_where_cuda_is():
    child = subprocess.run([sys.executable, "-c", PRETEND_CUDA], cwd=ROOT / "tests", capture_output=True, text=True,
                           timeout=240, env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"})
    assert child.returncode == 0, child.stderr[-3000:]
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    assert seen["default"] == "nccl"
    assert seen["asked"][:2] == ["set_device(0)", "nccl"], seen


def test_without_cuda_the_world_is_gloo():
    from spade.training.parallel import default_backend

    assert default_backend() == "gloo"
