"""The order ``make test``'s xdist workers take the files in (tests/xdist_schedule.py): longest
first, each file whole and in its own order; a plain run keeps pytest's order."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import xdist_schedule
from support import paths
from xdist_schedule import SECONDS, longest_files_first

TESTS = Path(__file__).resolve().parent


def fake_items(names: list[str]) -> list[SimpleNamespace]:
    """Items as pytest collects them: grouped by file, files alphabetical, tests in file order."""
    return [SimpleNamespace(path=TESTS / file, name=f"{file}::{test}")
            for file, test in (name.split("::") for name in names)]


COLLECTED = ["test_a.py::one", "test_a.py::two", "test_resume_kills.py::one", "test_score.py::one",
             "test_score.py::two", "test_train_loop.py::one", "test_train_loop.py::two", "test_z.py::one"]


def test_a_worker_takes_the_longest_files_first_each_whole(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    items = fake_items(COLLECTED)
    longest_files_first(items)
    # train_loop (288 s) > resume_kills (81 s) > score (17 s) > unlisted files in their usual order
    assert [item.name for item in items] == [
        "test_train_loop.py::one", "test_train_loop.py::two", "test_resume_kills.py::one",
        "test_score.py::one", "test_score.py::two", "test_a.py::one", "test_a.py::two", "test_z.py::one"]


def test_a_plain_run_keeps_the_collected_order(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    items = fake_items(COLLECTED)
    longest_files_first(items)
    assert [item.name for item in items] == COLLECTED


def test_every_timed_file_exists():
    """A renamed or deleted file would silently lose its place in the order. The table keys by base
    name, wherever the file lives under tests/ (tests/<package>/), so base names stay unique."""
    names = [path.name for path in paths.test_files()]
    assert len(names) == len(set(names)), sorted({name for name in names if names.count(name) > 1})
    assert [name for name in SECONDS if name not in names] == []
    assert Path(xdist_schedule.__file__).parent == TESTS
