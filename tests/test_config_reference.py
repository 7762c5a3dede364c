"""docs/config.md, generated from the config dataclasses by tools/config_reference.py, is current and
complete: every key of the config tree has a row with its default, and a key's comment is its text."""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import config_reference  # noqa: E402  (tools/ is not a package)

from spade.train_config import SECTIONS, TrainConfig  # noqa: E402


def _leaf_keys(cls: type, path: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    keys = []
    for field in dataclasses.fields(cls):
        if not field.init or field.name.startswith("_"):
            continue
        child = config_reference._nested(hints[field.name])
        keys.extend(_leaf_keys(child, f"{path}.{field.name}") if child else [f"{path}.{field.name}"])
    return keys


@pytest.fixture(scope="module")
def page() -> str:
    return config_reference.render()


def test_the_committed_page_is_current(page):
    assert (REPO / "docs" / "config.md").read_text() == page, \
        "docs/config.md is stale: run `python tools/config_reference.py`"


def test_every_key_of_the_tree_has_a_row(page):
    hints = typing.get_type_hints(TrainConfig)
    keys = [key for name in SECTIONS for key in _leaf_keys(hints[name], name)]
    assert len(keys) > 150
    rows = {line.split("|")[1].strip().strip("`") for line in page.splitlines() if line.startswith("| `")}
    assert set(keys) <= rows, sorted(set(keys) - rows)[:10]


def test_a_row_carries_the_default_and_the_fields_comment(page):
    row = next(line for line in page.splitlines() if line.startswith("| `run.overlap` |"))
    cells = [cell.strip() for cell in row.split("|")[1:-1]]
    assert cells[1] == "`int`" and cells[2] == "`0`"
    assert "one step off policy" in cells[3] and "synchronous" in cells[3]
    sandbox = next(line for line in page.splitlines() if line.startswith("| `sandbox.step_timeout_s` |"))
    assert "`30.0`" in sandbox  # the dataclass default, not a copy in the docs


def test_a_field_without_a_comment_takes_its_docstring_paragraph():
    @dataclasses.dataclass(frozen=True)
    class Probe:
        """Settings for a test.

        ``depth``: how far the probe reads.
        """

        depth: int = 3
        width: int = 2  # columns read at once

    (section,) = config_reference.sections(Probe, "probe")
    texts = {key.path: key.text for key in section.keys}
    assert texts == {"probe.depth": "``depth``: how far the probe reads.", "probe.width": "columns read at once"}


def test_check_mode_reports_a_stale_page(tmp_path, monkeypatch):
    monkeypatch.setattr(config_reference, "OUTPUT", tmp_path / "config.md")
    (tmp_path / "config.md").write_text("old\n")
    monkeypatch.setattr(config_reference, "REPO", tmp_path)
    assert config_reference.main(["--check"]) == 1
    assert config_reference.main([]) == 0
    assert config_reference.main(["--check"]) == 0
