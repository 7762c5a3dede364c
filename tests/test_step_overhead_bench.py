"""Smoke run of benchmarks/step_overhead.py at a tiny size (real sandbox, replayed engine)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load():
    spec = importlib.util.spec_from_file_location("step_overhead", ROOT / "benchmarks" / "step_overhead.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_step_overhead_smoke(tmp_path, capsys):
    bench = _load()
    out = tmp_path / "figures.json"
    code = bench.main(["--envs-per-set", "2", "--g-nohint", "2", "--g-hint", "1", "--max-turns", "3", "--k", "2",
                       "--json", str(out)])
    assert code in (0, 1)
    printed = capsys.readouterr().out
    assert "PRIMARY: overhead share" in printed and ("PASS" in printed or "FAIL" in printed)
    data = json.loads(out.read_text())
    regen, ordinary = data["steps"]
    assert regen["regeneration"] and not ordinary["regeneration"]
    assert regen["admitted"] == 2 and regen["calls"]["designer"] == 2 and regen["calls"]["hint"] == 2
    assert regen["episodes"] == 2 * 2 + 2 * 1 and ordinary["episodes"] == 4
    assert ordinary["agent_turns"] == 4 * 3  # neutral replayed actions: every episode uses its turn budget
    assert regen["agent_samples"] == 4 and regen["train_tokens"] > 0
    assert all(0 < step["share"] < 1 and step["overhead_s"] > 0 for step in data["steps"])
    assert 0 < data["window"]["share"] < 1
