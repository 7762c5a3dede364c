"""A pool directory's files: ``NAME.py`` with ``NAME.hint.txt`` beside it, and the manifest
``pool.jsonl`` (one JSON object per line, each with a ``name``). The pool commands write them
(``spade.pool.build``, ``spade.pool.released``, ``spade.pool.export``); the Fixed-env GRPO source and
``spade.envs.gym`` read them. A run's admitted sets use the same hint file name."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("spade.pool")

MANIFEST = "pool.jsonl"
HINT_SUFFIX = ".hint.txt"


def manifest_path(directory: Path | str) -> Path:
    return Path(directory) / MANIFEST


def read_manifest(directory: Path | str) -> list[dict[str, Any]]:
    """The manifest's records in file order ([] without a manifest). A last line cut short by a
    crash is left out; any other line that is not a JSON object with a ``name`` is an error."""
    path = manifest_path(directory)
    if not path.is_file():
        return []
    records = []
    lines = path.read_text().split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # no newline after it: the append was cut short
                log.warning("%s: ignoring the unfinished last line", path)
                continue
            raise ValueError(f"{path}:{number}: not a JSON line") from None
        if not isinstance(record, dict) or not isinstance(record.get("name"), str):
            raise ValueError(f"{path}:{number}: a manifest line must be a JSON object with a 'name'")
        records.append(record)
    return records


def append_manifest(directory: Path | str, record: dict[str, Any]) -> None:
    """Append one record as a single whole-line write, flushed to disk before returning. A line left
    unfinished by a crash before (no trailing newline) is cut off first."""
    path = manifest_path(directory)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    with open(path, "ab+") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size:
            handle.seek(size - 1)
            if handle.read(1) != b"\n":
                handle.seek(0)
                keep = handle.read().rfind(b"\n") + 1
                handle.truncate(keep)
        handle.seek(0, os.SEEK_END)
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())
