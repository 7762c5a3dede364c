"""Reading the user-provided benchmark files (JSON lines, JSON, CSV, Parquet) from the data directory.

The data directory is ``--data DIR``, else ``$SPADE_EVAL_DATA``, else ``~/.cache/spade/eval_data``.
docs/evaluation.md lists the file each benchmark looks for and the fields it reads.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from .types import BenchmarkUnavailable

DATA_VARIABLE = "SPADE_EVAL_DATA"
SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def default_data_dir() -> Path:
    value = os.environ.get(DATA_VARIABLE)
    return Path(value).expanduser() if value else Path.home() / ".cache" / "spade" / "eval_data"


def find_file(data_dir: Optional[Path], stems: Sequence[str], what: str) -> Path:
    """The first ``DIR/<stem><suffix>`` that exists; BenchmarkUnavailable naming what to put where."""
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    for stem in stems:
        for suffix in SUFFIXES:
            path = root / f"{stem}{suffix}"
            if path.is_file():
                return path
    names = ", ".join(f"{s}.jsonl" for s in stems)
    raise BenchmarkUnavailable(f"no {what} data: put {names} (or .json/.csv/.parquet) in {root} "
                               "(see docs/evaluation.md)")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines, JSON (a list, or an object with a list under "data"/"rows"), CSV or
    Parquet file, as dicts."""
    path = Path(path)
    try:
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict):
                data = data.get("data") or data.get("rows") or []
            return list(data)
        if path.suffix == ".csv":
            with open(path, newline="", encoding="utf-8") as handle:
                return list(csv.DictReader(handle))
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:
        raise BenchmarkUnavailable(f"cannot read {path}: {exc}") from None
    raise BenchmarkUnavailable(f"{path}: unsupported file type (use {', '.join(SUFFIXES)})")


def field(row: dict[str, Any], names: Iterable[str], default: Any = None) -> Any:
    """The first of ``names`` present in ``row`` (exact, then case-insensitive)."""
    names = list(names)
    for name in names:
        if name in row and row[name] is not None:
            return row[name]
    lowered = {str(k).lower(): v for k, v in row.items()}
    for name in names:
        value = lowered.get(name.lower())
        if value is not None:
            return value
    return default
