"""``spade eval report``: the paper's Tables 1-3 row by row (the paper's value of every cell where we
know it, ours beside it) and tables of any result directories, deltas against a base, the best
checkpoint of each run on the suite average, and the scaling figure (gain over base against model
size).

A cell of ours is empty when its benchmark is missing or was skipped, and when its run departs from
the paper's protocol (``off_protocol`` in summary.json: a tau2 / ACEBench run whose user simulator
is the model under test); the second kind is listed under the table with its value, never placed
in a column. An average is empty unless every column it averages is present. Rows that would read
alike (the same model evaluated twice, two runs named alike) carry the part of their path that
tells them apart (``label_apart``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from .paper_tables import (ACEBENCH_CATEGORIES, BFCL_GROUPS, DELTA, PAPER_ROWS, ROW_KEYS, SIZES, TABLE1_BENCHMARKS,
                           TABLE1_COLUMNS, TABLE2_COLUMNS, TABLE_COLUMNS, TABLES, TAU2_DOMAINS, paper_value)
from .runner import SUMMARY_FILE
from .protocol import DEFAULT_PROTOCOL, describe

TABLE1 = TABLE1_BENCHMARKS
PAPER_GAINS = {4.0: 5.2, 8.0: 5.7, 30.0: 8.1}  # SPADE's gain over base by model size (billions), SPEC.md
UNKNOWN = "?"
ABSENT = "—"


class ReportError(RuntimeError):
    """The report cannot be built (no results found, unreadable summary, unknown row)."""


@dataclass
class Row:
    label: str
    run: str
    step: Optional[int]
    directory: Path
    cells: dict[str, Optional[float]] = field(default_factory=dict)
    table2: dict[str, Optional[float]] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)  # benchmark -> why its score fills no column
    limit: Optional[int] = None  # run with --limit: a subset of every benchmark, never a paper cell
    protocol: str = DEFAULT_PROTOCOL  # the eval protocol that produced it (summary.json; absent: spade)


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(present) / len(present) if present and len(present) == len(values) else None


def _usable(benchmarks: Mapping[str, Any], name: str, excluded: dict[str, str]) -> Mapping[str, Any]:
    """The benchmark's summary entry, or {} when it is missing, skipped or off the paper's protocol."""
    entry = benchmarks.get(name) or {}
    if entry.get("off_protocol"):
        value = entry.get("score")
        excluded[name] = f"{entry['off_protocol']}" + (f" (score {float(value):.1f})" if value is not None else "")
        return {}
    if entry.get("skipped"):
        excluded[name] = f"skipped: {entry['skipped']}"
        return {}
    return entry


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
    row = Row(label if step is None or "@" in label else f"{label}@{step}", run, step, directory,
              limit=summary.get("limit"), protocol=str(summary.get("protocol") or DEFAULT_PROTOCOL))
    for column, name in TABLE1:
        score = _usable(benchmarks, name, row.excluded).get("score")
        row.cells[column] = None if score is None else float(score)
    row.cells["Avg"] = _mean([row.cells[c] for c, _ in TABLE1])
    for benchmark, parts, total in (("bfcl_multi_turn", BFCL_GROUPS, "BFCL"), ("tau2", TAU2_DOMAINS, "tau2"),
                                    ("acebench_agent", ACEBENCH_CATEGORIES, "ACEBench")):
        groups = _usable(benchmarks, benchmark, row.excluded).get("groups") or {}
        for column, group in parts:
            row.table2[column] = groups.get(group)
        # a benchmark's mean is empty unless every part was run: a part is never passed off as the whole
        row.table2[total] = _mean([row.table2[c] for c, _ in parts])
    row.table2["Avg"] = _mean([row.table2["BFCL"], row.table2["tau2"], row.table2["ACEBench"]])
    return row


def label_apart(rows: Sequence[Row]) -> None:
    """Rows of one run name whose labels collide (two evaluations of the same model, or two runs
    named alike at the same step) come from different runs: each row of that name gets the part of
    its run's path that tells them apart, ``label [results/a]``, in its label and its run (so the
    best checkpoint is picked per run). A run's path is its result directory, or, for a checkpoint
    (a row with a step), the directory above, where its other checkpoints' results sit too; rows
    that still collide there are told apart by their own directories."""
    by_run: dict[str, list[Row]] = {}
    for row in rows:
        by_run.setdefault(row.run, []).append(row)
    for run, members in by_run.items():
        if len({r.label for r in members}) == len(members):
            continue
        origins = [r.directory.parent if r.step is not None else r.directory for r in members]
        if len({(r.label, o) for r, o in zip(members, origins)}) < len(members):
            origins = [r.directory for r in members]
        for row, name in zip(members, _short_names(origins)):
            row.label, row.run = f"{row.label} [{name}]", f"{run} [{name}]"


def _short_names(paths: Sequence[Path]) -> list[str]:
    """The fewest trailing parts of each path that tell the distinct paths apart."""
    parts = [Path(os.path.abspath(p)).parts for p in paths]
    distinct = len(set(parts))
    for keep in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-keep:]) for p in parts]
        if len(set(names)) == distinct:
            return names
    return ["/".join(p) for p in parts]


def protocol_line(rows: Sequence[Row]) -> str:
    """Which evaluation protocol produced a table's rows: one line, or one per row when they differ."""
    used = sorted({row.protocol for row in rows})
    if len(used) == 1:
        return f"Evaluation protocol: {describe(used[0])}"
    per_row = "; ".join(f"{row.label}: {row.protocol}" for row in rows)
    return f"Evaluation protocols differ between rows (not comparable): {per_row}"


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


def _fmt(value: Any, empty: str = "") -> str:
    if value is None:
        return empty
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _table(title: str, columns: Sequence[str], rows: Sequence[Mapping[str, Any]], fmt: str) -> str:
    """Rows carry a ``label`` and their cells (numbers, None, or text already formatted)."""
    header = ["model", *columns]
    body = [[str(r.get("label", "")), *[_fmt(r.get(c), r.get("_empty", "")) for c in columns]] for r in rows]
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


# ---------------------------------------------------------------------------- the paper's rows


TABLE_BENCHMARKS = {"table1": tuple(n for _, n in TABLE1), "table3": tuple(n for _, n in TABLE1),
                    "table2": ("bfcl_multi_turn", "tau2", "acebench_agent")}


def parse_assignments(pairs: Sequence[str]) -> dict[str, Path]:
    """``KEY=DIR`` strings (``--row``) as {paper row key: directory}; ReportError names the keys."""
    assigned: dict[str, Path] = {}
    for pair in pairs:
        key, sep, directory = pair.partition("=")
        if not sep or not directory:
            raise ReportError(f"--row {pair}: expected KEY=DIR (e.g. t1/30b/spade=results/spade30b)")
        if key not in ROW_KEYS:
            raise ReportError(f"--row {pair}: unknown row {key!r}; rows: {', '.join(ROW_KEYS)}")
        assigned[key] = Path(directory)
    return assigned


def _table_values(row: Row, table: str) -> dict[str, Optional[float]]:
    return row.table2 if table == "table2" else row.cells


def pick_checkpoint(directory: Path, table: str) -> Row:
    """One result directory, or the parent of a run's checkpoint directories: the best on the
    table's average (the paper's checkpoint selection); with no complete average, the last step."""
    rows = [load_row(d) for d in find_result_dirs([directory])]
    complete = [r for r in rows if _table_values(r, table).get("Avg") is not None]
    if complete:
        return max(complete, key=lambda r: _table_values(r, table)["Avg"])  # type: ignore[arg-type,return-value]
    return max(rows, key=lambda r: -1 if r.step is None else r.step)


def paper_tables(assigned: Mapping[str, Path]) -> dict[str, list[dict[str, Any]]]:
    """Every paper row twice: the paper's cells (None: unknown to us) and ours (None: not run,
    skipped or off-protocol; ``excluded`` says which and why)."""
    chosen = {key: pick_checkpoint(path, ROW_KEYS[key].table) for key, path in assigned.items()}
    tables: dict[str, list[dict[str, Any]]] = {t: [] for t in TABLES}
    for row in PAPER_ROWS:
        columns = TABLE_COLUMNS[row.table]
        tables[row.table].append({"key": row.key, "source": "paper", "label": f"{row.label} (paper)",
                                  "_empty": UNKNOWN, **{c: paper_value(row, c) for c in columns}})
        ours = chosen.get(row.key)
        entry: dict[str, Any] = {"key": row.key, "source": "ours", "_empty": ABSENT,
                                 "label": f"{row.label} (ours: {ours.label})" if ours else f"{row.label} (ours: not given)",
                                 "run": str(ours.directory) if ours else None, "excluded": {}}
        values = _table_values(ours, row.table) if ours and ours.limit is None else {}
        for column in columns:
            entry[column] = values.get(column)
        if DELTA in columns:
            base = chosen.get(row.base_key) if row.base_key else None
            mine = values.get("Avg")
            ref = _table_values(base, row.table).get("Avg") if base else None
            entry[DELTA] = None if mine is None or ref is None else mine - ref
        if ours and ours.limit is not None:
            entry["excluded"] = {"all benchmarks": f"run with --limit {ours.limit} (a subset of the items)"}
        elif ours:
            entry["excluded"] = {b: why for b, why in ours.excluded.items() if b in TABLE_BENCHMARKS[row.table]}
        tables[row.table].append(entry)
    return tables


def _paper_markdown(tables: Mapping[str, list[dict[str, Any]]], fmt: str) -> list[str]:
    parts = []
    for table, rows in tables.items():
        text = _table(f"{TABLES[table]}, paper rows", TABLE_COLUMNS[table], rows, fmt)
        if fmt != "csv":
            notes = [f"- {r['label']}: {b}: {why}" for r in rows for b, why in r.get("excluded", {}).items()]
            text += (f"\n\n{UNKNOWN}: the paper's value is not known to us (SPEC.md gives only its headline "
                     f"numbers; the released repository publishes none). {ABSENT}: not run, skipped, or kept out "
                     "of the column (below).")
            if notes:
                text += "\n\nNot in the columns:\n" + "\n".join(notes)
        parts.append(text)
    return parts


def _strip(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


# ---------------------------------------------------------------------------- the report


def build_report(paths: Sequence[Path], *, base: Optional[Path] = None, fmt: str = "md", paper: bool = False,
                 plot: Optional[Path] = None, sizes: Optional[Mapping[str, float]] = None,
                 rows: Optional[Mapping[str, Path]] = None) -> str:
    """``paths``: result directories for free rows (Table 1/2 of whatever they hold). ``rows``:
    result directories assigned to paper rows (``--row KEY=DIR``); with them or with ``paper``,
    Tables 1-3 are rendered row by row, the paper's cells beside ours."""
    if not paths and not rows and not paper:
        raise ReportError("nothing to report: give result directories, --row KEY=DIR or --paper")
    found = [load_row(d) for d in find_result_dirs(paths)] if paths else []
    base_row = load_row(base) if base is not None else None
    label_apart(([base_row] if base_row is not None else []) + found)
    t1_cols = list(TABLE1_COLUMNS)
    t2_cols = list(TABLE2_COLUMNS)
    best1, best2 = best_per_run(found), best_per_run(found, table2=True)

    def dict_rows(table2: bool) -> list[dict[str, Any]]:
        out = []
        columns = t2_cols if table2 else t1_cols
        for row in ([base_row] if base_row is not None else []) + found:
            values = row.table2 if table2 else row.cells
            entry: dict[str, Any] = {"label": row.label, **{c: values.get(c) for c in columns}}
            best = (best2 if table2 else best1).get(row.run)
            entry["best"] = best is row
            if base_row is not None and row is not base_row:
                ref = (base_row.table2 if table2 else base_row.cells).get("Avg")
                entry[DELTA] = None if ref is None or values.get("Avg") is None else values["Avg"] - ref
            benchmarks = TABLE_BENCHMARKS["table2" if table2 else "table1"]
            entry["excluded"] = {b: why for b, why in row.excluded.items() if b in benchmarks}
            out.append(entry)
        return out

    table1, table2 = dict_rows(False), dict_rows(True)
    papers = paper_tables(rows or {}) if (rows or paper) else None
    if plot is not None or sizes:
        target = plot or (found[0].directory if found else Path(".")) / "scaling.png"
        write_scaling_plot(target, found, base_row, sizes or {}, paper, papers)
    if fmt == "json":
        out: dict[str, Any] = {}
        if found:
            out.update({"table1": table1, "table2": table2,
                        "protocols": {r.label: r.protocol for r in ([base_row] if base_row else []) + found},
                        "best_checkpoint": {run: r.label for run, r in best1.items()}})
        if papers is not None:
            out["paper_tables"] = {t: _strip(r) for t, r in papers.items()}
        return json.dumps(out, indent=1)
    extra = [DELTA] if base_row is not None else []
    parts = []
    if found:
        for table in (table1, table2):
            for entry in table:
                if entry.get("best") and entry["label"].count("@"):
                    entry["label"] += " (best)"
        for title, columns, table in (("Table 1: games", t1_cols, table1), ("Table 2: tool use", t2_cols, table2)):
            text = _table(title, columns + extra, table, fmt)
            if fmt == "md":
                text += "\n\n" + protocol_line(([base_row] if base_row is not None else []) + found)
            notes = [f"- {r['label']}: {b}: {why}" for r in table for b, why in r["excluded"].items()]
            if notes and fmt != "csv":
                text += "\n\nNot in the columns:\n" + "\n".join(notes)
            parts.append(text)
    if papers is not None:
        parts += _paper_markdown(papers, fmt)
    return ("\n" if fmt == "csv" else "\n\n").join(parts)


def write_scaling_plot(path: Path, rows: Sequence[Row], base_row: Optional[Row], sizes: Mapping[str, float],
                       paper: bool, papers: Optional[Mapping[str, list[dict[str, Any]]]] = None) -> Path:
    """Gain over base (Table 1 Avg) against model size: runs labelled with a size (``sizes``) and
    the SPADE rows of Table 1 given with ``--row`` (their size is the row's)."""
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
    billions = {key: value for key, _, value in SIZES}
    for entry in (papers or {}).get("table1", []):
        key = str(entry["key"])
        if entry["source"] == "ours" and key.endswith("/spade") and entry.get(DELTA) is not None:
            size_key = ROW_KEYS[key].size
            points.append((billions[size_key or ""], entry[DELTA], f"SPADE {size_key}"))
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
