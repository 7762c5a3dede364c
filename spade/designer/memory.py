"""The designer's memory of past environments, kept in SQLite in the run directory (SPEC section 5).

After the plays of a regeneration step the trainer stores one :class:`MemoryRecord` per valid
environment: its source (the prompt shows the first 2,000 characters), hint, skill, the win rate at
that step (share of no-hint plays with return > 0), the raw hint regret (not floored), the step
and free metadata. The designer prompt then shows up to three of them (:meth:`Memory.select_examples`):

* two **positives**, drawn with the caller's rng from the 10 same-skill records with the highest
  regret among those whose win rate lies in [0.15, 0.85] (ties: newer first), shown in that
  order (highest regret first) whichever two are drawn;
* one **negative**, a same-skill record the agent found too easy (win rate > 0.9) or too hard
  (< 0.1), as the released code draws it (``core/env_memory.py``, ``low_quality_examples`` with the
  skill): a skill with no negative of its own gets none.

The block (:func:`format_memory_block`) ends the designer prompt. It shows the positives with
their skill, win rate, regret and code excerpt, then names the negative in one line (too easy or
too hard, its win rate, its class), without its code, as the released prompt does. An empty memory
(or one with nothing that qualifies) gives no block.

**Seeding** (``selfplay.memory_seed_dir``; off in the paper recipes). :func:`load_seed_records`
reads a directory of example environments (``NAME.py``, with an optional ``NAME.json`` giving
``win_rate``, ``regret``, ``hint`` and ``skills``) and makes one record per example and skill, at
step 0, with ``metadata.seed = true``; :meth:`Memory.seed` stores those not stored yet. The
designer prompt then shows them through the same selection and block as any record, so a run
that starts from nothing already carries worked examples. Seed records age and are evicted like
the others.

**Capacity and eviction.** Only the newest ``capacity`` records (200) are live: selection, ``list``
and ``len`` see those alone, so the oldest record is evicted first. Evicted rows stay in the file
(a run writes a few thousand, tens of MB) so that :meth:`Memory.rollback` can undo the records of
steps after a checkpoint and restore exactly the live set the checkpoint saw; :meth:`Memory.prune`
deletes them for good.

**Durability.** Each :meth:`Memory.add_many` is one SQLite transaction (rollback journal,
``synchronous=FULL``): a crash mid-write leaves the database as of the last commit. The database
is the whole state; selection randomness comes only from the rng passed in, so a resumed run with
the same rng state draws the same examples.
"""

from __future__ import annotations

import json
import math
import random
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_CAPACITY",
    "EXCERPT_CHARS",
    "MEMORY_FILENAME",
    "Memory",
    "MemoryStoreError",
    "MemoryRecord",
    "MemorySelection",
    "format_memory_block",
    "load_seed_records",
    "memory_path",
    "win_rate",
]

MEMORY_FILENAME = "memory.sqlite"
DEFAULT_CAPACITY = 200
EXCERPT_CHARS = 2000
POSITIVE_WIN_RATE = (0.15, 0.85)   # inclusive
POSITIVE_POOL = 10                 # top records by regret to draw positives from
N_POSITIVES = 2
TOO_EASY = 0.9                     # win rate strictly above: too easy
TOO_HARD = 0.1                     # win rate strictly below: too hard
SEED_WIN_RATE = 0.5                # a seed example without NAME.json: well calibrated ...
SEED_REGRET = 0.25                 # ... and the hint helps
SEED_PREFIX = "seed-"
SCHEMA_VERSION = 1

_COLUMNS = "seq, env_id, skill, step, win_rate, regret, class_name, source, hint, metadata"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,  -- insertion order; never reused
    env_id     TEXT    NOT NULL UNIQUE,
    skill      TEXT    NOT NULL,
    step       INTEGER NOT NULL,
    win_rate   REAL    NOT NULL,
    regret     REAL    NOT NULL,
    class_name TEXT    NOT NULL,
    source     TEXT    NOT NULL,
    hint       TEXT    NOT NULL,
    metadata   TEXT    NOT NULL                    -- JSON object
);
CREATE INDEX IF NOT EXISTS records_step ON records (step);
CREATE TABLE IF NOT EXISTS info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class MemoryStoreError(Exception):
    """A memory database that cannot be opened or written as asked ."""


def memory_path(run_dir: str | Path) -> Path:
    """Where a run keeps its memory: ``RUN_DIR/memory.sqlite``."""
    return Path(run_dir) / MEMORY_FILENAME


def win_rate(returns: Sequence[float]) -> float:
    """Share of plays with return > 0 (the memory's win rate)."""
    if not returns:
        raise ValueError("win rate of no plays")
    return sum(1 for r in returns if r > 0) / len(returns)


@dataclass(frozen=True)
class MemoryRecord:
    """One environment as the memory keeps it. ``seq`` is assigned by the database on insertion."""

    env_id: str
    skill: str
    step: int
    win_rate: float
    regret: float
    source: str
    hint: str = ""
    class_name: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)
    seq: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.env_id, str) or not self.env_id:
            raise ValueError("memory record: env_id must be a non-empty string")
        if not isinstance(self.skill, str) or not self.skill:
            raise ValueError(f"memory record {self.env_id}: skill must be a non-empty string")
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise ValueError(f"memory record {self.env_id}: step must be an integer >= 0, got {self.step!r}")
        if not (isinstance(self.win_rate, (int, float)) and 0.0 <= self.win_rate <= 1.0):
            raise ValueError(f"memory record {self.env_id}: win_rate must lie in [0, 1], got {self.win_rate!r}")
        if not (isinstance(self.regret, (int, float)) and math.isfinite(self.regret)):
            raise ValueError(f"memory record {self.env_id}: regret must be a finite number, got {self.regret!r}")
        if not isinstance(self.metadata, Mapping):
            raise ValueError(f"memory record {self.env_id}: metadata must be a mapping")

    @property
    def excerpt(self) -> str:
        """What the designer prompt shows: the first 2,000 characters of the source."""
        return self.source[:EXCERPT_CHARS]

    @property
    def calibration(self) -> str:
        """``too easy``, ``too hard``, ``calibrated`` (positive-eligible) or ``between``."""
        if self.win_rate > TOO_EASY:
            return "too easy"
        if self.win_rate < TOO_HARD:
            return "too hard"
        low, high = POSITIVE_WIN_RATE
        return "calibrated" if low <= self.win_rate <= high else "between"


@dataclass(frozen=True)
class MemorySelection:
    """The records chosen for one designer prompt."""

    skill: str
    positives: tuple[MemoryRecord, ...] = ()
    negative: MemoryRecord | None = None

    @property
    def empty(self) -> bool:
        return not self.positives and self.negative is None

    def records(self) -> list[MemoryRecord]:
        return [*self.positives, *([self.negative] if self.negative else [])]


def _row_to_record(row: sqlite3.Row | tuple[Any, ...]) -> MemoryRecord:
    seq, env_id, skill, step, rate, regret, class_name, source, hint, metadata = row
    return MemoryRecord(env_id=env_id, skill=skill, step=step, win_rate=rate, regret=regret, source=source,
                        hint=hint, class_name=class_name, metadata=json.loads(metadata), seq=seq)


def _recover_hot_journal(path: Path) -> None:
    """Roll back a write a crashed process left half done, before a read-only connection looks.

    A read-only SQLite connection cannot roll back a hot journal and would see the torn pages. Any
    read-write connection does it on its first read (if a live writer holds the lock, the journal is
    not hot and this just reads). Without write access the read-only open reports the problem.
    """
    if not Path(f"{path}-journal").exists():
        return
    try:
        db = sqlite3.connect(path, timeout=30.0)
        try:
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        pass


class Memory:
    """A run's memory database. ``Memory(path)`` creates it if needed; ``readonly=True`` never writes."""

    def __init__(self, path: str | Path, capacity: int = DEFAULT_CAPACITY, *, readonly: bool = False):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"memory capacity must be a positive integer, got {capacity!r}")
        self.path = Path(path)
        self.readonly = readonly
        self.capacity = capacity
        if readonly and not self.path.is_file():
            raise MemoryStoreError(f"no memory database at {self.path}")
        try:
            if readonly:
                _recover_hot_journal(self.path)
                self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                           isolation_level=None, timeout=30.0)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
        except sqlite3.Error as exc:
            raise MemoryStoreError(f"cannot open memory database {self.path}: {exc}") from None
        try:
            if readonly:
                self._check_version(write=False)
            else:
                self._db.execute("PRAGMA journal_mode=DELETE")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.executescript(f"BEGIN IMMEDIATE;{_SCHEMA}COMMIT;")
                with self._transaction():
                    self._check_version(write=True)
                    self._db.execute("INSERT OR REPLACE INTO info VALUES ('capacity', ?)", (str(capacity),))
        except BaseException as exc:
            self._db.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise MemoryStoreError(f"cannot open memory database {self.path}: {exc}") from None
            raise

    @classmethod
    def open_readonly(cls, path: str | Path) -> Memory:
        """Open an existing database for reading, with the capacity the trainer last stored in it."""
        memory = cls(path, readonly=True)
        stored = memory._info("capacity")
        if stored is not None:
            memory.capacity = int(stored)
        return memory

    # -- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _info(self, key: str) -> str | None:
        try:
            row = self._db.execute("SELECT value FROM info WHERE key = ?", (key,)).fetchone()
        except sqlite3.OperationalError:
            return None
        return None if row is None else row[0]

    def _check_version(self, *, write: bool) -> None:
        version = self._info("schema_version")
        if version is None and write:
            self._db.execute("INSERT INTO info VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif version is None:
            raise MemoryStoreError(f"{self.path} is not a spade memory database")
        elif int(version) != SCHEMA_VERSION:
            raise MemoryStoreError(f"{self.path}: memory schema version {version}, this spade reads {SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _live(self, where: str = "", params: Sequence[Any] = (), order: str = "seq") -> list[MemoryRecord]:
        query = (f"WITH live AS (SELECT {_COLUMNS} FROM records ORDER BY seq DESC LIMIT ?) "
                 f"SELECT {_COLUMNS} FROM live {('WHERE ' + where) if where else ''} ORDER BY {order}")
        return [_row_to_record(row) for row in self._db.execute(query, (self.capacity, *params))]

    # -- writing ----------------------------------------------------------------------------

    def add(self, record: MemoryRecord) -> MemoryRecord:
        """Store one record (its own transaction); returns it with ``seq`` set."""
        return self.add_many([record])[0]

    def add_many(self, records: Iterable[MemoryRecord]) -> list[MemoryRecord]:
        """Store records in one transaction: all of them are committed, or none."""
        if self.readonly:
            raise MemoryStoreError(f"{self.path} is open read-only")
        rows = []
        for record in records:
            try:
                metadata = json.dumps(dict(record.metadata), sort_keys=True, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"memory record {record.env_id}: metadata is not JSON-serialisable: {exc}") from None
            rows.append((record, metadata))
        stored = []
        with self._transaction():
            for record, metadata in rows:
                try:
                    cursor = self._db.execute(
                        "INSERT INTO records (env_id, skill, step, win_rate, regret, class_name, source, hint, "
                        "metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (record.env_id, record.skill, record.step, float(record.win_rate), float(record.regret),
                         record.class_name, record.source, record.hint, metadata))
                except sqlite3.IntegrityError:
                    raise MemoryStoreError(f"{self.path}: env_id {record.env_id!r} is already in memory") from None
                stored.append(replace(record, seq=cursor.lastrowid))
        return stored

    def seed(self, records: Iterable[MemoryRecord]) -> list[MemoryRecord]:
        """Store the records whose ``env_id`` was never stored (evicted ones stay evicted), in one
        transaction; returns those added. Calling it again (say after a rollback) is harmless."""
        missing = [r for r in records if self.get(r.env_id, include_evicted=True) is None]
        return self.add_many(missing) if missing else []

    def rollback(self, after_step: int) -> int:
        """Delete the records of steps after ``after_step`` (resuming from a checkpoint); returns how many."""
        if self.readonly:
            raise MemoryStoreError(f"{self.path} is open read-only")
        with self._transaction():
            return self._db.execute("DELETE FROM records WHERE step > ?", (after_step,)).rowcount

    def prune(self) -> int:
        """Delete evicted records for good (``rollback`` can then no longer bring them back)."""
        if self.readonly:
            raise MemoryStoreError(f"{self.path} is open read-only")
        with self._transaction():
            return self._db.execute(
                "DELETE FROM records WHERE seq NOT IN (SELECT seq FROM records ORDER BY seq DESC LIMIT ?)",
                (self.capacity,)).rowcount

    # -- reading ----------------------------------------------------------------------------

    def __len__(self) -> int:
        (stored,) = self._db.execute("SELECT COUNT(*) FROM records").fetchone()
        return min(stored, self.capacity)

    def __contains__(self, env_id: object) -> bool:
        return isinstance(env_id, str) and self.get(env_id) is not None

    def list(self, skill: str | None = None) -> list[MemoryRecord]:
        """Live records, oldest first (optionally of one skill)."""
        return self._live("skill = ?", (skill,)) if skill is not None else self._live()

    def get(self, env_id: str, *, include_evicted: bool = False) -> MemoryRecord | None:
        """The record of ``env_id``, or None (also for an evicted one unless ``include_evicted``)."""
        if include_evicted:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM records WHERE env_id = ?", (env_id,)).fetchone()
            return None if row is None else _row_to_record(row)
        found = self._live("env_id = ?", (env_id,))
        return found[0] if found else None

    def is_live(self, record: MemoryRecord) -> bool:
        return self.get(record.env_id) is not None

    def select_examples(self, skill: str, rng: random.Random) -> MemorySelection:
        """Positives and negative for one designer prompt (rules in the module docstring).

        Uses ``rng`` for at most two draws: ``rng.sample`` for the positives (when any qualify),
        then ``rng.choice`` for the negative (when any qualify).
        """
        low, high = POSITIVE_WIN_RATE
        pool = self._live("skill = ? AND win_rate >= ? AND win_rate <= ?", (skill, low, high),
                          order="regret DESC, seq DESC")[:POSITIVE_POOL]
        # which positives is random; they are shown in the pool's order (highest regret first)
        chosen = sorted(rng.sample(range(len(pool)), min(N_POSITIVES, len(pool)))) if pool else []
        positives = tuple(pool[i] for i in chosen)
        negatives = self._live("skill = ? AND (win_rate > ? OR win_rate < ?)", (skill, TOO_EASY, TOO_HARD))
        negative = rng.choice(negatives) if negatives else None
        return MemorySelection(skill=skill, positives=positives, negative=negative)


# --------------------------------------------------------------------------
# Seeding


def _env_class(source: str) -> str:
    """The first top-level class whose name ends in ``Env`` ("" when none or unparsable)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    return next((node.name for node in tree.body if isinstance(node, ast.ClassDef) and node.name.endswith("Env")), "")


def _slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def load_seed_records(directory: str | Path, skills: Sequence[str]) -> list[MemoryRecord]:
    """Memory records for the example environments in ``directory`` (see the module docstring).

    Every ``*.py`` file (sorted) becomes one record per skill of ``skills`` (or of its own
    ``skills`` list in ``NAME.json``, which must be among ``skills``), with ``env_id``
    ``seed-NAME-SKILL``, step 0, and the win rate and regret of ``NAME.json`` (default 0.5 and
    0.25: a well-calibrated example, so the designer prompt shows it as a positive). Raises
    ``ValueError`` for a missing directory, one without examples, or a malformed ``NAME.json``.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"memory seed directory {root} does not exist")
    files = sorted(root.glob("*.py"))
    if not files:
        raise ValueError(f"memory seed directory {root} holds no example environment (*.py)")
    records = []
    for path in files:
        meta: dict[str, Any] = {}
        side = path.with_suffix(".json")
        if side.is_file():
            try:
                meta = json.loads(side.read_text())
            except ValueError as exc:
                raise ValueError(f"{side}: not JSON: {exc}") from None
            if not isinstance(meta, dict):
                raise ValueError(f"{side}: must hold a JSON object")
            unknown = set(meta) - {"win_rate", "regret", "hint", "skills", "class_name", "note"}
            if unknown:
                raise ValueError(f"{side}: unknown keys {sorted(unknown)}")
        chosen = meta.get("skills") or list(skills)
        if not isinstance(chosen, list) or not all(isinstance(name, str) for name in chosen):
            raise ValueError(f"{side}: skills must be a list of skill names")
        strangers = [name for name in chosen if name not in skills]
        if strangers:
            raise ValueError(f"{side}: skills {strangers} are not among this run's skills {list(skills)}")
        source = path.read_text()
        for skill in chosen:
            records.append(MemoryRecord(
                env_id=f"{SEED_PREFIX}{path.stem}-{_slug(skill)}", skill=skill, step=0,
                win_rate=float(meta.get("win_rate", SEED_WIN_RATE)), regret=float(meta.get("regret", SEED_REGRET)),
                source=source, hint=str(meta.get("hint", "")), class_name=str(meta.get("class_name") or _env_class(source)),
                metadata={"seed": True, "path": str(path)}))
    return records


# --------------------------------------------------------------------------
# The prompt block


def _fence(code: str) -> str:
    """Backticks longer than any run inside the code, so the block cannot end early."""
    longest = run = 0
    for char in code:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


def _code_block(record: MemoryRecord) -> str:
    excerpt = record.excerpt.rstrip("\n")
    if len(record.source) > EXCERPT_CHARS:
        excerpt += f"\n# [... excerpt: first {EXCERPT_CHARS:,} of {len(record.source):,} characters ...]"
    fence = _fence(excerpt)
    return f"{fence}python\n{excerpt}\n{fence}"


def format_memory_block(selection: MemorySelection) -> str:
    """The memory section that ends the designer prompt; ``""`` when nothing was selected.

    The positives with their code, then the negative as one line naming its class (no code)."""
    if selection.empty:
        return ""
    parts = []
    if selection.positives:
        parts += [
            "## Environments from your memory",
            "Environments you wrote earlier that trained the agent well: neither trivial nor hopeless. Take "
            "their structure and level of challenge as a guide, but write a different game.",
        ]
        for number, record in enumerate(selection.positives, start=1):
            parts.append(f"### Example {number} (skill: {record.skill}, win rate {record.win_rate:.2f}, "
                         f"regret {record.regret:.2f})\n{_code_block(record)}")
    negative = selection.negative
    if negative is not None:
        label = "too easy" if negative.win_rate > TOO_EASY else "too hard"
        parts.append("Do not write environments like this one:\n"
                     f"- {label} (win rate {negative.win_rate:.2f}): class {negative.class_name or negative.env_id}")
    return "\n\n".join(parts) + "\n"
