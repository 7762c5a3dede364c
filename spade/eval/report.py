"""``spade eval report``: the paper's Table 1 (games) and Table 2 (tool use) from result directories,
deltas against a base, the best checkpoint of each run on the suite average, and the scaling figure
(gain over base against model size)."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from .runner import SUMMARY_FILE

TABLE1 = (("AIME'25", "aime25"), ("AIME'26", "aime26"), ("GPQA-D", "gpqa_diamond"), ("LCB-v6", "lcb_v6"),
          ("RG-Math", "rg_math"), ("RG-Algo", "rg_algorithmic"), ("RG-Cog", "rg_cognition"), ("RG-Logic", "rg_logic"))
BFCL_GROUPS = (("BFCL-base", "base"), ("BFCL-miss-func", "miss_func"), ("BFCL-miss-param", "miss_param"),
               ("BFCL-long-ctx", "long_context"))
ACEBENCH_CATEGORIES = ("multi_step", "multi_turn")
TAU2_DOMAINS = (("tau2-retail", "retail"), ("tau2-airline", "airline"), ("tau2-telecom", "telecom"))

# The paper's published numbers (SPEC.md section 2): only these are published in our spec; the other
# cells of those rows are unknown here and stay empty.
PAPER_TABLE1 = [
    {"label": "paper: Qwen3-30B-A3B base", "Avg": 50.2},
    {"label": "paper: fixed-env GRPO (30B-A3B)", "Avg": 51.4},
    {"label": "paper: fixed-env RLVE (30B-A3B)", "Avg": 53.0},
    {"label": "paper: SPADE (30B-A3B)", "Avg": 58.3},
]
PAPER_TABLE2 = [
    {"label": "paper: Qwen3-30B-A3B base", "BFCL": 49.0, "tau2": 49.0, "ACEBench": 62.0},
    {"label": "paper: SPADE (30B-A3B)", "BFCL": 54.7, "tau2": 52.6, "ACEBench": 75.9},
]
PAPER_GAINS = {4.0: 5.2, 8.0: 5.7, 30.0: 8.1}  # gain over base by model size (billions)
for _row in PAPER_TABLE2:
    _row["Avg"] = round((_row["BFCL"] + _row["tau2"] + _row["ACEBench"]) / 3, 2)


class ReportError(RuntimeError):
    """The report cannot be built (no results found, unreadable summary)."""


@dataclass
class Row:
    label: str
    run: str
    step: Optional[int]
    directory: Path
    cells: dict[str, Optional[float]] = field(default_factory=dict)
    table2: dict[str, Optional[float]] = field(default_factory=dict)


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(present) / len(present) if present and len(present) == len(values) else None


def _score(benchmarks: Mapping[str, Any], name: str) -> Optional[float]:
    entry = benchmarks.get(name)
    return None if not entry or entry.get("score") is None else float(entry["score"])


def load_row(directory: Path) -> Row:
    path = directory / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from None
    benchmarks = summary.get("benchmarks", {})
    label = str(summary.get("label") or directory.name)
    step = summary.get("step")
    run = label.split("@")[0]
    row = Row(label if step is None or "@" in label else f"{label}@{step}", run, step, directory)
    for column, name in TABLE1:
        row.cells[column] = _score(benchmarks, name)
    row.cells["Avg"] = _mean([row.cells[c] for c, _ in TABLE1])
    bfcl = benchmarks.get("bfcl_multi_turn") or {}
    groups = bfcl.get("groups") or {}
    for column, group in BFCL_GROUPS:
        row.table2[column] = groups.get(group)
    row.table2["BFCL"] = _mean([row.table2[c] for c, _ in BFCL_GROUPS])
    tau = (benchmarks.get("tau2") or {}).get("groups") or {}
    for column, domain in TAU2_DOMAINS:
        row.table2[column] = tau.get(domain)
    row.table2["tau2"] = _mean([row.table2[c] for c, _ in TAU2_DOMAINS])
    ace = (benchmarks.get("acebench_agent") or {}).get("groups") or {}
    # ACEBench-Agent is the mean of its two categories: empty unless both were run
    row.table2["ACEBench"] = _mean([ace.get(c) for c in ACEBENCH_CATEGORIES])
    row.table2["Avg"] = _mean([row.table2["BFCL"], row.table2["tau2"], row.table2["ACEBench"]])
    return row


def find_result_dirs(paths: Sequence[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if (path / SUMMARY_FILE).is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(p.parent for p in path.glob(f"*/{SUMMARY_FILE}")))
    if not found:
        raise ReportError(f"no {SUMMARY_FILE} in {', '.join(map(str, paths))}")
    return found


def best_per_run(rows: Sequence[Row], key: str = "Avg", table2: bool = False) -> dict[str, Row]:
    best: dict[str, Row] = {}
    for row in rows:
        value = (row.table2 if table2 else row.cells).get(key)
        if value is None:
            continue
        current = best.get(row.run)
        if current is None or value > (current.table2 if table2 else current.cells)[key]:
            best[row.run] = row
    return best


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:+.1f}" if False else f"{value:.1f}"
    return str(value)


def _table(title: str, columns: Sequence[str], rows: Sequence[Mapping[str, Any]], fmt: str) -> str:
    header = ["model", *columns]
    body = [[str(r.get("label", "")), *[_fmt(r.get(c)) for c in columns]] for r in rows]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["table", *header])
        for line in body:
            writer.writerow([title, *line])
        return out.getvalue().rstrip("\n")
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(line) + " |" for line in body]
    return "\n".join(lines)


def build_report(paths: Sequence[Path], *, base: Optional[Path] = None, fmt: str = "md", paper: bool = False,
                 plot: Optional[Path] = None, sizes: Optional[Mapping[str, float]] = None) -> str:
    rows = [load_row(d) for d in find_result_dirs(paths)]
    base_row = load_row(base) if base is not None else None
    t1_cols = [c for c, _ in TABLE1] + ["Avg"]
    t2_cols = [c for c, _ in BFCL_GROUPS] + ["BFCL"] + [c for c, _ in TAU2_DOMAINS] + ["tau2", "ACEBench", "Avg"]
    best1, best2 = best_per_run(rows), best_per_run(rows, table2=True)

    def dict_rows(table2: bool) -> list[dict[str, Any]]:
        out = []
        columns = t2_cols if table2 else t1_cols
        for row in ([base_row] if base_row is not None else []) + rows:
            values = row.table2 if table2 else row.cells
            entry: dict[str, Any] = {"label": row.label, **{c: values.get(c) for c in columns}}
            best = (best2 if table2 else best1).get(row.run)
            entry["best"] = best is row
            if base_row is not None and row is not base_row:
                ref = (base_row.table2 if table2 else base_row.cells).get("Avg")
                entry["Δ base"] = None if ref is None or values.get("Avg") is None else values["Avg"] - ref
            out.append(entry)
        if paper:
            out += [dict(r) for r in (PAPER_TABLE2 if table2 else PAPER_TABLE1)]
        return out

    table1, table2 = dict_rows(False), dict_rows(True)
    if plot is not None or sizes:
        target = plot or (rows[0].directory / "scaling.png")
        write_scaling_plot(target, rows, base_row, sizes or {}, paper)
    if fmt == "json":
        return json.dumps({"table1": table1, "table2": table2,
                           "best_checkpoint": {run: r.label for run, r in best1.items()}}, indent=1)
    extra = ["Δ base"] if base_row is not None else []
    for table in (table1, table2):
        for entry in table:
            if entry.get("best") and entry["label"].count("@"):
                entry["label"] += " (best)"
    parts = [_table("Table 1: games", t1_cols + extra, table1, fmt), _table("Table 2: tool use", t2_cols + extra,
                                                                            table2, fmt)]
    return ("\n" if fmt == "csv" else "\n\n").join(parts)


def write_scaling_plot(path: Path, rows: Sequence[Row], base_row: Optional[Row], sizes: Mapping[str, float],
                       paper: bool) -> Path:
    """Gain over base (Table 1 Avg) against model size for runs labelled with a size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = []
    best = best_per_run(rows)
    ref = base_row.cells.get("Avg") if base_row is not None else None
    for run, row in best.items():
        size = sizes.get(run) or sizes.get(row.label)
        if size is not None and ref is not None and row.cells.get("Avg") is not None:
            points.append((size, row.cells["Avg"] - ref, run))
    figure, axis = plt.subplots(figsize=(5, 3.5))
    if points:
        points.sort()
        axis.plot([p[0] for p in points], [p[1] for p in points], "o-", label="ours")
        for x, y, name in points:
            axis.annotate(name, (x, y), fontsize=7)
    if paper:
        xs = sorted(PAPER_GAINS)
        axis.plot(xs, [PAPER_GAINS[x] for x in xs], "s--", label="paper (SPADE)")
    axis.set_xscale("log")
    axis.set_xlabel("model size (B parameters)")
    axis.set_ylabel("gain over base, Table 1 Avg (points)")
    axis.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
