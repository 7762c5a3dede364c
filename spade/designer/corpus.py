"""The grounding corpus: documents the designer builds environments around (SPEC section 5).

Three file formats are read, chosen by suffix:

* ``.jsonl`` -- one JSON object per line. Indexed, not loaded: one pass parses every line (so a
  bad line or a corpus without the text field fails at start-up, naming file and line) and keeps
  only the byte offset, length and line number of each usable line in ``array('q')`` columns, 24
  bytes per document: 15k documents cost about 360 KB whatever their size; a draw seeks and reads
  one line.
* ``.jsonl.gz`` -- the same records, gzip-compressed. gzip has no random access, so the texts are
  held in memory (budget about the uncompressed size; decompress big corpora to ``.jsonl``).
* ``.parquet`` -- the text column only is read (pyarrow, imported on first use) and kept as an
  Arrow array, i.e. about the raw text size in memory.

The text field is ``CorpusSettings.text_field`` if set; otherwise each record's ``text``, else its
``orig_doc`` (Parquet: the first of those columns the file has). Records without the field, and
records whose text is null or blank, are skipped but counted: ``Corpus.skipped_warnings`` (also
logged once at start-up) says per file how many of each and the first line (Parquet: row) of each;
a file where no record has the field is an error. Draws are uniform over all usable documents of all files and take a
``random.Random`` from the caller, so the sequence of documents is a pure function of the rng state
(checkpoint ``rng.getstate()`` or derive one rng per attempt with :func:`attempt_rng`).
"""

from __future__ import annotations

import bisect
import glob
import gzip
import json
import logging
import os
import random
import re
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..config import ConfigError, require

log = logging.getLogger(__name__)

__all__ = [
    "Corpus",
    "CorpusError",
    "CorpusSettings",
    "DEFAULT_TEXT_FIELDS",
    "DOCUMENT_SPACINGS",
    "Document",
    "GAMES_MAX_WORDS",
    "TOOL_USE_MAX_WORDS",
    "TRUNCATION_MARKER",
    "attempt_rng",
    "truncate_words",
]

GAMES_MAX_WORDS = 6000
TOOL_USE_MAX_WORDS = 4000
DEFAULT_TEXT_FIELDS = ("text", "orig_doc")
TRUNCATION_MARKER = "\n[... document truncated ...]"
SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
DOCUMENT_SPACINGS = ("keep", "released")
_WORD = re.compile(r"\S+")
_GLOB_CHARS = frozenset("*?[")


class CorpusError(ConfigError):
    """An unreadable corpus; the message names the file (and line or row where there is one)."""


@dataclass(frozen=True)
class CorpusSettings:
    """Where the corpus lives and how documents are cut.

    ``paths``: files, directories (every ``*.jsonl``, ``*.jsonl.gz``, ``*.parquet`` inside) or glob
    patterns, relative to the directory given to :class:`Corpus` (default: the working directory).
    ``seed``: the seed the trainer builds its document rng from (see :func:`attempt_rng`).
    """

    paths: tuple[str, ...] = ()
    text_field: str | None = None
    # a document longer than this many words is cut (games 6,000; tool use 4,000)
    max_words: int = GAMES_MAX_WORDS
    truncation_marker: str = TRUNCATION_MARKER  # appended to a cut document
    seed: int = 0
    # "keep": a document keeps its own spacing, a cut one up to its last kept word. "released": as the
    # released core/corpus.py (spade-rl/spade 9b2b813, :75 and :110-116) every document is stripped
    # at its ends and a cut one is its first max_words words joined by single spaces (newlines,
    # paragraphs and code indentation of the kept part collapse).
    document_spacing: str = "keep"
    # true (the reproduction recipes): a run refuses to start while ``paths`` holds the demo corpus
    # (examples/corpus/demo*), which is for the smoke run; see :func:`demo_corpus_files`.
    require_real: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.paths, str):  # a lone string is a one-element list, not characters
            object.__setattr__(self, "paths", (self.paths,))
        require(self.max_words > 0, "corpus.max_words", f"must be positive, got {self.max_words}")
        require(isinstance(self.require_real, bool), "corpus.require_real",
                f"must be true or false, got {self.require_real!r}")
        require(self.document_spacing in DOCUMENT_SPACINGS, "corpus.document_spacing",
                f"{self.document_spacing!r} is not allowed; choose one of: {', '.join(DOCUMENT_SPACINGS)}")
        require(self.text_field is None or bool(self.text_field.strip()), "corpus.text_field",
                "must be a non-empty field name (or null for 'text', then 'orig_doc')")

    @classmethod
    def for_domain(cls, domain: str, paths: tuple[str, ...] | list[str] | str, **overrides: Any) -> CorpusSettings:
        """The paper's word limit for ``games`` (6,000) or ``tool_use`` (4,000)."""
        limits = {"games": GAMES_MAX_WORDS, "tool_use": TOOL_USE_MAX_WORDS}
        if domain not in limits:
            raise ConfigError(f"corpus domain {domain!r} is not one of: {', '.join(limits)}")
        paths = (paths,) if isinstance(paths, str) else tuple(paths)
        return cls(paths=paths, **{"max_words": limits[domain], **overrides})


@dataclass(frozen=True)
class Document:
    """One drawn document, already cut to ``max_words``.

    ``path`` and ``position`` locate the record (1-based line for JSONL, 0-based row for Parquet);
    ``doc_id`` is the record's ``id`` field when it has one; ``words`` counts the uncut text.
    """

    text: str
    path: str
    position: int
    doc_id: str | None
    words: int
    truncated: bool

    @property
    def key(self) -> str:
        """A stable reference to the record, for logs and environment metadata."""
        return f"{self.path}:{self.position}"


def truncate_words(text: str, max_words: int, marker: str = TRUNCATION_MARKER,
                   spacing: str = "keep") -> tuple[str, int, bool]:
    """Cut ``text`` after ``max_words`` whitespace-separated words and append ``marker``.

    ``spacing`` "keep": the kept part keeps its original spacing; "released": the text is stripped
    and a cut one's kept words are joined by single spaces (``CorpusSettings.document_spacing``).
    Returns ``(text, words_in_original, truncated)``.
    """
    if spacing == "released":
        words = text.split()
        if len(words) <= max_words:
            return text.strip(), len(words), False
        return " ".join(words[:max_words]) + marker, len(words), True
    end = 0
    count = 0
    for match in _WORD.finditer(text):
        count += 1
        if count == max_words:
            end = match.end()
        elif count > max_words:
            return text[:end] + marker, count + sum(1 for _ in _WORD.finditer(text, match.end())), True
    return text, count, False


def attempt_rng(seed: int, *keys: int | str) -> random.Random:
    """A fresh rng for one draw, e.g. ``attempt_rng(seed, step, slot, attempt)``.

    String seeds are hashed with SHA-512 by :class:`random.Random`, so this is stable across
    processes and Python runs: a resumed run draws the same documents without saved rng state.
    """
    return random.Random(":".join(str(part) for part in (seed, *keys)))


# --------------------------------------------------------------------------
# Readers


class _Source(Protocol):
    path: str
    skipped_warnings: list[str]

    def __len__(self) -> int: ...

    def get(self, index: int) -> tuple[str, int, str | None]:
        """The text, position and id of the index-th usable document."""
        ...


def _record_text(record: Any, field: str | None, where: str) -> tuple[str | None, bool]:
    """(text or None when unusable, whether the record had the field at all)."""
    if not isinstance(record, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(record).__name__}")
    names = (field,) if field else DEFAULT_TEXT_FIELDS
    for name in names:
        if name in record:
            value = record[name]
            if value is None:
                return None, True
            if not isinstance(value, str):
                raise CorpusError(f"{where}: field {name!r} is {type(value).__name__}, expected a string")
            return (value if value.strip() else None), True
    return None, False


class _Skips:
    """Records skipped in one file: without the text field, or with a null/blank text; the count
    and first line (or row) of each."""

    def __init__(self) -> None:
        self.counts = {"missing": 0, "empty": 0}
        self.first: dict[str, int] = {}

    def add(self, has_field: bool, line_no: int) -> None:
        reason = "empty" if has_field else "missing"
        self.counts[reason] += 1
        self.first.setdefault(reason, line_no)

    def warnings(self, path: str, field: str | None, records: int, unit: str = "line") -> list[str]:
        out = []
        if self.counts["missing"]:
            out.append(f"corpus file {path}: skipped {self.counts['missing']} of {records} records without a "
                       f"{_field_names(field)} field (the first at {unit} {self.first['missing']})")
        if self.counts["empty"]:
            out.append(f"corpus file {path}: skipped {self.counts['empty']} of {records} records whose text is "
                       f"null or blank (the first at {unit} {self.first['empty']})")
        return out


def _record_id(record: dict[str, Any]) -> str | None:
    value = record.get("id")
    return None if value is None else str(value)


def _field_names(field: str | None) -> str:
    return repr(field) if field else " or ".join(repr(name) for name in DEFAULT_TEXT_FIELDS)


def _no_text_error(path: str, field: str | None, records: int, had_field: int) -> CorpusError:
    if records == 0:
        return CorpusError(f"corpus file {path}: no records")
    if had_field == 0:
        return CorpusError(f"corpus file {path}: no record has a {_field_names(field)} field ({records} records)")
    return CorpusError(f"corpus file {path}: every {_field_names(field)} field is empty ({records} records)")


def _parse_line(raw: bytes, path: str, line_no: int) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorpusError(f"{path}:{line_no}: not valid JSON: {exc}") from None


class _JsonlIndex:
    """Byte offsets of the usable lines of a plain JSONL file; a draw reads one line."""

    def __init__(self, path: str, field: str | None):
        self.path, self.field = path, field
        self.offsets, self.lengths, self.lines = array("q"), array("q"), array("q")
        records = had_field = 0
        skips = _Skips()
        with open(path, "rb") as handle:
            offset = 0
            for line_no, raw in enumerate(handle, start=1):
                size = len(raw)
                if raw.strip():
                    records += 1
                    text, has = _record_text(_parse_line(raw, path, line_no), field, f"{path}:{line_no}")
                    had_field += has
                    if text is not None:
                        self.offsets.append(offset)
                        self.lengths.append(size)
                        self.lines.append(line_no)
                    else:
                        skips.add(has, line_no)
                offset += size
        if not self.offsets:
            raise _no_text_error(path, field, records, had_field)
        self.skipped_warnings = skips.warnings(path, field, records)
        stat = os.stat(path)
        self._stamp = (stat.st_size, stat.st_mtime_ns)

    def __len__(self) -> int:
        return len(self.offsets)

    def get(self, index: int) -> tuple[str, int, str | None]:
        stat = os.stat(self.path)
        if (stat.st_size, stat.st_mtime_ns) != self._stamp:
            raise CorpusError(f"corpus file {self.path} changed after it was indexed; restart to re-index")
        with open(self.path, "rb") as handle:
            handle.seek(self.offsets[index])
            raw = handle.read(self.lengths[index])
        line_no = self.lines[index]
        record = _parse_line(raw, self.path, line_no)
        text, _ = _record_text(record, self.field, f"{self.path}:{line_no}")
        assert text is not None
        return text, line_no, _record_id(record)


class _GzipJsonl:
    """A gzip-compressed JSONL file, held in memory."""

    def __init__(self, path: str, field: str | None):
        self.path = path
        self.items: list[tuple[str, int, str | None]] = []
        records = had_field = 0
        skips = _Skips()
        try:
            with gzip.open(path, "rb") as handle:
                for line_no, raw in enumerate(handle, start=1):
                    if not raw.strip():
                        continue
                    records += 1
                    record = _parse_line(raw, path, line_no)
                    text, has = _record_text(record, field, f"{path}:{line_no}")
                    had_field += has
                    if text is not None:
                        self.items.append((text, line_no, _record_id(record)))
                    else:
                        skips.add(has, line_no)
        except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
            raise CorpusError(f"corpus file {path}: cannot decompress: {exc}") from None
        if not self.items:
            raise _no_text_error(path, field, records, had_field)
        self.skipped_warnings = skips.warnings(path, field, records)

    def __len__(self) -> int:
        return len(self.items)

    def get(self, index: int) -> tuple[str, int, str | None]:
        return self.items[index]


class _Parquet:
    """The text column (and ``id`` if present) of a Parquet file as Arrow arrays."""

    def __init__(self, path: str, field: str | None):
        try:
            import pyarrow as pa
            import pyarrow.compute as pc
            import pyarrow.parquet as pq
        except ImportError:
            raise CorpusError(f"corpus file {path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
        self.path = path
        try:
            schema = pq.read_schema(path)
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
            raise CorpusError(f"corpus file {path}: not a readable Parquet file: {exc}") from None
        names = (field,) if field else DEFAULT_TEXT_FIELDS
        column = next((name for name in names if name in schema.names), None)
        if column is None:
            raise CorpusError(f"corpus file {path}: no {_field_names(field)} column "
                              f"(columns: {', '.join(schema.names)})")
        columns = [column] + (["id"] if "id" in schema.names and column != "id" else [])
        table = pq.read_table(path, columns=columns)
        texts = table.column(column)
        if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
            raise CorpusError(f"corpus file {path}: column {column!r} has type {texts.type}, expected strings")
        trimmed = pc.utf8_length(pc.utf8_trim_whitespace(texts))
        self.rows = array("q", pc.indices_nonzero(pc.fill_null(pc.greater(trimmed, 0), False)).to_pylist())
        self.texts = texts.combine_chunks()
        self.ids = table.column("id").combine_chunks() if "id" in columns else None
        if len(self.rows) == 0:
            raise CorpusError(f"corpus file {path}: every {column!r} value is empty ({table.num_rows} rows)")
        skipped = table.num_rows - len(self.rows)
        self.skipped_warnings: list[str] = []
        if skipped:
            kept = set(self.rows)
            first = next(row for row in range(table.num_rows) if row not in kept)
            self.skipped_warnings.append(
                f"corpus file {path}: skipped {skipped} of {table.num_rows} rows whose {column!r} is null or "
                f"blank (the first at row {first})")

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, index: int) -> tuple[str, int, str | None]:
        row = int(self.rows[index])
        doc_id = None if self.ids is None else self.ids[row].as_py()
        return self.texts[row].as_py(), row, None if doc_id is None else str(doc_id)


def _open_source(path: str, field: str | None) -> _Source:
    if path.endswith(".jsonl.gz"):
        return _GzipJsonl(path, field)
    if path.endswith(".jsonl"):
        return _JsonlIndex(path, field)
    if path.endswith(".parquet"):
        return _Parquet(path, field)
    raise CorpusError(f"corpus file {path}: unknown format; expected one of {', '.join(SUFFIXES)}")


# The paper's corpora, for the message that refuses the demo corpus in a reproduction run (SPEC 2).
PAPER_CORPORA = {
    "games": "about 10,000 math documents (DCLM) and 5,000 science documents (MegaScience), cut to 6,000 words",
    "tool_use": "about 15,000 code documents (Nemotron), cut to 4,000 words",
}
DEMO_CORPUS_DIR = Path(__file__).resolve().parents[2] / "examples" / "corpus"


def is_demo_corpus_file(path: str | Path) -> bool:
    """A file of the bundled demo corpus: ``examples/corpus/demo*`` (this checkout's, or any copy
    of that layout)."""
    resolved = Path(path).resolve()
    return resolved.name.startswith("demo") and (
        resolved.parent == DEMO_CORPUS_DIR or (resolved.parent.name == "corpus" and resolved.parent.parent.name == "examples"))


def demo_corpus_files(entries: tuple[str, ...], root: Path | None = None) -> list[str]:
    """The files of ``corpus.paths`` that belong to the demo corpus (empty: none)."""
    try:
        files = resolve_paths(entries, root)
    except (OSError, ValueError):
        files = []
    return [f for f in files if is_demo_corpus_file(f)] + [e for e in entries if is_demo_corpus_file(e)
                                                         and e not in files and Path(e).exists()]


def demo_corpus_refusal(entries: tuple[str, ...], domain: str, root: Path | None = None) -> str | None:
    """Why a run that requires a real corpus (``corpus.require_real``) cannot use ``entries``, or None."""
    demo = demo_corpus_files(entries, root)
    if not demo:
        return None
    return (f"corpus.paths: {', '.join(demo)} is the demo corpus (for the smoke run), and corpus.require_real is "
            f"true (a reproduction recipe). The paper's {domain} runs used {PAPER_CORPORA.get(domain, PAPER_CORPORA['games'])}. "
            "Point corpus.paths at a real corpus (JSONL with a 'text' or 'orig_doc' field, or Parquet; files, "
            "directories or globs), or run the no-corpus ablation (selfplay.use_corpus: false, "
            "examples/recipes/ablation_no_corpus.yaml).")


def resolve_paths(entries: tuple[str, ...], root: Path | None = None) -> list[str]:
    """Expand files, directories and globs (each sorted) into a list of corpus files."""
    if not entries:
        raise CorpusError("corpus.paths is empty: give at least one JSONL, JSONL.gz or Parquet file")
    base = Path.cwd() if root is None else Path(root)
    files: list[str] = []
    for entry in entries:
        full = Path(os.path.expanduser(entry))
        full = full if full.is_absolute() else base / full
        if _GLOB_CHARS & set(entry):
            matches = sorted(p for p in glob.glob(str(full), recursive=True) if os.path.isfile(p))
            if not matches:
                raise CorpusError(f"corpus pattern {entry!r} matches no file (looked in {base})")
            files.extend(matches)
        elif full.is_dir():
            matches = sorted(str(p) for p in full.rglob("*") if p.is_file() and str(p).endswith(SUFFIXES))
            if not matches:
                raise CorpusError(f"corpus directory {full} holds no {', '.join(SUFFIXES)} file")
            files.extend(matches)
        elif full.is_file():
            files.append(str(full))
        else:
            raise CorpusError(f"corpus file not found: {full}")
    return list(dict.fromkeys(files))  # a file named twice counts once


class Corpus:
    """All documents of the configured files; ``sample(rng)`` draws one uniformly."""

    def __init__(self, settings: CorpusSettings, root: Path | str | None = None):
        self.settings = settings
        self.files = resolve_paths(settings.paths, None if root is None else Path(root))
        self._sources = [_open_source(path, settings.text_field) for path in self.files]
        self.skipped_warnings: list[str] = [w for source in self._sources for w in source.skipped_warnings]
        for warning in self.skipped_warnings:
            log.warning(warning)
        self._ends: list[int] = []
        total = 0
        for source in self._sources:
            total += len(source)
            self._ends.append(total)

    def __len__(self) -> int:
        return self._ends[-1]

    def counts(self) -> dict[str, int]:
        """Usable documents per file."""
        return {source.path: len(source) for source in self._sources}

    def document(self, index: int) -> Document:
        """The index-th usable document across all files (in file order), truncated."""
        if not 0 <= index < len(self):
            raise IndexError(f"document index {index} out of range (0..{len(self) - 1})")
        which = bisect.bisect_right(self._ends, index)
        source = self._sources[which]
        start = self._ends[which - 1] if which else 0
        raw, position, doc_id = source.get(index - start)
        text, words, truncated = truncate_words(raw, self.settings.max_words, self.settings.truncation_marker,
                                                self.settings.document_spacing)
        return Document(text=text, path=source.path, position=position, doc_id=doc_id, words=words,
                        truncated=truncated)

    def sample(self, rng: random.Random) -> Document:
        """One document drawn uniformly at random with ``rng`` (one ``randrange`` call)."""
        return self.document(rng.randrange(len(self)))
