"""The tracker's own run id, kept in the run directory so a resumed run continues the same record."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..run_dir import RunDir


def id_path(run_dir: RunDir, tracker: str) -> Path:
    return run_dir.root / f"{tracker}_run_id"


def read_id(run_dir: RunDir, tracker: str) -> Optional[str]:
    path = id_path(run_dir, tracker)
    return path.read_text(encoding="utf-8").strip() or None if path.is_file() else None


def write_id(run_dir: RunDir, tracker: str, run_id: str) -> None:
    id_path(run_dir, tracker).write_text(run_id + "\n", encoding="utf-8")
