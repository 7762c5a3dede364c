"""``spade pool export``: the admitted environments of a run or a pool as a dataset, and the way back
into a pool directory (``spade pool import`` of an export). docs/export.md describes the columns.

**What is exported.** From a run directory (it has ``envs/``): every environment of every
``envs/step_S/`` set, one row per (step, environment), named ``step_SSSSSS-ENV_ID``, with its play
statistics from ``trajectories/step_*.jsonl`` (the returns of its no-hint and hinted plays at the
step that generated it, and of its no-hint plays at later steps of its window). From a pool
directory (``NAME.py`` files, :mod:`spade.selfplay.sources.fixed_pool`'s format): one row per environment, named
``NAME``, with the metadata of its manifest line; a pool has no plays unless it was imported from
an export, whose statistics it keeps in its manifest and exports again unchanged.

**Layout** (``--out DIR``, which must not exist; written into a temporary sibling and renamed)::

    DIR/data/train.jsonl     (or data/train.parquet) one row per environment
    DIR/README.md            a dataset card whose header names the data file, so the Hugging Face
                             loader finds it from DIR alone
    DIR/spade_export.json    what was exported, from where, in which format (import reads it)

Both files read with ``datasets.load_dataset("json" | "parquet", data_files=...)``, pyarrow or
plain ``json``; the parquet file has the explicit schema :data:`SCHEMA`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

from ..designer.memory import win_rate
from ..durable_files import atomic_write_text
from ..envs.pool_files import HINT_SUFFIX, MANIFEST
from ..selfplay.sources.designer_source import read_saved_sets
from ..selfplay.sources.fixed_pool import read_pool
from ..selfplay.plays.trajectory_log import DIRECTORY as TRAJECTORIES

ExportFormat = Literal["jsonl", "parquet"]
FORMATS: tuple[str, ...] = ("jsonl", "parquet")
DATA_DIR = "data"
SPLIT = "train"
CARD = "README.md"
EXPORT_INFO = "spade_export.json"
FORMAT_VERSION = 1
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

Report = Callable[[str], None]


class PoolExportError(ValueError):
    """A source or an export that cannot be read (the message names the path and what is wrong)."""


@dataclass
class PlayStats:
    """The returns of an environment's plays as its run kept them (:mod:`spade.selfplay.plays.trajectory_log`)."""

    nohint_returns: list[float] = field(default_factory=list)   # at the step that generated it
    hint_returns: list[float] = field(default_factory=list)     # at the step that generated it
    later_nohint_returns: list[float] = field(default_factory=list)  # later steps of its window

    @property
    def win_rate(self) -> float | None:
        """Share of the generation step's no-hint plays with return > 0 (the memory's win rate)."""
        return win_rate(self.nohint_returns) if self.nohint_returns else None

    @property
    def mean_nohint_return(self) -> float | None:
        return _mean(self.nohint_returns)

    @property
    def regret(self) -> float | None:
        """Mean hinted minus mean no-hint return at the generation step (not floored)."""
        hint, nohint = _mean(self.hint_returns), _mean(self.nohint_returns)
        return None if hint is None or nohint is None else hint - nohint


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass
class ExportRow:
    """One environment of the dataset (a row; docs/export.md)."""

    name: str
    code: str
    hint: str
    skill: str | None
    class_name: str | None
    step: int | None            # the training step whose set it was generated for
    document: str | None        # the corpus document it was seeded with
    max_turns: int | None
    origin: str                 # JSON text: where it came from
    nohint_returns: list[float]
    hint_returns: list[float]
    later_nohint_returns: list[float]
    win_rate: float | None
    mean_nohint_return: float | None
    regret: float | None

    @classmethod
    def build(cls, *, name: str, code: str, hint: str, skill: Any, class_name: Any, step: Any, document: Any,
              max_turns: Any, origin: dict[str, Any], plays: PlayStats) -> "ExportRow":
        return cls(name=name, code=code, hint=hint, skill=_text(skill), class_name=_text(class_name),
                   step=_integer(step), document=_text(document), max_turns=_integer(max_turns),
                   origin=json.dumps(origin, sort_keys=True), nohint_returns=list(plays.nohint_returns),
                   hint_returns=list(plays.hint_returns), later_nohint_returns=list(plays.later_nohint_returns),
                   win_rate=plays.win_rate, mean_nohint_return=plays.mean_nohint_return, regret=plays.regret)

    @property
    def plays(self) -> PlayStats:
        return PlayStats(list(self.nohint_returns), list(self.hint_returns), list(self.later_nohint_returns))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


COLUMNS = tuple(f.name for f in fields(ExportRow))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def schema() -> Any:
    """The parquet schema (pyarrow), one field per :class:`ExportRow` field."""
    import pyarrow as pa

    returns = pa.list_(pa.float64())
    types = {"name": pa.string(), "code": pa.string(), "hint": pa.string(), "skill": pa.string(),
             "class_name": pa.string(), "step": pa.int64(), "document": pa.string(), "max_turns": pa.int64(),
             "origin": pa.string(), "nohint_returns": returns, "hint_returns": returns,
             "later_nohint_returns": returns, "win_rate": pa.float64(), "mean_nohint_return": pa.float64(),
             "regret": pa.float64()}
    assert tuple(types) == COLUMNS
    return pa.schema([pa.field(name, kind, nullable=name not in ("name", "code", "hint", "origin"))
                      for name, kind in types.items()])


# ---------------------------------------------------------------------------- reading a source


def _run_plays(run: Path) -> dict[tuple[int, str], PlayStats]:
    """``(generated step, env id) -> plays`` from the run's ``env_returns`` lines."""
    plays: dict[tuple[int, str], PlayStats] = {}
    directory = run / TRAJECTORIES
    if not directory.is_dir():
        return plays
    for path in sorted(directory.glob("step_*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line being written by a live run
            if not isinstance(record, dict) or record.get("kind") != "env_returns":
                continue
            generated, step = record.get("generated_step"), record.get("step")
            if not isinstance(generated, int) or not isinstance(step, int):
                continue
            stats = plays.setdefault((generated, str(record.get("env_id"))), PlayStats())
            nohint = [float(r) for r in record.get("nohint_returns") or []]
            if step == generated:
                stats.nohint_returns.extend(nohint)
                stats.hint_returns.extend(float(r) for r in record.get("hint_returns") or [])
            else:
                stats.later_nohint_returns.extend(nohint)
    return plays


def _run_rows(run: Path) -> Iterator[ExportRow]:
    plays = _run_plays(run)
    for saved in read_saved_sets(run):
        meta = saved.meta
        generated = _integer(meta.get("generated_step"))
        generated = saved.step if generated is None else generated
        yield ExportRow.build(
            name=f"step_{saved.step:06d}-{saved.env_id}", code=saved.source, hint=saved.hint,
            skill=meta.get("skill"), class_name=meta.get("class_name"), step=generated,
            document=meta.get("document"), max_turns=meta.get("max_turns"),
            origin={"run": str(run.resolve()), "env_id": saved.env_id, "step": saved.step},
            plays=plays.get((generated, saved.env_id), PlayStats()))


def _pool_rows(pool: Path) -> Iterator[ExportRow]:
    for entry in read_pool(pool):
        record = entry.record
        source = record.get("source")
        origin = source if isinstance(source, dict) else {"pool": str(pool.resolve()), "name": entry.name}
        step = record.get("step")
        if step is None and isinstance(source, dict):
            step = source.get("step")
        stats = record.get("plays")
        plays = PlayStats(**{key: [float(v) for v in stats.get(key) or []] for key in
                             ("nohint_returns", "hint_returns", "later_nohint_returns")}) \
            if isinstance(stats, dict) else PlayStats()
        yield ExportRow.build(name=entry.name, code=entry.path.read_text(encoding="utf-8"), hint=entry.hint(),
                              skill=entry.skill, class_name=record.get("class_name"), step=step,
                              document=record.get("document"), max_turns=record.get("max_turns"),
                              origin=origin, plays=plays)


def source_kind(source: Path) -> Literal["run", "pool"]:
    if (source / "envs").is_dir():
        return "run"
    if source.is_dir() and any(source.glob("*.py")):
        return "pool"
    raise PoolExportError(f"{source}: neither a run directory (no envs/) nor a pool directory (no NAME.py files)")


def read_rows(source: Path | str) -> list[ExportRow]:
    """The rows of the run or pool directory ``source``."""
    source = Path(source)
    rows = list(_run_rows(source) if source_kind(source) == "run" else _pool_rows(source))
    if not rows:
        raise PoolExportError(f"{source}: holds no admitted environment to export")
    return rows


# ---------------------------------------------------------------------------- writing the dataset


def data_file(directory: Path, fmt: str) -> Path:
    return Path(directory) / DATA_DIR / f"{SPLIT}.{fmt}"


def _card(rows: list[ExportRow], fmt: str, source: Path, kind: str) -> str:
    skills: dict[str, int] = {}
    for row in rows:
        skills[row.skill or "(none)"] = skills.get(row.skill or "(none)", 0) + 1
    lines = ["---", "configs:", "- config_name: default", "  data_files:", f"  - split: {SPLIT}",
             f"    path: {DATA_DIR}/{SPLIT}.{fmt}", "---", "",
             f"# Environments exported by spade from a {kind}", "",
             f"{len(rows)} admitted environments of `{source.name}`, one row each: `code` is the environment's "
             "Python source (a class with `reset(seed)` and `step(action)`), `hint` its privileged hint, with "
             "the skill, the step, the seed document and the returns of its plays. spade's docs/export.md "
             "describes every column; `spade pool import --from THIS_DIR --out POOL` makes a pool of it again.",
             "", "| skill | environments |", "|---|---|"]
    lines += [f"| {skill} | {count} |" for skill, count in sorted(skills.items())]
    return "\n".join(lines) + "\n"


def _write_data(rows: list[ExportRow], path: Path, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        with open(path, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row.to_json(), ensure_ascii=False, allow_nan=False) + "\n")
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([row.to_json() for row in rows], schema=schema())
    pq.write_table(table, path)


@dataclass
class ExportSummary:
    out: Path
    rows: int
    kind: str
    data_file: Path
    with_plays: int


def export_dataset(source: Path | str, out: Path | str, *, fmt: str = "jsonl") -> ExportSummary:
    """Write the environments of ``source`` (a run or a pool) as a dataset at ``out`` (module docstring)."""
    if fmt not in FORMATS:
        raise PoolExportError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    source, out = Path(source), Path(out)
    if out.exists():
        raise PoolExportError(f"--out: {out} exists; give a new directory")
    kind = source_kind(source)
    rows = read_rows(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}.exporting-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        _write_data(rows, data_file(work, fmt), fmt)
        (work / CARD).write_text(_card(rows, fmt, source, kind), encoding="utf-8")
        info = {"format_version": FORMAT_VERSION, "format": fmt, "data_file": f"{DATA_DIR}/{SPLIT}.{fmt}",
                "source": str(source.resolve()), "kind": kind, "rows": len(rows), "columns": list(COLUMNS),
                "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        atomic_write_text(work / EXPORT_INFO, json.dumps(info, indent=1))
        os.rename(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return ExportSummary(out, len(rows), kind, data_file(out, fmt), sum(1 for r in rows if r.nohint_returns))


# ---------------------------------------------------------------------------- reading it back


def is_export(directory: Path | str) -> bool:
    return (Path(directory) / EXPORT_INFO).is_file()


def read_export(directory: Path | str) -> list[ExportRow]:
    """The rows of an export written by :func:`export_dataset`."""
    directory = Path(directory)
    try:
        info = json.loads((directory / EXPORT_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PoolExportError(f"{directory / EXPORT_INFO}: not readable ({exc})") from None
    if not isinstance(info, dict) or info.get("format") not in FORMATS or info.get("format_version") != FORMAT_VERSION:
        raise PoolExportError(f"{directory / EXPORT_INFO}: not a spade export of format version {FORMAT_VERSION}")
    path = directory / str(info.get("data_file", ""))
    if not path.is_file():
        raise PoolExportError(f"{path}: the export's data file is missing")
    if info["format"] == "jsonl":
        records = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                raise PoolExportError(f"{path}:{number}: not a JSON line") from None
    else:
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()
    rows = []
    for number, record in enumerate(records, 1):
        missing = [c for c in COLUMNS if not isinstance(record, dict) or c not in record]
        if missing:
            raise PoolExportError(f"{path}: row {number} lacks the columns {', '.join(missing)}")
        row = ExportRow(**{c: record[c] for c in COLUMNS})
        if not isinstance(row.name, str) or not NAME_PATTERN.fullmatch(row.name):
            raise PoolExportError(f"{path}: row {number}: name {row.name!r} is not a file name "
                                  "(letters, digits, '_', '.', '-')")
        if not isinstance(row.code, str):
            raise PoolExportError(f"{path}: row {number} ({row.name}): code is not text")
        rows.append(row)
    seen: set[str] = set()
    for row in rows:
        if row.name in seen:
            raise PoolExportError(f"{path}: the name {row.name!r} is on two rows")
        seen.add(row.name)
    if len(rows) != info.get("rows"):
        raise PoolExportError(f"{path}: {len(rows)} rows, {directory / EXPORT_INFO} says {info.get('rows')}")
    return rows


@dataclass
class ExportImportSummary:
    out: Path
    total: int
    per_skill: dict[str, int]


def import_export(source: Path | str, out: Path | str, *, expect: int | None = None) -> ExportImportSummary:
    """Make the new pool directory ``out`` from the export at ``source``: ``NAME.py`` (the code as
    exported), ``NAME.hint.txt`` and a manifest line with the row's metadata (``plays`` holds its
    returns, exported again unchanged). Nothing is left behind when a row is malformed."""
    source, out = Path(source), Path(out)
    if out.exists():
        raise PoolExportError(f"--out: {out} exists; give a new directory (an import never merges into a pool)")
    rows = read_export(source)
    if expect is not None and len(rows) != expect:
        raise PoolExportError(f"--expect: {source} holds {len(rows)} environments, not {expect}")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}.importing-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    per_skill: dict[str, int] = {}
    try:
        lines = []
        for number, row in enumerate(rows):
            (work / f"{row.name}.py").write_text(row.code, encoding="utf-8")
            (work / f"{row.name}{HINT_SUFFIX}").write_text(row.hint, encoding="utf-8")
            try:
                origin = json.loads(row.origin)
            except (TypeError, ValueError):
                origin = {"text": row.origin}
            plays = row.plays
            lines.append(json.dumps({
                "name": row.name, "skill": row.skill, "class_name": row.class_name, "hint": row.hint,
                "step": row.step, "document": row.document, "max_turns": row.max_turns, "source": origin,
                "plays": asdict(plays), "dataset": {"path": str(source.resolve()), "row": number},
            }, sort_keys=True))
            label = row.skill or "(no skill)"
            per_skill[label] = per_skill.get(label, 0) + 1
        (work / MANIFEST).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.rename(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return ExportImportSummary(out, len(rows), per_skill)
