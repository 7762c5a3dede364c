"""Seconds per test file, for tests/xdist_schedule.py's table (which file a worker takes first).

As a pytest plugin it records, per test, the CPU time of the test process and of the subprocesses
it reaped (torchrun, ``spade train``, ...) and the wall time, and writes them to
``$PYTEST_FILE_TIMES.<worker>.json`` at the end; CPU time is the figure to trust on a busy
machine. Run as a script on those files, it prints the table, one file per line, longest first:

    PYTEST_FILE_TIMES=/tmp/times PYTHONPATH=tools .venv/bin/python -m pytest -q -p pytest_file_times
    .venv/bin/python tools/pytest_file_times.py /tmp/times.*.json

A file counts max(CPU, wall): a file that mostly waits (timeouts, sleeps) still holds its worker.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ENV = "PYTEST_FILE_TIMES"
_times: dict[str, dict[str, float]] = {}


def _now() -> tuple[float, float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime, time.perf_counter()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _now()
    yield
    after = _now()
    _times[item.nodeid] = {"self": after[0] - before[0], "children": after[1] - before[1],
                           "wall": after[2] - before[2]}


def pytest_sessionfinish(session):
    out = os.environ.get(ENV)
    if out:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(f"{out}.{worker}.json").write_text(json.dumps(_times))


def file_seconds(paths: list[str]) -> dict[str, float]:
    per_file: dict[str, float] = defaultdict(float)
    for path in paths:
        for nodeid, t in json.loads(Path(path).read_text()).items():
            per_file[nodeid.split("::")[0].split("/")[-1]] += max(t["self"] + t["children"], t["wall"])
    return dict(sorted(per_file.items(), key=lambda kv: -kv[1]))


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for name, seconds in file_seconds(argv).items():
        print(f'    "{name}": {seconds:.0f},')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
