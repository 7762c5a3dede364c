"""Results files take any text a model's output decodes to (issue 43): a call's arguments decoded
from the six characters ``"\\ud800"`` are a lone surrogate, which strict UTF-8 refuses; the line is
written with JSON escapes instead of ending the evaluation, and reads back unchanged."""

from __future__ import annotations

from spade.eval.external_harness import write_records
from spade.eval.runner import _append, read_records
from spade.eval.types import ItemRecord, SampleRecord


def record(item: str, text: str, detail: dict) -> ItemRecord:
    return ItemRecord(item, "multi_turn_base", (SampleRecord(text, '{"x": 1}', 0.0, False, detail=detail),), 7)


def test_a_record_holding_a_lone_surrogate_is_written_and_read_back(tmp_path):
    odd = record("bfcl/1", 'send("a\ud800b")', {"arguments": {"k\udc80": "v"}})
    plain = record("bfcl/2", "café ✓", {"arguments": {"k": "é"}})
    path = tmp_path / "bfcl.jsonl"
    _append(path, odd)
    _append(path, plain)
    text = path.read_bytes().decode("utf-8")  # strict: the file is UTF-8 throughout
    first, second = text.splitlines()
    assert "\\ud800" in first and "\\udc80" in first  # escaped only where UTF-8 cannot go
    assert "café ✓" in second  # other lines stay readable as written
    assert read_records(path) == {"bfcl/1": odd, "bfcl/2": plain}

    rewritten = tmp_path / "tau2.jsonl"
    write_records(rewritten, {"multi_turn_base": [odd, plain]})
    rewritten.read_bytes().decode("utf-8")
    assert read_records(rewritten) == {"bfcl/1": odd, "bfcl/2": plain}
