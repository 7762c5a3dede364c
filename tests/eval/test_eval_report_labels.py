"""``spade eval report`` tells apart rows that would read alike (issue 43): the same model evaluated
twice, and two runs of the same name, each keeping its own best checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from spade.eval.report import build_report

GAMES = ("aime25", "aime26", "gpqa_diamond", "lcb_v6", "rg_math", "rg_algorithmic", "rg_cognition", "rg_logic")


def summary(directory: Path, label: str, step, score: float) -> None:
    directory.mkdir(parents=True)
    benchmarks = {name: {"name": name, "score": score} for name in GAMES}
    (directory / "summary.json").write_text(json.dumps({"label": label, "step": step, "benchmarks": benchmarks}))


def test_two_evaluations_of_one_model_and_two_runs_of_one_name_are_labelled_apart(tmp_path):
    results = tmp_path / "results"
    summary(results / "a", "Qwen3-4B", None, 40.0)
    summary(results / "b", "Qwen3-4B", None, 42.0)
    summary(tmp_path / "exp1" / "run" / "step_10", "run@10", 10, 50.0)
    summary(tmp_path / "exp1" / "run" / "step_20", "run@20", 20, 55.0)
    summary(tmp_path / "exp2" / "run" / "step_10", "run@10", 10, 60.0)
    summary(results / "c", "Other", None, 30.0)  # alone under its name: left as it is

    dirs = [results, tmp_path / "exp1" / "run", tmp_path / "exp2" / "run"]
    report = json.loads(build_report(dirs, fmt="json"))
    averages = {row["label"]: row["Avg"] for row in report["table1"]}
    assert averages == {"Qwen3-4B [a]": 40.0, "Qwen3-4B [b]": 42.0, "Other": 30.0, "run@10 [exp1/run]": 50.0,
                        "run@20 [exp1/run]": 55.0, "run@10 [exp2/run]": 60.0}
    # each run keeps its own best checkpoint (before, exp2's step 10 hid exp1's best)
    assert report["best_checkpoint"] == {"Qwen3-4B [a]": "Qwen3-4B [a]", "Qwen3-4B [b]": "Qwen3-4B [b]",
                                         "Other": "Other", "run [exp1/run]": "run@20 [exp1/run]",
                                         "run [exp2/run]": "run@10 [exp2/run]"}
    assert len(report["protocols"]) == 6

    text = subprocess.run([sys.executable, "-m", "spade", "eval", "report", *map(str, dirs)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    assert "| Qwen3-4B [a] | 40.0 |" in text.stdout and "| Qwen3-4B [b] | 42.0 |" in text.stdout
    assert "| run@20 [exp1/run] (best) |" in text.stdout and "| run@10 [exp2/run] (best) |" in text.stdout
