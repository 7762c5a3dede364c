"""The package's one durable/atomic write helper (spade/durable_files.py)."""

from __future__ import annotations

import json

from spade.durable_files import atomic_write_text, write_json


def test_atomic_write_replaces_the_file_and_leaves_nothing_beside_it(tmp_path):
    target = tmp_path / "new" / "folder" / "state.json"  # the folders do not exist yet
    atomic_write_text(target, "first\n")
    atomic_write_text(target, "second ü\n")
    assert target.read_bytes() == "second ü\n".encode("utf-8")
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.json"]


def test_write_json_is_indented_with_a_closing_newline(tmp_path):
    path = tmp_path / "info.json"
    write_json(path, {"b": 1, "a": [1, 2]})
    assert path.read_text() == '{\n  "b": 1,\n  "a": [\n    1,\n    2\n  ]\n}\n'
    assert json.loads(path.read_text()) == {"b": 1, "a": [1, 2]}
