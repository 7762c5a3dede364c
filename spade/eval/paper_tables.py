"""The paper's result tables as data: every row of Tables 1-3, its columns, and the cells whose
published value we know.

Known values come from ``SPEC.md`` section 2 (the headline numbers of arXiv 2608.19197); the
released repository (spade-rl/spade: ``eval_offline/render_table.py``, ``table_mapping.py``)
renders one row at a time and publishes no per-column numbers. Every other cell is unknown to us
and stays unknown (rendered ``?``), never filled in. Columns follow ``shared/notes/eval_protocol.md``:
Table 1 the eight held-out game benchmarks and their unweighted mean, Table 2 BFCL v4 multi-turn
(four categories and their mean), tau2-bench (three domains and their mean), ACEBench-Agent (its two
categories and their mean) and the mean of the three, Table 3 the ablations (30B-A3B, games) on the
Table 1 columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

# (column, benchmark name in summary.json)
TABLE1_BENCHMARKS = (("AIME'25", "aime25"), ("AIME'26", "aime26"), ("GPQA-D", "gpqa_diamond"), ("LCB-v6", "lcb_v6"),
                     ("RG-Math", "rg_math"), ("RG-Algo", "rg_algorithmic"), ("RG-Cog", "rg_cognition"),
                     ("RG-Logic", "rg_logic"))
# (column, group of the benchmark's summary entry)
BFCL_GROUPS = (("BFCL-base", "base"), ("BFCL-miss-func", "miss_func"), ("BFCL-miss-param", "miss_param"),
               ("BFCL-long-ctx", "long_context"))
TAU2_DOMAINS = (("tau2-retail", "retail"), ("tau2-airline", "airline"), ("tau2-telecom", "telecom"))
ACEBENCH_CATEGORIES = (("ACE-multi-step", "multi_step"), ("ACE-multi-turn", "multi_turn"))

TABLE1_COLUMNS = tuple(c for c, _ in TABLE1_BENCHMARKS) + ("Avg",)
TABLE2_COLUMNS = (tuple(c for c, _ in BFCL_GROUPS) + ("BFCL",) + tuple(c for c, _ in TAU2_DOMAINS) + ("tau2",)
                  + tuple(c for c, _ in ACEBENCH_CATEGORIES) + ("ACEBench", "Avg"))
DELTA = "Δ base"

TABLES = {"table1": "Table 1: games (held-out reasoning)", "table2": "Table 2: tool use",
          "table3": "Table 3: ablations (Qwen3-30B-A3B, games)"}
TABLE_COLUMNS = {"table1": TABLE1_COLUMNS + (DELTA,), "table2": TABLE2_COLUMNS + (DELTA,),
                 "table3": TABLE1_COLUMNS}

SIZES = (("4b", "Qwen3-4B-Instruct-2507", 4.0), ("8b", "Qwen3-8B", 8.0), ("30b", "Qwen3-30B-A3B-Instruct-2507", 30.0))
SOURCE = "SPEC.md §2"


@dataclass(frozen=True)
class PaperRow:
    """One row of a paper table. ``key`` names it on the command line (``--row KEY=DIR``);
    ``published`` holds the cells whose paper value we know; ``base_key`` is the row its
    ``Δ base`` is taken against."""

    key: str
    table: str
    label: str
    published: Mapping[str, float] = field(default_factory=dict)
    base_key: Optional[str] = None
    size: Optional[str] = None


def _rows() -> tuple[PaperRow, ...]:
    games_30b = {"base": 50.2, "grpo": 51.4, "rlve": 53.0, "spade": 58.3}
    gains = {"4b": 5.2, "8b": 5.7, "30b": 8.1}  # SPADE over base, Table 1 Avg
    methods = (("base", "base"), ("grpo", "Fixed-env GRPO"), ("rlve", "Fixed-env RLVE"), ("spade", "SPADE"))
    rows: list[PaperRow] = []
    for size, model, _ in SIZES:
        for method, name in methods:
            published: dict[str, float] = {}
            if size == "30b":
                published["Avg"] = games_30b[method]
            if method == "spade":
                published[DELTA] = gains[size]
            rows.append(PaperRow(f"t1/{size}/{method}", "table1", f"{model} · {name}", published,
                                 None if method == "base" else f"t1/{size}/base", size))
    tool_30b = {"base": {"BFCL": 49.0, "tau2": 49.0, "ACEBench": 62.0},
                "spade": {"BFCL": 54.7, "tau2": 52.6, "ACEBench": 75.9}}
    for size, model, _ in SIZES:
        for method, name in (("base", "base"), ("spade", "SPADE")):
            published = dict(tool_30b[method]) if size == "30b" else {}
            rows.append(PaperRow(f"t2/{size}/{method}", "table2", f"{model} · {name}", published,
                                 None if method == "base" else f"t2/{size}/base", size))
    ablations = (("spade", "SPADE (full)", 58.3), ("grpo", "Fixed-env GRPO (frozen GPT-5.5 pool)", 51.4),
                 ("no_corpus", "no corpus grounding", 53.5), ("no_memory", "no environment memory", 53.2),
                 ("frozen_designer_no_memory", "frozen designer, no memory", 40.5),
                 ("two_skill", "2-skill curriculum", 53.7),
                 ("learning_potential", "learning-potential designer reward (EMA)", 55.9),
                 ("solve_rate", "solve-rate plateau reward only", None))
    for key, name, avg in ablations:
        rows.append(PaperRow(f"t3/{key}", "table3", name, {} if avg is None else {"Avg": avg}, size="30b"))
    return tuple(rows)


PAPER_ROWS: tuple[PaperRow, ...] = _rows()
ROW_KEYS = {row.key: row for row in PAPER_ROWS}


def paper_value(row: PaperRow, column: str) -> Optional[float]:
    """The published value of a cell, or one that follows from published values (an average of
    published parts, a difference of published averages); None when unknown to us."""
    if column in row.published:
        return row.published[column]
    if row.table == "table2" and column == "Avg":
        parts = [row.published.get(c) for c in ("BFCL", "tau2", "ACEBench")]
        return sum(parts) / 3 if all(p is not None for p in parts) else None  # type: ignore[arg-type]
    if column == DELTA and row.base_key is not None:
        base = ROW_KEYS[row.base_key]
        mine, ref = paper_value(row, "Avg"), paper_value(base, "Avg")
        return None if mine is None or ref is None else mine - ref
    return None
