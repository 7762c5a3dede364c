"""``spade analyze``, ``spade explore --export`` and the console on real baseline runs.

Two 2-step ``spade train`` runs on a tiny random Qwen3 (module fixtures, started together):

* ``env_source: rlve`` (Multiplication and Sudoku, initial difficulty 2 so that problems come from
  levels 0-2 of the window): the saved "sources" are JSON problem specs;
* ``env_source: fixed_pool``: a pool of three example environments, two drawn per regeneration,
  so one pool file comes back at the second regeneration.

References are computed here from the run directories' own files (the specs, the trajectory
lines, the pool files, metrics.jsonl), not through the analysis code.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import shutil
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import prewarmed
import pytest

from spade.cli import main
from spade.run.console import run_summary, step_line
from spade.run.progress import Progress
from support.configs import SANDBOX_LIMITS, example_envs, write_config

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 240
POOL = ("hidden_sequence.py", "remainder_oracle.py", "switchboard.py")
if importlib.util.find_spec("Gym") is None:  # found, not imported: rlve-gym reseeds global random state
    raise ImportError("rlve-gym is not installed (make setup installs it)")
NOT_FOR_RLVE = {"vendi", "map", "program_size", "formula_reveal", "state_gating", "hint_leakage", "regret", "collapse"}


def _tiny_model(directory: Path) -> None:
    from chat_templates import bpe_tokenizer
    from support.models import save_tiny_qwen3

    tokenizer = bpe_tokenizer()
    save_tiny_qwen3(directory, tokenizer, special_ids=True)


def _config(hf: Path, selfplay: dict) -> dict:
    return {
        "model": {"hf_dir": hf, "dtype": "float32"},
        "optimizer": {"lr": 0.001},
        "engine": {"max_batch_size": 8},
        "run": {"steps": 2, "checkpoint_every": 10, "seed": 7, "micro_batch_tokens": 2048},
        "selfplay": selfplay,
        **({"sandbox": SANDBOX_LIMITS} if selfplay["env_source"] == "fixed_pool" else {}),
    }


RLVE = {
    "env_source": "rlve",
    "k": 1,
    "envs_per_set": 4,
    "g_nohint": 2,
    "g_hint": 0,
    "sampling": {"agent": {"temperature": 1.0, "max_tokens": 16}},
    "use_corpus": False,
    "use_memory": False,
    "train_designer": False,
    "max_context_tokens": 1024,
    "rlve": {"environments": ["Multiplication", "Sudoku"], "workers": 1, "accuracy_samples": 2,
             "initial_difficulty": 2},
}
FIXED_POOL = {
    "env_source": "fixed_pool",
    "k": 1,
    "envs_per_set": 2,
    "g_nohint": 2,
    "g_hint": 2,
    "use_corpus": False,
    "sampling": {"agent": {"max_tokens": 12}, "hint": {"max_tokens": 12}},
    "max_turns": 2,
    "max_context_tokens": 1024,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Both runs, trained side by side (each a ``spade train`` process with a hard timeout: tests/prewarmed.py)."""
    work = tmp_path_factory.mktemp("baselines")
    _tiny_model(work / "hf")
    pool = example_envs(work / "pool", POOL)
    configs = {"fixed_pool": _config(work / "hf", {**FIXED_POOL, "fixed_env_dir": pool}),
               "rlve": _config(work / "hf", RLVE)}
    for name, config in configs.items():
        write_config(work / f"{name}.yaml", config)
    with ThreadPoolExecutor(len(configs)) as pool_of_two:  # prewarmed.run kills a run past its timeout
        done = dict(zip(configs, pool_of_two.map(
            lambda name: prewarmed.run(["train", "--config", str(work / f"{name}.yaml"), "--run-dir", str(work / name)],
                                       cwd=ROOT, timeout=RUN_TIMEOUT_S, env={**os.environ, "OMP_NUM_THREADS": "1"}),
            configs)))
    for name, proc in done.items():
        assert proc.returncode == 0, f"{name}: {proc.stderr[-4000:]}"
    return {name: work / name for name in configs}


# ---------------------------------------------------------------------------- references from the files


def metrics_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def saved_specs(run: Path) -> dict[str, tuple[int, dict]]:
    """env_id -> (step, the problem spec) of every saved rlve problem."""
    out = {}
    for path in sorted((run / "envs").glob("step_*/*.py")):
        out[path.stem] = (int(path.parent.name.split("_")[1]), json.loads(path.read_text())["rlve"])
    return out


def returns_lines(run: Path) -> list[dict]:
    return [line for path in sorted((run / "trajectories").glob("step_*.jsonl"))
            for line in map(json.loads, path.read_text().splitlines()) if line["kind"] == "env_returns"]


def analysis_of(run_dirs: list[Path], out: Path, capsys) -> tuple[dict, str]:
    assert main(["analyze", *map(str, run_dirs), "--out", str(out), "--embedding", "hashing"]) == 0
    return json.loads((out / "analysis.json").read_text()), capsys.readouterr().out


def site_data(site: Path) -> dict:
    text = (site / "data.js").read_text()
    assert text.startswith("spadeData(") and text.endswith(");\n")
    return json.loads(text[len("spadeData("):-3])


# ---------------------------------------------------------------------------- rlve


def test_rlve_analysis_gives_accuracy_by_level_and_names_what_does_not_apply(runs, tmp_path, capsys):
    run = tmp_path / "rlve"
    shutil.copytree(runs["rlve"], run, ignore=shutil.ignore_patterns("checkpoints"))
    # a random model solves nothing: mark one play of the first problem solved (return 1.0, its
    # threshold) and one of the second at just under its threshold, so accuracy is not all zeros
    path = run / "trajectories" / "step_000000.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    specs = saved_specs(run)
    edited = [line for line in lines if line["kind"] == "env_returns"][:2]
    edited[0]["nohint_returns"][0] = specs[edited[0]["env_id"]][1]["threshold"]
    edited[1]["nohint_returns"][0] = specs[edited[1]["env_id"]][1]["threshold"] - 0.5
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))

    data, printed = analysis_of([run], tmp_path / "out", capsys)
    (report,) = data["runs"]
    assert report["env_source"] == "rlve" and set(report["not_applicable"]) == NOT_FOR_RLVE
    assert all(v.startswith("not applicable to env_source rlve: ") for v in report["not_applicable"].values())
    assert "not applicable to env_source rlve: vendi, map, program size" in printed and "Vendi/n" not in printed

    # accuracy per (step, level), by hand: RLVE's rule, return >= the problem's threshold
    cells: dict[tuple[int, int], list[float]] = {}
    thresholds: dict[tuple[int, int], list[float]] = {}
    for line in returns_lines(run):
        level = specs[line["env_id"]][1]["difficulty"]
        cells.setdefault((line["step"], level), []).extend(line["nohint_returns"])
        thresholds.setdefault((line["step"], level), []).extend(
            [specs[line["env_id"]][1]["threshold"]] * len(line["nohint_returns"]))
    expected = [{"step": s, "level": lv, "plays": len(cells[(s, lv)]),
                 "accurate": sum(r >= t for r, t in zip(cells[(s, lv)], thresholds[(s, lv)]))}
                for s, lv in sorted(cells)]
    got = [{k: c[k] for k in ("step", "level", "plays", "accurate")} for c in report["rlve"]["by_level"]]
    assert got == expected and sum(c["accurate"] for c in expected) == 1
    assert all(c["accuracy"] == c["accurate"] / c["plays"] for c in report["rlve"]["by_level"])
    levels = sorted({spec["difficulty"] for _, spec in specs.values()})
    assert report["rlve"]["levels"] == levels and set(levels) <= {0, 1, 2}

    per_env = Counter(spec["environment"] for _, spec in specs.values())
    assert {e["environment"]: e["problems"] for e in report["rlve"]["by_environment"]} == dict(per_env)
    assert [c["step"] for c in report["rlve"]["controller"]] == [r["step"] for r in metrics_rows(run)]
    assert [c["raised"] for c in report["rlve"]["controller"]] == [r["rlve/raised"] for r in metrics_rows(run)]

    for step in report["steps"]:
        mine = [spec for s, spec in specs.values() if s == step["step"]]
        assert step["n_envs"] == len(mine) and step["vendi_per_n"] is None and step["duplicate_share"] is None
        assert (step["rlve_level_min"], step["rlve_level_max"]) == (min(s["difficulty"] for s in mine),
                                                                    max(s["difficulty"] for s in mine))
        assert step["rlve_distinct_environments"] == len({s["environment"] for s in mine})
        assert step["lines_mean"] is None and step["state_variables_mean"] is None and step["physics_envs"] is None
    assert "longest_streak" not in report["collapse"] and report["collapse"]["not_applicable"]
    for row in data["envs"]:
        assert row["level"] == specs[row["env_id"]][1]["difficulty"] and row["map"] == "rlve_grid"
        assert row["lines"] is None and row["state_variables"] is None and row["physics"] is None
        assert row["state_gated"] is None and row["gating_reason"].startswith("not applicable to env_source rlve")
        assert row["hint_contains_answer"] is None and row["regret"] is None
        assert 0 <= row["x"] <= 1 and 0 <= row["y"] <= 1
    # problems of one environment share a column, and a higher level sits higher
    by_env = {}
    for row in data["envs"]:
        by_env.setdefault(row["class_name"], set()).add(row["x"])
    assert all(len(xs) == 1 for xs in by_env.values()) and len(set().union(*by_env.values())) == len(by_env)
    ordered = sorted(data["envs"], key=lambda r: r["level"])
    assert all(a["y"] <= b["y"] for a, b in zip(ordered, ordered[1:]))

    with (tmp_path / "out" / "rlve_levels.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == len(expected)
    assert (tmp_path / "out" / "rlve_levels.png").read_bytes()[:4] == b"\x89PNG"


def test_explore_export_of_an_rlve_run_and_a_pool_run(runs, tmp_path, capsys):
    site = tmp_path / "site"
    assert main(["explore", str(runs["rlve"]), str(runs["fixed_pool"]), "--export", str(site),
                 "--embedding", "hashing"]) == 0
    data = site_data(site)
    specs = saved_specs(runs["rlve"])
    pool_envs = sorted((runs["fixed_pool"] / "envs").glob("step_*/*.py"))
    assert len(data["envs"]) == len(specs) + len(pool_envs)
    assert all(env["x"] is not None and env["y"] is not None for env in data["envs"])
    assert {env["map"] for env in data["envs"] if env["run"] == "rlve"} == {"rlve_grid"}
    assert {env["map"] for env in data["envs"] if env["run"] == "fixed_pool"} == {"tsne"}
    assert "t-SNE" in data["map"] and "rlve problems by rlve-gym environment" in data["map"]
    runs_by_name = {r["name"]: r for r in data["runs"]}
    assert runs_by_name["rlve"]["env_source"] == "rlve" and set(runs_by_name["rlve"]["not_applicable"]) == NOT_FOR_RLVE
    assert set(runs_by_name["fixed_pool"]["not_applicable"]) == {"collapse"}
    curves = runs_by_name["rlve"]["curves"]
    assert "vendi_per_n" not in {k for k, v in curves.items() if v}
    for level in {spec["difficulty"] for _, spec in specs.values()}:
        assert curves[f"rlve_accuracy_level_{level}"]
    assert "rlve/raised" in runs_by_name["rlve"]["metrics"]
    assert len(list((site / "details").glob("*.js"))) == len(data["envs"])
    detail = next(env for env in data["envs"] if env["run"] == "rlve")
    text = (site / "details" / f"{detail['detail']}.js").read_text()
    assert '\\"rlve\\"' in text  # the problem spec is the source shown


def test_rlve_step_lines_and_summary_on_the_real_metrics(runs):
    run = runs["rlve"]
    rows, specs = metrics_rows(run), saved_specs(run)
    for row in rows:
        mine = [spec["difficulty"] for step, spec in specs.values() if step == row["step"]]
        for line in (step_line(row["step"], 2, row), step_line(row["step"], 2, row, "rlve")):
            span = f"level {min(mine)}" if min(mine) == max(mine) else f"levels {min(mine)}-{max(mine)}"
            assert f"| {len(mine)} problems ({span}, mean level {sum(mine) / len(mine):.2g}, highest environment level " \
                   f"{int(row['rlve/difficulty_max'])}), {int(row['rlve/raised'])} environments raised " \
                   f"({int(row['rlve/checked'])} checked) |" in line, line
            assert "admitted" not in line and "designer" not in line
    raised = {**rows[0], "rlve/raised": 2.0, "rlve/checked": 3.0}  # what a raise would read like
    assert "2 environments raised (3 checked)" in step_line(0, 2, raised)
    assert "1 environment raised (3 checked)" in step_line(0, 2, {**raised, "rlve/raised": 1.0})

    stream = io.StringIO()
    progress = Progress(2, stream=stream, tty=False, env_source="rlve")
    progress.start_step(0)
    progress.update(admitted=4)
    assert "problems 4" in progress.status_line() and "admitted" not in progress.status_line()
    progress.end_step(0, rows[0])
    assert f"{len([1 for s, _ in specs.values() if s == 0])} problems (" in stream.getvalue()

    text = run_summary(run, wall_s=60.0)
    levels = sorted({spec["difficulty"] for _, spec in specs.values()})
    names = {spec["environment"] for _, spec in specs.values()}
    raised_total = int(sum(r["rlve/raised"] for r in rows))
    assert (f"  rlve       {len(specs)} problems over 2 regenerations (levels {levels[0]}-{levels[-1]}, "
            f"{len(names)} rlve-gym environments); {raised_total} environments raised, highest environment level "
            f"{int(rows[-1]['rlve/difficulty_max'])}") in text, text
    assert f"{int(sum(r['agent/episodes'] for r in rows))} plays (rlve problems have no hint)" in text
    assert "attempts" not in text and "designer" not in text and "memory list" not in text


# ---------------------------------------------------------------------------- fixed pool


def test_fixed_pool_analysis_counts_a_redrawn_file_once(runs, tmp_path, capsys):
    run = runs["fixed_pool"]
    saved = sorted((run / "envs").glob("step_*/*.py"))
    distinct = {p.stem for p in saved}
    assert len(saved) == 4 and len(distinct) == 3  # two draws of two from a pool of three

    data, printed = analysis_of([run], tmp_path / "out", capsys)
    (report,) = data["runs"]
    assert report["env_source"] == "fixed_pool" and set(report["not_applicable"]) == {"collapse"}
    assert report["collapse"]["not_applicable"].startswith("not applicable to env_source fixed_pool")
    whole = report["whole_run"]
    assert (whole["n_envs"], whole["distinct_envs"], whole["vendi_sample_size"]) == (4, 3, 3)
    assert whole["vendi_per_n"] is not None and 0 < whole["vendi_per_n"] <= 1
    assert "fixed_pool: 4 envs (3 distinct pool files), Vendi/n" in printed
    assert "not applicable to env_source fixed_pool: collapse" in printed
    for row in data["envs"]:  # code analyses apply: the sizes of the pool's own files
        source = (ROOT / "examples" / "envs" / f"{row['env_id'].removeprefix('fixed-')}.py").read_text()
        assert row["lines"] == len(source.splitlines()) and row["state_variables"] > 0
        assert row["map"] == "tsne" and row["level"] is None
    assert not (tmp_path / "out" / "rlve_levels.csv").exists()


def test_fixed_pool_step_lines_and_summary_on_the_real_metrics(runs):
    run = runs["fixed_pool"]
    rows = metrics_rows(run)
    per_step = Counter(int(p.parent.name.split("_")[1]) for p in (run / "envs").glob("step_*/*.py"))
    for row in rows:
        line = step_line(row["step"], 2, row, "fixed_pool")
        assert f"| {per_step[row['step']]} environments drawn from the pool |" in line, line
        assert "admitted" not in line and "designer" not in line
        # told nothing, the metrics of a pool step read as a designer's (the trainer says which)
        assert f"envs {per_step[row['step']]} admitted, 0 rejected" in step_line(row["step"], 2, row)
    stream = io.StringIO()
    progress = Progress(2, stream=stream, tty=False, env_source="fixed_pool")
    progress.start_step(1)
    progress.update(admitted=2)
    assert "envs 2 drawn" in progress.status_line()
    progress.end_step(1, rows[1])
    assert "2 environments drawn from the pool" in stream.getvalue()

    text = run_summary(run)
    assert "  pool       4 environments drawn from the pool over 2 regenerations (3 distinct)" in text, text
    hinted = int(sum(r.get("agent/hint_episodes", 0) for r in rows))
    assert f"{int(sum(r['agent/episodes'] for r in rows))} plays without hint, {hinted} with hint" in text
    assert "attempts" not in text and "designer" not in text
