"""Smoke run of benchmarks/step_overhead.py at a tiny size (real sandbox, replayed engine)."""

from __future__ import annotations

import json

import pytest

from benchmark_modules import load_benchmark


def _share(overhead: float, engine: float, train: float) -> float:
    return overhead / (overhead + engine + train)  # the benchmark's stated formula (its docstring)


def test_step_overhead_smoke(tmp_path, capsys):
    """A tiny run at an engine rate of 1 generated token/s: the estimated engine time (about a
    thousand seconds) dwarfs a few seconds of overhead, so the verdict must be PASS with exit 0.
    The figures follow the stated formulas, and the same figures at rates that make engine and
    training free must give FAIL."""
    bench = load_benchmark("step_overhead")
    out = tmp_path / "figures.json"
    code = bench.main(["--envs-per-set", "2", "--g-nohint", "2", "--g-hint", "1", "--max-turns", "3", "--k", "2",
                       "--engine-tokens-per-s", "1", "--json", str(out)])
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert code == 0 and data["pass"] is True and data["target_share"] == 0.05
    assert "PRIMARY: overhead share" in printed and "at the stated rates: PASS" in printed and "FAIL" not in printed
    regen, ordinary = data["steps"]
    assert regen["regeneration"] and not ordinary["regeneration"]
    assert regen["admitted"] == 2 and regen["calls"]["designer"] == 2 and regen["calls"]["hint"] == 2
    assert regen["episodes"] == 2 * 2 + 2 * 1 and ordinary["episodes"] == 4
    assert ordinary["agent_turns"] == 4 * 3  # neutral replayed actions: every episode uses its turn budget
    assert regen["agent_samples"] == 4 and regen["train_tokens"] > 0
    for step in data["steps"]:
        assert step["overhead_s"] == pytest.approx(step["wall_s"] - step["engine_replay_s"]) and step["overhead_s"] > 0
        assert step["engine_est_s"] == pytest.approx(sum(step["generated_tokens"].values()) / 1.0)
        assert step["train_est_s"] == pytest.approx(step["train_tokens"] / 10_000.0)
        assert step["share"] == pytest.approx(_share(step["overhead_s"], step["engine_est_s"], step["train_est_s"]))
    # k = 2: the regeneration step plus one ordinary step
    window = [regen[key] + ordinary[key] for key in ("overhead_s", "engine_est_s", "train_est_s")]
    assert data["window"]["share"] == pytest.approx(_share(*window)) and data["window"]["share"] < 0.05

    figures = [bench.StepFigures(**step) for step in data["steps"]]
    for figure in figures:
        figure.estimate(engine_rate=1e15, train_rate=1e15)  # engine and training cost nothing: all overhead
    args = bench.parse_args(["--k", "2"])
    text, passed = bench.report(args, bench.SelfPlaySettings(k=2), "t", data["context"], figures,
                                bench.window(figures, 2), 0.0)
    assert not passed and "at the stated rates: FAIL" in text
