"""``spade memory list/show`` as a user runs it: real subprocesses, output formats and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spade.designer.memory import Memory, MemoryRecord, memory_path

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"env_id", "skill", "step", "win_rate", "regret", "class_name"}


def spade(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spade", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    with Memory(memory_path(tmp_path), capacity=2) as memory:
        memory.add(MemoryRecord(env_id="env-old", skill="Optimization", step=0, win_rate=0.0, regret=0.0,
                                source="class OldEnv:\n    pass\n", class_name="OldEnv"))
        memory.add(MemoryRecord(env_id="env-a", skill="Logical Deduction", step=4, win_rate=0.4375, regret=-0.125,
                                source="class LockEnv:\n    '''A combination lock.'''\n", hint="Try binary search.",
                                class_name="LockEnv", metadata={"document": "demo.jsonl.gz:17"}))
        memory.add(MemoryRecord(env_id="env-b", skill="Optimization", step=8, win_rate=1.0, regret=0.0625,
                                source="class KnapEnv:\n    pass\n", class_name="KnapEnv"))
    return tmp_path


def test_list_json_has_exactly_the_documented_keys(run_dir: Path) -> None:
    result = spade("memory", "list", str(run_dir), "--json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(set(row) == KEYS for row in rows)
    assert rows == [
        {"env_id": "env-a", "skill": "Logical Deduction", "step": 4, "win_rate": 0.4375, "regret": -0.125,
         "class_name": "LockEnv"},
        {"env_id": "env-b", "skill": "Optimization", "step": 8, "win_rate": 1.0, "regret": 0.0625,
         "class_name": "KnapEnv"},
    ]  # live records only (capacity 2), oldest first


def test_list_table(run_dir: Path) -> None:
    result = spade("memory", "list", str(run_dir))
    assert result.returncode == 0, result.stderr
    header, *lines = result.stdout.splitlines()
    assert header.split() == ["env_id", "skill", "step", "win_rate", "regret", "class_name"]
    assert len(lines) == 2
    assert lines[0].startswith("env-a") and "0.438" in lines[0] and "-0.125" in lines[0] and "LockEnv" in lines[0]
    assert "env-old" not in result.stdout


def test_show_prints_source_hint_and_statistics(run_dir: Path) -> None:
    result = spade("memory", "show", str(run_dir), "env-a")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "class LockEnv:" in out and "A combination lock." in out
    assert "Try binary search." in out
    assert "skill:      Logical Deduction" in out and "step:       4" in out
    assert "win_rate:   0.438" in out and "regret:     -0.125" in out and "in memory" in out
    assert '"document": "demo.jsonl.gz:17"' in out
    evicted = spade("memory", "show", str(run_dir), "env-old")
    assert evicted.returncode == 0 and "evicted" in evicted.stdout


def test_errors_exit_2(tmp_path: Path, run_dir: Path) -> None:
    missing = spade("memory", "list", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such run directory" in missing.stderr
    empty = tmp_path / "empty_run"
    empty.mkdir()
    no_db = spade("memory", "list", str(empty), "--json")
    assert no_db.returncode == 2 and "no memory database" in no_db.stderr and "memory.sqlite" in no_db.stderr
    assert not (empty / "memory.sqlite").exists()  # reading never creates a database
    unknown = spade("memory", "show", str(run_dir), "env-zzz")
    assert unknown.returncode == 2 and "no environment 'env-zzz'" in unknown.stderr
    usage = spade("memory")
    assert usage.returncode == 2
