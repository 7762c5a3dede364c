"""``spade pool export`` (issue 28): a run's or a pool's admitted environments as a JSONL/Parquet
dataset that pyarrow's readers (what ``datasets.load_dataset("json"/"parquet")`` reads with) take,
and that ``spade pool import`` reads back into the same pool. The run is written by the training's
own writers (``save_set``, ``TrajectoryLog``); the statistics are computed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.json as pa_json
import pyarrow.parquet as pq
import pytest

from spade.cli import main
from spade.selfplay.sources.designer_source import EnvSpec, save_set
from spade.envs.pool_files import read_manifest
from spade.selfplay.sources.fixed_pool import FixedPool, read_pool
from spade.selfplay.plays.player import Play
from spade.pool.export import COLUMNS, EXPORT_INFO, schema
from spade.selfplay.settings import SelfPlaySettings
from spade.selfplay.plays.trajectory_log import TrajectoryLog

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {path.stem: path.read_text() for path in sorted((ROOT / "examples" / "envs").glob("*.py"))}


def _spec(step: int, slot: int, name: str, skill: str) -> EnvSpec:
    return EnvSpec(env_id=f"s{step:06d}-e{slot:02d}", slot=slot, skill=skill, source=EXAMPLES[name],
                   hint=f"hint for {name}", class_name=f"{name}Env", max_turns=12, generated_step=step,
                   document=f"doc-{name}")


def _plays(env_id: str, nohint: list[float], hint: list[float]) -> list[Play]:
    return [Play(env_id, False, i, r, 1, "terminated", None) for i, r in enumerate(nohint)] + \
        [Play(env_id, True, i, r, 1, "terminated", None) for i, r in enumerate(hint)]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "spade-a"
    first = [_spec(0, 0, "switchboard", "Causal Inference"), _spec(0, 1, "foggy_grid", "Spatial Reasoning")]
    later = [_spec(2, 0, "remainder_oracle", "Mathematical Reasoning")]
    save_set(run, 0, first)
    save_set(run, 2, later)
    log = TrajectoryLog(run, keep_per_arm=0)
    log.write_step(0, first, _plays("s000000-e00", [1.0, 0.0, 0.0, 1.0], [1.0, 1.0])
                   + _plays("s000000-e01", [0.0, 0.0], [0.25, 0.75]))
    log.write_step(1, first, _plays("s000000-e00", [0.0, 1.0], []) + _plays("s000000-e01", [0.5], []))
    log.write_step(2, later, _plays("s000002-e00", [-0.5], [0.5]))
    # an environment a live run is still saving: its source is there, its metadata only in part
    (run / "envs" / "step_000002" / "s000002-e01.py").write_text(EXAMPLES["hidden_sequence"])
    (run / "envs" / "step_000002" / "s000002-e01.json").write_text('{"env_id": "s0')
    return run


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_run_exports_as_jsonl_with_hand_computed_statistics(run, tmp_path):
    out = tmp_path / "nested" / "export"
    assert main(["pool", "export", str(run), "--out", str(out)]) == 0
    rows = {row["name"]: row for row in _jsonl(out / "data" / "train.jsonl")}
    assert sorted(rows) == ["step_000000-s000000-e00", "step_000000-s000000-e01", "step_000002-s000002-e00"]
    a = rows["step_000000-s000000-e00"]
    assert a["code"] == EXAMPLES["switchboard"] and a["hint"] == "hint for switchboard"
    assert (a["skill"], a["step"], a["document"], a["class_name"], a["max_turns"]) == \
        ("Causal Inference", 0, "doc-switchboard", "switchboardEnv", 12)
    assert json.loads(a["origin"]) == {"run": str(run.resolve()), "env_id": "s000000-e00", "step": 0}
    assert a["nohint_returns"] == [1.0, 0.0, 0.0, 1.0] and a["hint_returns"] == [1.0, 1.0]
    assert a["later_nohint_returns"] == [0.0, 1.0]
    assert (a["win_rate"], a["mean_nohint_return"], a["regret"]) == (0.5, 0.5, 0.5)  # 2 of 4 won; 1 - 0.5
    b = rows["step_000000-s000000-e01"]
    assert (b["win_rate"], b["mean_nohint_return"], b["regret"], b["later_nohint_returns"]) == (0.0, 0.0, 0.5, [0.5])
    c = rows["step_000002-s000002-e00"]
    assert (c["step"], c["win_rate"], c["regret"]) == (2, 0.0, 1.0)  # 0.5 - (-0.5)
    # what datasets.load_dataset("json", data_files=...) parses with: pyarrow's JSON reader
    table = pa_json.read_json(out / "data" / "train.jsonl")
    assert table.num_rows == 3 and tuple(table.column_names) == COLUMNS
    card = (out / "README.md").read_text()
    assert card.startswith("---\nconfigs:") and "path: data/train.jsonl" in card
    assert json.loads((out / EXPORT_INFO).read_text())["rows"] == 3


def test_parquet_holds_the_same_rows_under_the_schema(run, tmp_path):
    assert main(["pool", "export", str(run), "--out", str(tmp_path / "j")]) == 0
    assert main(["pool", "export", str(run), "--out", str(tmp_path / "p"), "--format", "parquet"]) == 0
    table = pq.read_table(tmp_path / "p" / "data" / "train.parquet")
    assert table.schema.equals(schema())
    assert table.to_pylist() == _jsonl(tmp_path / "j" / "data" / "train.jsonl")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_export_import_export_round_trip(run, tmp_path, fmt):
    first, pool, second = tmp_path / "first", tmp_path / "pool", tmp_path / "second"
    assert main(["pool", "export", str(run), "--out", str(first), "--format", fmt]) == 0
    assert main(["pool", "import", "--from", str(first), "--out", str(pool), "--expect", "3"]) == 0
    # the pool as training reads it: same sources, hints, skills
    entries = {e.name: e for e in read_pool(pool)}
    assert entries["step_000002-s000002-e00"].path.read_text() == EXAMPLES["remainder_oracle"]
    assert entries["step_000000-s000000-e01"].hint() == "hint for foggy_grid"
    assert {n: e.skill for n, e in entries.items()} == {
        "step_000000-s000000-e00": "Causal Inference", "step_000000-s000000-e01": "Spatial Reasoning",
        "step_000002-s000002-e00": "Mathematical Reasoning"}
    source = FixedPool(SelfPlaySettings(envs_per_set=2, k=1, env_source="fixed_pool", fixed_env_dir=str(pool)),
                       sandbox=None, run_dir=tmp_path / "train", seed=0)
    assert len(source.entries) == 3
    assert main(["pool", "export", str(pool), "--out", str(second), "--format", fmt]) == 0

    def rows(directory: Path) -> dict[str, dict]:
        path = directory / "data" / f"train.{fmt}"
        listed = _jsonl(path) if fmt == "jsonl" else pq.read_table(path).to_pylist()
        return {row["name"]: row for row in listed}

    assert rows(second) == rows(first)  # every column, statistics and origin included


def test_a_pool_without_plays_exports_and_errors_are_usage_errors(tmp_path, capsys):
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "liars.py").write_text(EXAMPLES["liars_island"])
    (pool / "pool.jsonl").write_text(json.dumps({"name": "liars", "skill": "Logical Deduction",
                                                 "document": "doc-7"}) + "\n")
    out = tmp_path / "out"
    assert main(["pool", "export", str(pool), "--out", str(out)]) == 0
    (row,) = _jsonl(out / "data" / "train.jsonl")
    assert (row["name"], row["skill"], row["document"], row["hint"], row["step"]) == \
        ("liars", "Logical Deduction", "doc-7", "", None)
    assert (row["nohint_returns"], row["win_rate"], row["regret"]) == ([], None, None)
    capsys.readouterr()
    assert main(["pool", "export", str(pool), "--out", str(out)]) == 2  # exists
    assert main(["pool", "export", str(tmp_path / "nothing"), "--out", str(tmp_path / "o2")]) == 2
    assert "neither a run directory" in capsys.readouterr().err
    # a damaged export: refused, nothing left behind
    data = out / "data" / "train.jsonl"
    broken = json.loads(data.read_text())
    del broken["code"]
    data.write_text(json.dumps(broken) + "\n")
    assert main(["pool", "import", "--from", str(out), "--out", str(tmp_path / "again")]) == 2
    assert "lacks the columns code" in capsys.readouterr().err
    assert not (tmp_path / "again").exists() and not list(tmp_path.glob(".again*"))
    assert read_manifest(pool)[0]["name"] == "liars"
