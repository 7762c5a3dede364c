"""The runner (seeds, resume, skipped benchmarks, summary), `spade eval` end to end on a tiny model with
--limit and resumed after a kill, `spade eval report`, and the in-loop entry point."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import prewarmed
import pytest

from spade.eval.aime import AIME
from spade.eval.in_loop import EvalSettings, evaluate_in_loop
from spade.eval.report import build_report
from spade.eval.runner import ChatModel, EvalError, read_records, run_suite, sample_seed
from spade.eval.types import SamplingSettings

from eval_helpers import ByteTokenizer, ScriptedEngine

FIXTURES = Path(__file__).parents[1] / "fixtures" / "eval"
ROOT = Path(__file__).resolve().parents[2]


def _answers(prompt: str, seed: int) -> str:
    if "17 + 25" in prompt:
        return r"\boxed{42}"
    if "square of 12" in prompt:
        return r"\boxed{144}" if seed % 2 else r"\boxed{12}"
    return "no idea"


def _aime(n=4):
    return AIME(2025, data_dir=FIXTURES, sampling=SamplingSettings(n=n, max_new_tokens=64))


def test_scores_seeds_and_summary(tmp_path):
    engine = ScriptedEngine(_answers)
    model = ChatModel(engine, ByteTokenizer(), concurrency=3)
    missing = AIME(2026, data_dir=tmp_path / "none")
    scores = asyncio.run(run_suite([_aime(), missing], model, seed=7, out_dir=tmp_path))
    records = read_records(tmp_path / "aime25.jsonl")
    assert set(records) == {"fx-1", "fx-2", "fx-3"}
    square = records["fx-3"]
    expected = [1.0 if sample_seed(7, "aime25", "fx-3", k) % 2 else 0.0 for k in range(4)]
    assert [s.score for s in square.samples] == expected
    assert scores["aime25"].score == pytest.approx(100 * (4 + 0 + sum(expected)) / 12)
    assert scores["aime26"].score is None and "aime2026" in scores["aime26"].skipped
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["benchmarks"]["aime26"]["skipped"] and summary["benchmarks"]["aime26"]["score"] is None
    assert summary["seed"] == 7


def test_resume_skips_finished_items_and_repairs_a_cut_line(tmp_path):
    model = ChatModel(ScriptedEngine(_answers), ByteTokenizer())
    asyncio.run(run_suite([_aime()], model, seed=1, out_dir=tmp_path, limit=2))
    path = tmp_path / "aime25.jsonl"
    first = path.read_text()
    with open(path, "a") as handle:
        handle.write('{"item_id": "fx-3", "samp')  # a line cut by a kill
    engine = ScriptedEngine(_answers)
    scores = asyncio.run(run_suite([_aime()], ChatModel(engine, ByteTokenizer()), seed=1, out_dir=tmp_path))
    assert engine.calls == 4  # only fx-3's four samples
    assert path.read_text().startswith(first) and len(path.read_text().splitlines()) == 3
    assert scores["aime25"].items == 3
    fresh = asyncio.run(run_suite([_aime()], ChatModel(ScriptedEngine(_answers), ByteTokenizer()), seed=1))
    assert fresh["aime25"].score == scores["aime25"].score  # resumed == uninterrupted
    with pytest.raises(EvalError, match="seed"):
        asyncio.run(run_suite([_aime()], model, seed=2, out_dir=tmp_path))


def test_in_loop_returns_eval_keys(tmp_path):
    settings = EvalSettings(every=2, benchmarks=("aime25", "aime26"), data_dir=str(FIXTURES), samples=2)
    assert settings.due(4) and not settings.due(3) and not EvalSettings().due(2)
    metrics = asyncio.run(evaluate_in_loop(ScriptedEngine(_answers), ByteTokenizer(), settings, step=4,
                                           out_dir=tmp_path))
    square = sum(1 for k in range(2) if sample_seed(0, "aime25", "fx-3", k) % 2)
    assert metrics["eval/aime25"] == pytest.approx(100 * (2 + 0 + square) / 6)
    assert metrics["eval/skipped/aime26"] == 1.0 and "eval/aime26" not in metrics
    assert (tmp_path / "step_4" / "aime25.jsonl").is_file()
    with pytest.raises(ValueError):
        EvalSettings(every=-1)


def _write_summary(directory: Path, label: str, step, scores: dict) -> Path:
    directory.mkdir(parents=True)
    benchmarks = {name: {"name": name, "score": value} for name, value in scores.items()}
    (directory / "summary.json").write_text(json.dumps({"label": label, "step": step, "benchmarks": benchmarks}))
    return directory


GAMES = ("aime25", "aime26", "gpqa_diamond", "lcb_v6", "rg_math", "rg_algorithmic", "rg_cognition", "rg_logic")


def test_report_tables_deltas_best_checkpoint_and_plot(tmp_path):
    base = _write_summary(tmp_path / "base", "base", None, {n: 40.0 for n in GAMES})
    _write_summary(tmp_path / "runs" / "a16", "runA@16", 16, {n: 44.0 for n in GAMES})
    _write_summary(tmp_path / "runs" / "a32", "runA@32", 32, {n: 48.0 for n in GAMES})
    _write_summary(tmp_path / "runs" / "b16", "runB@16", 16, {n: 50.0 for n in GAMES[:7]})
    report = json.loads(build_report([tmp_path / "runs"], base=base, fmt="json", paper=True))
    rows = {r["label"]: r for r in report["table1"]}
    assert rows["runA@32"]["Avg"] == 48.0 and rows["runA@32"]["Δ base"] == 8.0
    assert rows["runB@16"]["Avg"] is None  # 7 of 8 columns: no average
    assert report["best_checkpoint"] == {"runA": "runA@32"}
    paper = {r["key"]: r for r in report["paper_tables"]["table1"] if r["source"] == "paper"}
    assert paper["t1/30b/spade"]["Avg"] == 58.3
    plot = tmp_path / "scaling.png"
    markdown = build_report([tmp_path / "runs"], base=base, fmt="md", paper=True, plot=plot, sizes={"runA": 0.135})
    assert "| runA@32 (best) |" in markdown and "Table 2: tool use" in markdown
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv_text = build_report([tmp_path / "runs"], fmt="csv")
    assert csv_text.splitlines()[0].startswith("table,model,AIME'25")


def _write_scores(directory: Path, label: str, step, scores) -> Path:
    from spade.eval.runner import write_summary

    directory.mkdir(parents=True, exist_ok=True)
    write_summary(directory, {s.name: s for s in scores}, {"label": label, "step": step})
    return directory


def test_report_renders_every_paper_row_with_per_column_cells(tmp_path):
    """Tables 1-3 row by row from result files: the paper's known cells (SPEC.md's headline numbers)
    beside ours, per column; a self-simulated tau2 run and a skipped benchmark fill no paper cell."""
    from spade.eval.paper_tables import PAPER_ROWS, TABLE_COLUMNS
    from spade.eval.report import parse_assignments
    from spade.eval.endpoint_options import user_simulator
    from spade.eval.tau2_bench import Tau2Settings, domain_score
    from spade.eval.types import BenchmarkScore

    games = lambda values: [BenchmarkScore(n, v) for n, v in zip(GAMES, values)]  # noqa: E731
    base_scores = [40.0, 30.0, 50.0, 20.0, 60.0, 45.0, 35.0, 55.0]
    spade_scores = [48.0, 36.0, 54.0, 26.0, 66.0, 50.0, 41.0, 59.0]
    _write_scores(tmp_path / "base30", "base30", None, games(base_scores))
    _write_scores(tmp_path / "spade30" / "step_16", "spade30", 16, games([v - 5 for v in spade_scores]))
    _write_scores(tmp_path / "spade30" / "step_32", "spade30", 32, games(spade_scores))
    bfcl = BenchmarkScore("bfcl_multi_turn", 50.0, groups={"base": 60.0, "miss_func": 50.0, "miss_param": 40.0,
                                                             "long_context": 50.0})
    tau_results = {d: {"pass_hat_ks": {"1": p}, "avg_reward": p, "simulations": [], "tasks": [],
                       "results_file": "x"} for d, p in (("retail", 0.6), ("airline", 0.4), ("telecom", 0.5))}
    tau_self = domain_score("tau2", tau_results, {}, "26.3", user_simulator(Tau2Settings(), "tau2"))
    ace = BenchmarkScore("acebench_agent", 65.0, groups={"multi_step": 70.0, "multi_turn": 60.0})
    _write_scores(tmp_path / "tool30", "tool30", None, [bfcl, tau_self, ace])
    skipped = games(spade_scores)
    skipped[2] = BenchmarkScore("gpqa_diamond", None, skipped="no gpqa_diamond.csv")
    _write_scores(tmp_path / "nomem", "nomem", None, skipped)
    from spade.eval.runner import write_summary

    _write_scores(tmp_path / "limited", "limited", None, [])
    write_summary(tmp_path / "limited", {s.name: s for s in games(spade_scores)}, {"label": "limited", "limit": 3})

    assigned = parse_assignments([f"t1/30b/base={tmp_path / 'base30'}", f"t1/30b/spade={tmp_path / 'spade30'}",
                                  f"t2/30b/base={tmp_path / 'tool30'}", f"t3/no_memory={tmp_path / 'nomem'}",
                                  f"t3/two_skill={tmp_path / 'limited'}"])
    report = json.loads(build_report([], rows=assigned, fmt="json"))["paper_tables"]
    for table in ("table1", "table2", "table3"):
        keys = [r.key for r in PAPER_ROWS if r.table == table]
        assert [r["key"] for r in report[table]] == [k for k in keys for _ in ("paper", "ours")]
        assert all(set(TABLE_COLUMNS[table]) <= set(r) for r in report[table])
    cells = {(r["key"], r["source"]): r for t in report.values() for r in t}

    paper = cells["t1/30b/spade", "paper"]
    assert paper["Avg"] == 58.3 and paper["Δ base"] == pytest.approx(58.3 - 50.2) and paper["AIME'25"] is None
    assert cells["t1/4b/spade", "paper"]["Δ base"] == 5.2 and cells["t1/4b/spade", "paper"]["Avg"] is None
    assert cells["t2/30b/spade", "paper"]["ACEBench"] == 75.9 and cells["t3/no_memory", "paper"]["Avg"] == 53.2
    assert cells["t3/solve_rate", "paper"]["Avg"] is None  # not published in our sources

    ours = cells["t1/30b/spade", "ours"]
    assert [ours[c] for c in TABLE_COLUMNS["table1"][:8]] == spade_scores  # the best checkpoint: step 32
    assert ours["Avg"] == pytest.approx(sum(spade_scores) / 8)
    assert ours["Δ base"] == pytest.approx((sum(spade_scores) - sum(base_scores)) / 8)
    tool = cells["t2/30b/base", "ours"]
    assert tool["BFCL-base"] == 60.0 and tool["BFCL"] == 50.0 and tool["ACEBench"] == 65.0
    assert tool["tau2"] is None and tool["tau2-retail"] is None and tool["Avg"] is None
    assert tool["excluded"]["tau2"].startswith("self-simulated user")
    ablation = cells["t3/no_memory", "ours"]
    assert ablation["GPQA-D"] is None and ablation["Avg"] is None and "skipped" in ablation["excluded"]["gpqa_diamond"]
    limited = cells["t3/two_skill", "ours"]  # a --limit run is a subset: no paper cell
    assert limited["Avg"] is None and limited["AIME'25"] is None and "--limit 3" in limited["excluded"]["all benchmarks"]
    assert cells["t3/learning_potential", "ours"]["Avg"] is None and cells["t3/learning_potential", "ours"]["run"] is None

    markdown = build_report([], rows=assigned)
    assert "Table 3: ablations" in markdown and "| ? |" in markdown
    assert "self-simulated user" in markdown and "(score 50.0)" in markdown
    with pytest.raises(Exception, match="unknown row"):
        parse_assignments(["t9/x=dir"])


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from support.hf_fixtures import make_tokenizer, save_tiny_hf

    directory = tmp_path_factory.mktemp("tiny")
    save_tiny_hf("llama-tied", directory)
    make_tokenizer().save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    config["max_position_embeddings"] = 4096  # room for the fixture prompts
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _spade(*args: str) -> list[str]:
    return [sys.executable, "-m", "spade", "eval", *args]


def test_spade_eval_end_to_end_with_limit_and_resume_after_kill(tiny_model, tmp_path):
    out = tmp_path / "out"
    common = ["--model", str(tiny_model), "--benchmarks", "aime25,gpqa_diamond,aime26", "--data", str(FIXTURES),
              "--samples", "3", "--max-new-tokens", "6", "--concurrency", "2", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(_spade(*common, "--limit", "3"), cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    results = out / "aime25.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if results.is_file() and results.read_text().count("\n") >= 1:
            break
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL  # killed while it ran, not after it had finished
    text = results.read_text() if results.is_file() else ""
    kept = text[:text.rfind("\n") + 1].splitlines()  # whole lines only: the kill may cut the last one
    assert kept, "the first run wrote no item before the kill"
    done = prewarmed.run(["eval", *common, "--limit", "3"], cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = results.read_text().splitlines()
    assert lines[:len(kept)] == kept  # the finished items are kept as they were, the rest appended
    progress = [line.strip() for line in done.stderr.splitlines() if line.strip().startswith("aime25:")]
    assert progress[0] == f"aime25: {len(kept)}/3 items"  # the resumed run started past them
    ids = [json.loads(line)["item_id"] for line in lines]
    assert sorted(ids) == ["fx-1", "fx-2", "fx-3"]  # no item twice
    summary = json.loads((out / "summary.json").read_text())["benchmarks"]
    assert summary["aime25"]["items"] == 3 and summary["gpqa_diamond"]["items"] == 2
    assert summary["aime26"]["skipped"] and summary["aime26"]["score"] is None
    assert "skipped:" in done.stdout and "aime25" in done.stdout
    record = json.loads(lines[0])
    assert len(record["samples"]) == 3 and all(s["completion_tokens"] <= 6 for s in record["samples"])
    again = prewarmed.run(["eval", *common, "--limit", "3"], cwd=ROOT, env=env, timeout=300)
    assert again.returncode == 0 and results.read_text().splitlines() == lines  # nothing left to run
    report = subprocess.run([sys.executable, "-m", "spade", "eval", "report", str(out), "--format", "json"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["table1"][0]["AIME'25"] == summary["aime25"]["score"]


def test_table2_cells_need_every_part_of_their_benchmark(tmp_path):
    """ACEBench-Agent is the mean of multi-step and multi-turn, tau2 of its three domains: a run of
    one part leaves the cell empty rather than passing a part off as the whole."""
    from spade.eval.report import load_row

    def write(name: str, benchmarks: dict) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        (directory / "summary.json").write_text(json.dumps({"label": name, "benchmarks": benchmarks}))
        return directory

    both = write("both", {"acebench_agent": {"score": 55.0, "groups": {"multi_step": 70.0, "multi_turn": 40.0}},
                          "tau2": {"score": 50.0, "groups": {"retail": 60.0, "airline": 40.0, "telecom": 50.0}}})
    row = load_row(both)
    assert row.table2["ACEBench"] == 55.0 and row.table2["tau2"] == 50.0
    part = write("part", {"acebench_agent": {"score": 70.0, "groups": {"multi_step": 70.0}},
                          "tau2": {"score": 60.0, "groups": {"retail": 60.0}}})
    row = load_row(part)
    assert row.table2["ACEBench"] is None and row.table2["tau2"] is None and row.table2["Avg"] is None
    assert row.table2["tau2-retail"] == 60.0
