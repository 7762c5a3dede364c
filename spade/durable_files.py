"""Durable file writes: text written and fsynced, a file replaced atomically (a fsynced temporary
file beside it and a rename), and a directory's entries made durable after a rename or a new file.
Standard library only, at the package root, so every layer (training's checkpoints, the run
directory, the self-play pools) writes through the same code."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any


def write_synced(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (UTF-8) and fsync it before returning."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` and fsync it before returning."""
    write_synced(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: readers see the old content or the new, never a part, and the
    new content survives a crash once this returns. Its folder is made first when missing; the
    temporary name is unique to the call, so writers in several processes never share one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    write_synced(tmp, text)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make a rename or new file in ``path`` durable (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
