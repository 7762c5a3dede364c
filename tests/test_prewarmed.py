"""tests/prewarmed.py, the suite's runner of ``spade`` commands forked from a prewarmed interpreter:
what a command sees and returns is what a fresh ``python -m spade`` process sees and returns."""

from __future__ import annotations

import os
import subprocess
import sys

import prewarmed
from conftest import ROOT

CONFIG = "model: {hf_dir: /nonexistent/model, dtype: float32}\nrun: {steps: 3, seed: 11}\n"


def fresh(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spade", *args], capture_output=True, text=True, timeout=120,
                          **kwargs)


def test_a_forked_command_prints_and_exits_as_a_fresh_process(tmp_path):
    (tmp_path / "mine.yaml").write_text(CONFIG)
    args = ["train", "--config", "mine.yaml", "--check", "run.log_every=5"]  # relative: the working directory
    forked = prewarmed.run(args, cwd=tmp_path, timeout=120)
    assert forked.args == [sys.executable, "-m", "spade", *args]
    assert prewarmed._zygote is not None and prewarmed._zygote.process.poll() is None  # it went through the zygote
    expected = fresh(args, cwd=tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (expected.returncode, expected.stdout,
                                                                 expected.stderr)
    assert forked.returncode == 0 and "log_every: 5" in forked.stdout and "seed: 11" in forked.stdout

    refused = prewarmed.run(["train", "--config", "missing.yaml"], cwd=tmp_path, timeout=120)
    assert refused.returncode == 2 and "missing.yaml" in refused.stderr and refused.stdout == ""


def test_the_command_gets_its_own_environment_and_standard_input(tmp_path):
    """argparse wraps ``--help`` at the width in COLUMNS: the child reads the environment it was given."""
    narrow, wide = ({**os.environ, "COLUMNS": str(width)} for width in (60, 200))
    forked = prewarmed.run(["train", "--help"], env=narrow, input="ignored\n", timeout=120)
    assert forked.returncode == 0
    assert forked.stdout == fresh(["train", "--help"], env=narrow, input="ignored\n").stdout
    assert forked.stdout != prewarmed.run(["train", "--help"], env=wide, timeout=120).stdout
    assert max(len(line) for line in forked.stdout.splitlines()) <= 60


def test_only_environments_read_at_import_time_send_a_command_to_a_fresh_interpreter():
    zygote = prewarmed._get_zygote()
    assert zygote is not None
    same = dict(zygote.env)
    assert zygote.serves(same)
    assert zygote.serves({**same, "SPADE_SOMETHING": "1", "OMP_NUM_THREADS": "1"})  # read at run time / applied
    assert not zygote.serves({**same, "PYTHONHASHSEED": "123"})
    assert not zygote.serves({**same, "PYTHONPATH": str(ROOT / "elsewhere")})
    assert not zygote.serves({key: value for key, value in same.items() if key != "PATH"} | {"CUDA_VISIBLE_DEVICES": ""})

