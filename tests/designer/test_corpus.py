"""The corpus readers (JSONL, JSONL.gz, Parquet), uniform seeded sampling, truncation and errors."""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from spade.config import ConfigError, from_mapping
from spade.designer.corpus import (
    TOOL_USE_MAX_WORDS,
    TRUNCATION_MARKER,
    Corpus,
    CorpusError,
    CorpusSettings,
    attempt_rng,
    truncate_words,
)


def write_jsonl(path: Path, records: list[Any], *, compress: bool = False) -> Path:
    body = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)
    if compress:
        path.write_bytes(gzip.compress(body.encode()))
    else:
        path.write_text(body)
    return path


def write_parquet(path: Path, columns: dict[str, list[Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table(columns), path, row_group_size=3)  # several row groups / chunks
    return path


def corpus(*paths: Path, **settings: Any) -> Corpus:
    return Corpus(CorpusSettings(paths=tuple(str(p) for p in paths), **settings))


def all_texts(c: Corpus) -> list[str]:
    return [c.document(i).text for i in range(len(c))]


DOCS = [{"id": f"d{i}", "text": f"document number {i} about primes"} for i in range(5)]


# --------------------------------------------------------------------------
# Readers


def test_jsonl_reads_every_record_with_line_numbers_and_ids(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [DOCS[0], "", DOCS[1], DOCS[2]])  # a blank line is skipped
    c = corpus(path)
    assert len(c) == 3
    assert all_texts(c) == [d["text"] for d in DOCS[:3]]
    doc = c.document(1)
    assert (doc.position, doc.doc_id, doc.path) == (3, "d1", str(path))
    assert doc.key == f"{path}:3"
    assert not doc.truncated and doc.words == 5


def test_jsonl_is_indexed_not_loaded(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", DOCS)
    c = corpus(path)
    source = c._sources[0]
    assert not hasattr(source, "items")  # only offsets are kept
    assert source.offsets.itemsize == 8 and len(source.offsets) == 5
    # the file changing under an index is caught, not read at stale offsets
    write_jsonl(path, DOCS[::-1] + DOCS)
    with pytest.raises(CorpusError, match="changed after it was indexed"):
        c.document(0)


def test_jsonl_gz(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl.gz", DOCS, compress=True)
    c = corpus(path)
    assert all_texts(c) == [d["text"] for d in DOCS]
    assert c.document(4).position == 5 and c.document(4).doc_id == "d4"


def test_parquet(tmp_path: Path) -> None:
    texts = [d["text"] for d in DOCS] + ["", None, "   "]
    path = write_parquet(tmp_path / "a.parquet", {"id": list(range(8)), "text": texts, "other": ["x"] * 8})
    c = corpus(path)
    assert len(c) == 5
    assert all_texts(c) == texts[:5]
    assert c.document(2).position == 2 and c.document(2).doc_id == "2"


def test_parquet_orig_doc_column_and_explicit_field(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "a.parquet", {"orig_doc": ["alpha beta", "gamma"], "body": ["x y", "z"]})
    assert all_texts(corpus(path)) == ["alpha beta", "gamma"]
    assert all_texts(corpus(path, text_field="body")) == ["x y", "z"]
    with pytest.raises(CorpusError, match=r"b\.parquet: no 'text' or 'orig_doc' column") as exc:
        corpus(write_parquet(tmp_path / "b.parquet", {"body": ["x"]}))
    assert "columns: body" in str(exc.value)
    with pytest.raises(CorpusError, match=r"no 'content' column"):
        corpus(path, text_field="content")


def test_field_fallback_text_then_orig_doc(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [
        {"text": "from text", "orig_doc": "ignored"},
        {"orig_doc": "from orig_doc"},
        {"neither": "skipped"},
    ])
    assert all_texts(corpus(path)) == ["from text", "from orig_doc"]


def test_explicit_text_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "no", "content": "yes"}, {"text": "skipped"}])
    assert all_texts(corpus(path, text_field="content")) == ["yes"]


def test_empty_documents_are_skipped(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": ""}, {"text": "  \n\t"}, {"text": None}, {"text": "real"}])
    c = corpus(path)
    assert len(c) == 1 and c.document(0).text == "real" and c.document(0).position == 4


def test_files_directories_and_globs(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    write_jsonl(tmp_path / "sub" / "b.jsonl", DOCS[2:4])
    write_jsonl(tmp_path / "sub" / "a.jsonl.gz", DOCS[:2], compress=True)
    (tmp_path / "sub" / "notes.txt").write_text("not a corpus file")
    by_dir = Corpus(CorpusSettings(paths=("sub",)), root=tmp_path)
    assert all_texts(by_dir) == [d["text"] for d in DOCS[:4]]  # sorted: a.jsonl.gz, then b.jsonl
    by_glob = Corpus(CorpusSettings(paths=("sub/*.jsonl",)), root=tmp_path)
    assert all_texts(by_glob) == [d["text"] for d in DOCS[2:4]]
    twice = Corpus(CorpusSettings(paths=("sub/b.jsonl", "sub/*.jsonl")), root=tmp_path)
    assert len(twice) == 2  # a file named twice counts once


# --------------------------------------------------------------------------
# Sampling


def test_sampling_is_uniform_over_documents_not_files(tmp_path: Path) -> None:
    small = write_jsonl(tmp_path / "small.jsonl", [{"text": f"s{i}"} for i in range(3)])
    large = write_jsonl(tmp_path / "large.jsonl.gz", [{"text": f"l{i}"} for i in range(7)], compress=True)
    c = corpus(small, large)
    rng = random.Random(1234)
    draws = 20_000
    counts = Counter(c.sample(rng).text for _ in range(draws))
    assert len(counts) == 10
    expected = draws / 10
    chi2 = sum((n - expected) ** 2 / expected for n in counts.values())
    assert chi2 < 27.88  # chi-square critical value, 9 degrees of freedom, p = 0.001


def test_same_seed_same_sequence(tmp_path: Path) -> None:
    c = corpus(write_jsonl(tmp_path / "a.jsonl", [{"text": f"doc {i}"} for i in range(50)]))
    first = [c.sample(random.Random(7)).text for _ in range(3)]
    assert len(set(first)) == 1
    one, two = random.Random(99), random.Random(99)
    assert [c.sample(one).key for _ in range(30)] == [c.sample(two).key for _ in range(30)]
    three, four = random.Random(99), random.Random(100)
    assert [c.sample(three).key for _ in range(30)] != [c.sample(four).key for _ in range(30)]
    # resuming from a saved rng state continues the same sequence
    rng = random.Random(5)
    [c.sample(rng) for _ in range(10)]
    state = rng.getstate()
    tail = [c.sample(rng).key for _ in range(10)]
    resumed = random.Random()
    resumed.setstate(state)
    assert [c.sample(resumed).key for _ in range(10)] == tail


def test_attempt_rng_is_stable_across_processes() -> None:
    # String seeds go through SHA-512, not hash(): the value is fixed whatever PYTHONHASHSEED is.
    assert attempt_rng(7, 3, "slot", 2).random() == 0.8174263506941081
    assert attempt_rng(7, 3, "slot", 2).random() != attempt_rng(7, 3, "slot", 3).random()


# --------------------------------------------------------------------------
# Truncation


def test_truncation_keeps_n_words_and_appends_marker(tmp_path: Path) -> None:
    text = "one  two\nthree\tfour five six seven"
    cut, words, truncated = truncate_words(text, 4)
    assert cut == "one  two\nthree\tfour" + TRUNCATION_MARKER
    assert (words, truncated) == (7, True)
    assert truncate_words(text, 7) == (text, 7, False)
    assert truncate_words(text, 100) == (text, 7, False)

    c = corpus(write_jsonl(tmp_path / "a.jsonl", [{"text": text}]), max_words=3, truncation_marker=" [cut]")
    doc = c.document(0)
    assert doc.text == "one  two\nthree [cut]" and doc.truncated and doc.words == 7


def test_settings_defaults_and_domains() -> None:
    settings = CorpusSettings(paths="a.jsonl")  # a lone string is one path
    assert settings.paths == ("a.jsonl",) and settings.max_words == 6000 and settings.text_field is None
    assert CorpusSettings.for_domain("tool_use", ["x"]).max_words == TOOL_USE_MAX_WORDS == 4000
    loaded = from_mapping(CorpusSettings, {"paths": ["a", "b"], "max_words": 10, "seed": 3}, where="corpus")
    assert loaded == CorpusSettings(paths=("a", "b"), max_words=10, seed=3)
    with pytest.raises(ConfigError, match="corpus.max_words"):
        CorpusSettings(paths=("a",), max_words=0)
    with pytest.raises(ConfigError, match="corpus.bogus"):
        from_mapping(CorpusSettings, {"bogus": 1}, where="corpus")


# --------------------------------------------------------------------------
# Errors


def test_missing_file_and_empty_glob(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match=r"corpus file not found: .*nope\.jsonl"):
        corpus(tmp_path / "nope.jsonl")
    with pytest.raises(CorpusError, match=r"'\*\.parquet' matches no file"):
        Corpus(CorpusSettings(paths=("*.parquet",)), root=tmp_path)
    with pytest.raises(CorpusError, match="corpus.paths is empty"):
        Corpus(CorpusSettings())
    with pytest.raises(CorpusError, match="unknown format"):
        corpus(write_jsonl(tmp_path / "a.json", DOCS))


@pytest.mark.parametrize("compress", [False, True])
def test_field_missing_in_every_record_names_field_and_file(tmp_path: Path, compress: bool) -> None:
    name = "a.jsonl.gz" if compress else "a.jsonl"
    path = write_jsonl(tmp_path / name, [{"body": "x"}, {"body": "y"}], compress=compress)
    with pytest.raises(CorpusError) as exc:
        corpus(path)
    message = str(exc.value)
    assert str(path) in message and "'text' or 'orig_doc'" in message and "2 records" in message
    with pytest.raises(CorpusError, match=r"no record has a 'content' field"):
        corpus(path, text_field="content")


def test_all_empty_texts_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="every 'text' or 'orig_doc' field is empty"):
        corpus(write_jsonl(tmp_path / "a.jsonl", [{"text": ""}, {"text": " "}]))
    with pytest.raises(CorpusError, match="no records"):
        corpus(write_jsonl(tmp_path / "b.jsonl", []))


@pytest.mark.parametrize("compress", [False, True])
def test_bad_json_line_names_file_and_line(tmp_path: Path, compress: bool) -> None:
    name = "bad.jsonl.gz" if compress else "bad.jsonl"
    path = write_jsonl(tmp_path / name, [DOCS[0], DOCS[1], '{"text": "unterminated'], compress=compress)
    with pytest.raises(CorpusError, match=rf"{path}:3: not valid JSON"):
        corpus(path)


def test_bad_record_shapes_name_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match=r"a\.jsonl:2: expected a JSON object, got list"):
        corpus(write_jsonl(tmp_path / "a.jsonl", [DOCS[0], "[1, 2]"]))
    with pytest.raises(CorpusError, match=r"b\.jsonl:1: field 'text' is int, expected a string"):
        corpus(write_jsonl(tmp_path / "b.jsonl", [{"text": 5}]))


def test_corrupt_gzip_and_parquet(tmp_path: Path) -> None:
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(b"not gzip at all")
    with pytest.raises(CorpusError, match=r"a\.jsonl\.gz: cannot decompress"):
        corpus(gz)
    pq = tmp_path / "a.parquet"
    pq.write_bytes(b"not parquet")
    with pytest.raises(CorpusError, match=r"a\.parquet: not a readable Parquet file"):
        corpus(pq)


@pytest.mark.parametrize("compress", [False, True], ids=["jsonl", "jsonl.gz"])
def test_skipped_records_are_counted_with_the_first_line(tmp_path: Path, compress: bool, caplog) -> None:
    name = "a.jsonl.gz" if compress else "a.jsonl"
    path = write_jsonl(tmp_path / name, [DOCS[0], "", {"title": "no text"}, {"text": " "}, DOCS[1],
                                         {"body": "none"}, {"text": None}], compress=compress)
    with caplog.at_level("WARNING", logger="spade.designer.corpus"):
        c = corpus(path)
    assert len(c) == 2
    assert c.skipped_warnings == [
        f"corpus file {path}: skipped 2 of 6 records without a 'text' or 'orig_doc' field (the first at line 3)",
        f"corpus file {path}: skipped 2 of 6 records whose text is null or blank (the first at line 4)",
    ]
    assert [r.getMessage() for r in caplog.records] == c.skipped_warnings
    named = corpus(write_jsonl(tmp_path / "b.jsonl", [{"content": "x"}, {"text": "y"}]), text_field="content")
    assert named.skipped_warnings == [f"corpus file {tmp_path / 'b.jsonl'}: skipped 1 of 2 records without a "
                                      f"'content' field (the first at line 2)"]
    assert corpus(write_jsonl(tmp_path / "c.jsonl", DOCS)).skipped_warnings == []


def test_skipped_parquet_rows_are_counted_with_the_first_row(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "a.parquet", {"text": ["a", None, "b", " ", "c"]})
    c = corpus(path)
    assert len(c) == 3
    assert c.skipped_warnings == [f"corpus file {path}: skipped 2 of 5 rows whose 'text' is null or blank "
                                  f"(the first at row 1)"]


# -- corpus.document_spacing (issue 39) -----------------------------------------------------------

def test_document_spacing_keep_is_the_default_and_released_collapses_a_cut_document():
    text = "  one  two\n\n    three\tfour five \n"
    assert CorpusSettings().document_spacing == "keep"
    assert truncate_words(text, 3) == ("  one  two\n\n    three" + TRUNCATION_MARKER, 5, True)
    assert truncate_words(text, 3, spacing="keep") == truncate_words(text, 3)
    assert truncate_words(text, 3, spacing="released") == ("one two three" + TRUNCATION_MARKER, 5, True)
    # an uncut document: kept as it is, or stripped at its ends (its inner spacing stays)
    assert truncate_words(text, 5) == (text, 5, False)
    assert truncate_words(text, 5, spacing="released") == ("one  two\n\n    three\tfour five", 5, False)


def test_document_spacing_reaches_the_drawn_document(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"text": "def f(x):\n    return x\n\nprint(f(2))"}) + "\n")
    keep = Corpus(CorpusSettings(paths=(str(path),), max_words=4, truncation_marker=" [cut]"))
    released = Corpus(CorpusSettings(paths=(str(path),), max_words=4, truncation_marker=" [cut]",
                                     document_spacing="released"))
    assert keep.document(0).text == "def f(x):\n    return x [cut]"
    assert released.document(0).text == "def f(x): return x [cut]"
    with pytest.raises(ConfigError, match="corpus.document_spacing: 'tight' is not allowed; choose one of: keep, released"):
        from_mapping(CorpusSettings, {"document_spacing": "tight"}, where="corpus")
