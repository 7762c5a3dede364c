"""``spade analyze`` end to end on two hand-built runs: files written, numbers as built, plots drawn."""

from __future__ import annotations

import csv
import json

from spade.cli import main
from test_analysis_fixture import two_env_run

PNG = b"\x89PNG\r\n\x1a\n"


def test_analyze_two_runs_writes_json_csv_and_overlaid_plots(tmp_path, capsys) -> None:
    a, b = two_env_run(tmp_path / "a", "base"), two_env_run(tmp_path / "b", "ablation")
    out = tmp_path / "out"
    assert main(["analyze", str(a), str(b), "--out", str(out), "--embedding", "hashing"]) == 0
    printed = capsys.readouterr().out
    assert "base: 3 envs" in printed and f"wrote 16 files to {out}" in printed

    data = json.loads((out / "analysis.json").read_text())
    assert [r["name"] for r in data["runs"]] == ["base", "ablation"] and data["state_gating"] is True
    run = data["runs"][0]
    first, second = run["steps"]
    assert (first["step"], first["n_envs"], second["step"], second["n_envs"]) == (0, 2, 2, 1)
    assert first["learnable_share"] == 0.5  # win rates 0.25 (in the band) and 0.0
    assert first["win_rate"]["mean"] == 0.125
    assert first["rejected"] == 1 and first["rejected_by_kind"] == {"syntax_error": 1}
    assert first["state_gated_share"] == 0.5 and first["state_gating_known"] == 2
    assert second["vendi_per_n"] == 1.0 and second["learnable_share"] == 0.0
    assert run["collapse"]["longest_streak"] == 1  # switchboard, oracle, switchboard: never two in a row
    envs = {e["uid"]: e for e in data["envs"]}
    board = envs["base:0:s000000-e00"]
    assert board["state_gated"] is True and board["regret"] == 0.5 and board["physics"] is False
    assert board["state_variables"] > 3 and board["reward_levels"] >= 2 and 0 <= board["x"] <= 1

    with (out / "steps.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["run"], r["step"]) for r in rows] == [("base", "0"), ("base", "2"), ("ablation", "0"), ("ablation", "2")]
    with (out / "envs.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == 6
    for name in ("vendi", "learnable", "win_rate", "regret", "reward_levels", "reveal_gating", "program_size",
                 "collapse", "hint_leakage", "tsne", "distributions", "admission"):
        assert (out / f"{name}.png").read_bytes()[:8] == PNG, name


def test_analyze_refuses_a_missing_directory(tmp_path, capsys) -> None:
    assert main(["analyze", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err


def test_analyze_a_real_run_directory(tmp_path, capsys) -> None:
    """On the directory of a real CPU run (``spade train --config examples/smoke_cpu.yaml --run-dir R
    run.steps=2``), named by SPADE_ANALYSIS_RUN_DIR: training takes minutes, too long to start here."""
    import os

    import pytest

    run = os.environ.get("SPADE_ANALYSIS_RUN_DIR")
    if not run:
        pytest.skip("set SPADE_ANALYSIS_RUN_DIR to a real run directory to analyse it")
    out = tmp_path / "out"
    assert main(["analyze", run, "--out", str(out), "--embedding", "hashing"]) == 0
    data = json.loads((out / "analysis.json").read_text())
    (only,) = data["runs"]
    assert only["steps"] and all(s["n_envs"] + s["rejected"] > 0 for s in only["steps"])
    assert all(e["n_nohint_plays"] > 0 for e in data["envs"])  # the run kept its returns
    assert any(e["kept_episodes"] > 0 for e in data["envs"])
