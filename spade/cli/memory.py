"""``spade memory``: look into the designer's memory of a run (``RUN_DIR/memory.sqlite``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..designer.memory import Memory, MemoryRecord, MemoryStoreError, memory_path
from .common import UsageError

LIST_KEYS = ("env_id", "skill", "step", "win_rate", "regret", "class_name")


def add_parser(subparsers: Any) -> None:
    memory = subparsers.add_parser("memory", help="list or show the environments in a run's designer memory")
    commands = memory.add_subparsers(dest="memory_command", metavar="COMMAND", required=True)

    listing = commands.add_parser("list", help="one line per live record, oldest first")
    listing.add_argument("run_dir", metavar="RUN_DIR")
    listing.add_argument("--json", action="store_true", help="one JSON object per record, one per line")
    listing.set_defaults(handler=run_list)

    show = commands.add_parser("show", help="the source, hint and statistics of one environment")
    show.add_argument("run_dir", metavar="RUN_DIR")
    show.add_argument("env_id", metavar="ENV_ID")
    show.set_defaults(handler=run_show)


def _open(run_dir: str) -> Memory:
    directory = Path(run_dir)
    if not directory.is_dir():
        raise UsageError(f"no such run directory: {run_dir}")
    path = memory_path(directory)
    if not path.is_file():
        raise UsageError(f"no memory database in {run_dir} (expected {path})")
    try:
        return Memory.open_readonly(path)
    except MemoryStoreError as exc:
        raise UsageError(str(exc)) from None


def _summary(record: MemoryRecord) -> dict[str, Any]:
    return {"env_id": record.env_id, "skill": record.skill, "step": record.step, "win_rate": record.win_rate,
            "regret": record.regret, "class_name": record.class_name}


def run_list(args: argparse.Namespace) -> int:
    with _open(args.run_dir) as memory:
        records = memory.list()
    if args.json:
        for record in records:
            print(json.dumps(_summary(record)), flush=True)
        return 0
    rows = [(r.env_id, r.skill, str(r.step), f"{r.win_rate:.3f}", f"{r.regret:+.3f}", r.class_name or "-")
            for r in records]
    widths = [max([len(key)] + [len(row[i]) for row in rows]) for i, key in enumerate(LIST_KEYS)]
    numeric = {2, 3, 4}
    for row in [LIST_KEYS, *rows]:
        cells = [cell.rjust(w) if i in numeric else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        print("  ".join(cells).rstrip(), flush=True)
    return 0


def run_show(args: argparse.Namespace) -> int:
    with _open(args.run_dir) as memory:
        record = memory.get(args.env_id, include_evicted=True)
        if record is None:
            raise UsageError(f"no environment {args.env_id!r} in the memory of {args.run_dir} "
                             f"(see: spade memory list {args.run_dir})")
        live = memory.is_live(record)
        capacity = memory.capacity
    status = "in memory" if live else f"evicted (older than the newest {capacity} records)"
    print(f"env_id:     {record.env_id}")
    print(f"skill:      {record.skill}")
    print(f"step:       {record.step}")
    print(f"class_name: {record.class_name or '-'}")
    print(f"win_rate:   {record.win_rate:.3f}  (share of no-hint plays with return > 0 at step {record.step}: "
          f"{record.calibration})")
    print(f"regret:     {record.regret:+.3f}  (mean return with hint - without, not floored)")
    print(f"status:     {status}")
    print(f"metadata:   {json.dumps(dict(record.metadata), sort_keys=True)}")
    print("--- hint ---")
    print(record.hint.rstrip("\n") or "(none)")
    print("--- source ---")
    print(record.source.rstrip("\n"), flush=True)
    return 0
