"""JSON and CSV files of an analysis (docs/analysis.md lists them; ``rlve_levels.csv`` only when a run
has ``env_source: rlve``)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from .report import step_table, window_table

ENV_COLUMNS = ("run", "uid", "env_id", "generated_step", "slot", "skill", "class_name", "attempts", "env_source",
               "level", "accuracy", "win_rate",
               "window_win", "regret", "learnable", "n_nohint_plays", "n_hint_plays", "kept_episodes",
               "reward_levels", "partial_levels", "physics", "formula_revealed", "state_gated", "gating_reason",
               "degenerate_won", "degenerate_policy", "degenerate_source", "lines", "code_lines", "state_variables", "turns", "hint_contains_answer", "hint_one_turn_win_rate",
               "nohint_one_turn_win_rate", "x", "y", "map")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_csv(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...] | None = None) -> None:
    if columns is None:
        seen: dict[str, None] = {}
        for row in rows:
            for key in row:
                seen.setdefault(key, None)
        columns = tuple(seen)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})


def write_all(data: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    path = out / "analysis.json"
    path.write_text(json.dumps(_clean(data), indent=1))
    written.append(path)
    for name, rows, columns in (("steps.csv", step_table(data), None), ("windows.csv", window_table(data), None),
                                ("envs.csv", data["envs"], ENV_COLUMNS)):
        path = out / name
        write_csv(path, rows, columns)
        written.append(path)
    levels = rlve_level_table(data)
    if levels:
        path = out / "rlve_levels.csv"
        write_csv(path, levels)
        written.append(path)
    return written


def rlve_level_table(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (rlve run, step, level): problems, plays, accuracy (``rlve_levels``)."""
    return [{"run": run["name"], **row} for run in data["runs"] if "rlve" in run for row in run["rlve"]["by_level"]]
