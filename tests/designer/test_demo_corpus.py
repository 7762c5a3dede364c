"""The committed demo corpus: loads, covers math, science and code, carries provenance, rebuilds identically."""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import json
import platform
import random
import subprocess
import sys
from pathlib import Path

from spade.designer.corpus import Corpus, CorpusSettings

ROOT = Path(__file__).resolve().parents[2]
CORPUS_DIR = ROOT / "examples" / "corpus"
CORPUS = CORPUS_DIR / "demo.jsonl.gz"
MANIFEST = CORPUS_DIR / "demo.manifest.json"
TOOL = ROOT / "tools" / "make_demo_corpus.py"
LICENSES = {"sympy": "BSD-3-Clause", "numpy": "BSD-3-Clause"}


def records() -> list[dict[str, str]]:
    with gzip.open(CORPUS, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def make(out: Path, *extra: str) -> bytes:
    result = subprocess.run([sys.executable, str(TOOL), "--out", str(out), *extra], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return (out / CORPUS.name).read_bytes()


def test_committed_corpus_loads_and_samples() -> None:
    assert CORPUS.stat().st_size < 2_000_000
    corpus = Corpus(CorpusSettings(paths=(str(CORPUS),), max_words=100))
    assert len(corpus) == len(records()) >= 300
    rng = random.Random(0)
    docs = [corpus.sample(rng) for _ in range(50)]
    assert all(doc.text.strip() and doc.doc_id for doc in docs)
    assert any(doc.truncated for doc in docs)


def test_records_cover_three_kinds_with_provenance() -> None:
    rows = records()
    assert {row["kind"] for row in rows} == {"math", "science", "code"}
    assert len({row["id"] for row in rows}) == len(rows)
    for row in rows:
        assert set(row) == {"id", "text", "source", "kind", "license"}
        assert row["id"].startswith(row["kind"] + "-") and len(row["text"].split()) >= 20
        package = row["source"].split(".")[0].split(":")[0]
        if row["kind"] == "code":
            assert row["license"] == "PSF-2.0" and row["text"].startswith("# Python ")
        else:
            assert row["license"] == LICENSES[package], row["source"]
    sources = {row["source"].split(".")[0] for row in rows if row["kind"] != "code"}
    assert sources == {"sympy", "numpy"}


def test_manifest_matches_the_committed_file() -> None:
    manifest = json.loads(MANIFEST.read_text())
    assert manifest["sha256"] == hashlib.sha256(CORPUS.read_bytes()).hexdigest()
    assert manifest["records"] == len(records())
    assert set(manifest["versions"]) == {"python", "sympy", "numpy"}


def test_regenerating_is_byte_identical(tmp_path: Path) -> None:
    manifest = json.loads(MANIFEST.read_text())
    installed = {"python": platform.python_version(), "sympy": importlib.metadata.version("sympy"),
                 "numpy": importlib.metadata.version("numpy")}
    rebuilt = make(tmp_path / "full")
    if installed == manifest["versions"]:
        assert rebuilt == CORPUS.read_bytes()
        assert (tmp_path / "full" / MANIFEST.name).read_text() == MANIFEST.read_text()
    else:  # other package versions give another corpus; it must still be reproducible
        assert make(tmp_path / "again") == rebuilt


def test_small_sample_option(tmp_path: Path) -> None:
    sample = make(tmp_path / "small", "--per-kind", "3")
    rows = [json.loads(line) for line in gzip.decompress(sample).decode().splitlines()]
    assert sorted(row["kind"] for row in rows) == ["code"] * 3 + ["math"] * 3 + ["science"] * 3
