#!/usr/bin/env python3
"""Build the demo grounding corpus ``examples/corpus/demo.jsonl.gz`` from installed text.

No package ships the paper's corpora (DCLM math, MegaScience, Nemotron code), so the demo corpus
is harvested from text that installs with spade's own dependencies:

* math    -- docstrings of SymPy (algebra, number theory, calculus, combinatorics, ...) and of
             NumPy's linear algebra, polynomial and FFT routines;
* science -- docstrings of SymPy's physics and statistics packages and of NumPy's random
             distributions (``numpy.random.Generator``, read at run time: it is compiled code);
* code    -- top-level functions and classes of pure-Python standard-library modules, as source.

Python files are parsed with :mod:`ast`, never imported. Candidates are gathered in sorted order,
filtered by length, and sampled with a fixed seed; the output is sorted by id and gzip-compressed
with mtime 0, so the same installed versions always give byte-identical files. The versions used
are written to ``demo.manifest.json`` beside the corpus.

    python tools/make_demo_corpus.py                 # rebuild examples/corpus/
    python tools/make_demo_corpus.py --out DIR --per-kind 5   # a small sample elsewhere
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import importlib.metadata
import importlib.util
import inspect
import io
import json
import platform
import random
import sys
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "examples" / "corpus"
CORPUS_NAME = "demo.jsonl.gz"
MANIFEST_NAME = "demo.manifest.json"
SEED = 20260519
PER_KIND = {"math": 160, "science": 120, "code": 120}

LICENSES = {"sympy": "BSD-3-Clause", "numpy": "BSD-3-Clause", "python": "PSF-2.0"}

# Sub-packages harvested for each kind (paths relative to the package directory).
SYMPY_MATH = ("calculus", "combinatorics", "concrete", "discrete", "functions", "geometry", "integrals",
              "logic", "matrices", "ntheory", "polys", "series", "sets", "solvers", "simplify", "tensor")
SYMPY_SCIENCE = ("physics", "stats")
NUMPY_MATH = ("linalg", "polynomial", "fft", "lib/_function_base_impl.py", "lib/_polynomial_impl.py",
              "lib/_twodim_base_impl.py", "lib/_nanfunctions_impl.py", "lib/_histograms_impl.py")
# Pure-Python standard-library modules with readable, self-contained code.
STDLIB_MODULES = ("argparse", "ast", "bisect", "calendar", "colorsys", "configparser", "csv", "dataclasses",
                  "collections/__init__", "copy", "datetime", "decimal", "difflib", "dis", "enum", "fractions",
                  "functools", "graphlib", "heapq", "html/parser", "inspect", "ipaddress", "json/decoder",
                  "json/encoder", "pathlib", "pickle", "pprint", "queue", "random", "sched", "shlex",
                  "shutil", "statistics", "string", "textwrap", "tokenize", "traceback", "urllib/parse",
                  "uuid", "zipfile")

MIN_DOC_WORDS = 120        # a docstring shorter than this is too thin to ground an environment
MAX_DOC_CHARS = 12_000     # keep single documents modest; the corpus stays small
MIN_CODE_LINES, MAX_CODE_LINES = 25, 220


@dataclass(frozen=True)
class Candidate:
    kind: str
    source: str        # dotted module path, ':' and the qualified name of the object
    text: str
    license: str


def _skip_path(path: Path) -> bool:
    return any(part in {"tests", "test", "benchmarks", "__pycache__"} for part in path.parts)


def _python_files(base: Path, entries: tuple[str, ...]) -> list[Path]:
    files: list[Path] = []
    for entry in entries:
        target = base / entry
        if target.is_file():
            files.append(target)
        elif target.is_dir():
            files.extend(p for p in target.rglob("*.py") if not _skip_path(p.relative_to(base)))
        elif not target.with_suffix(".py").is_file():
            raise SystemExit(f"make_demo_corpus: expected {target} in the installed package")
        else:
            files.append(target.with_suffix(".py"))
    return sorted(set(files))


def _module_name(path: Path, site: Path) -> str:
    parts = list(path.relative_to(site).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _walk_docstrings(tree: ast.Module) -> list[tuple[str, str]]:
    """(qualified name, cleaned docstring) of the module, its classes, functions and methods."""
    found: list[tuple[str, str]] = []
    doc = ast.get_docstring(tree)
    if doc:
        found.append(("", doc))

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                text = ast.get_docstring(child)
                if text:
                    found.append((name, text))
                if isinstance(child, ast.ClassDef):
                    visit(child, name + ".")

    visit(tree, "")
    return found


def _docstring_candidates(kind: str, package: str, entries: tuple[str, ...]) -> list[Candidate]:
    spec = importlib.util.find_spec(package)  # locates the package without importing it
    assert spec is not None and spec.submodule_search_locations is not None
    base = Path(spec.submodule_search_locations[0])
    site = base.parent
    out = []
    for path in _python_files(base, entries):
        module = _module_name(path, site)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for qualname, doc in _walk_docstrings(tree):
            text = _document(module, qualname, doc)
            if text is not None:
                out.append(Candidate(kind, f"{module}:{qualname}" if qualname else module, text, LICENSES[package]))
    return out


def _document(module: str, qualname: str, doc: str) -> str | None:
    doc = doc.strip()
    if len(doc.split()) < MIN_DOC_WORDS or len(doc) > MAX_DOC_CHARS:
        return None
    title = f"{module}.{qualname}" if qualname else module
    return f"{title}\n\n{doc}\n"


def _numpy_random_candidates() -> list[Candidate]:
    """Docstrings of numpy.random.Generator's methods (compiled, so read via inspect)."""
    import numpy.random

    out = []
    generator = numpy.random.Generator
    for name in sorted(vars(generator)):
        if name.startswith("_"):
            continue
        doc = inspect.getdoc(getattr(generator, name))
        text = _document("numpy.random.Generator", name, doc or "")
        if text is not None:
            out.append(Candidate("science", f"numpy.random:Generator.{name}", text, LICENSES["numpy"]))
    return out


def _stdlib_candidates() -> list[Candidate]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for entry in STDLIB_MODULES:
        path = stdlib / f"{entry}.py"
        module = entry.removesuffix("/__init__").replace("/", ".")
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            assert node.end_lineno is not None
            lines = source.splitlines()[start - 1:node.end_lineno]
            if not MIN_CODE_LINES <= len(lines) <= MAX_CODE_LINES:
                continue
            code = textwrap.dedent("\n".join(lines)).rstrip() + "\n"
            text = f"# Python {platform.python_version()} standard library, module {module}\n\n{code}"
            out.append(Candidate("code", f"{module}:{node.name}", text, LICENSES["python"]))
    return out


def gather() -> dict[str, list[Candidate]]:
    """Every eligible candidate, per kind, in a stable order."""
    pools = {
        "math": _docstring_candidates("math", "sympy", SYMPY_MATH) + _docstring_candidates("math", "numpy", NUMPY_MATH),
        "science": _docstring_candidates("science", "sympy", SYMPY_SCIENCE) + _numpy_random_candidates(),
        "code": _stdlib_candidates(),
    }
    for kind, pool in pools.items():
        by_text: dict[str, Candidate] = {}
        for candidate in sorted(pool, key=lambda c: c.source):  # the same text twice counts once
            by_text.setdefault(candidate.text, candidate)
        by_source: dict[str, Candidate] = {}
        for candidate in sorted(by_text.values(), key=lambda c: c.source):  # so does a name defined twice
            by_source.setdefault(candidate.source, candidate)
        pools[kind] = list(by_source.values())
    return pools


def build(per_kind: dict[str, int], seed: int = SEED) -> tuple[bytes, dict[str, object]]:
    """The gzip bytes of the corpus and its manifest."""
    pools = gather()
    rng = random.Random(seed)
    records = []
    for kind in ("math", "science", "code"):
        pool = pools[kind]
        chosen = rng.sample(pool, min(per_kind[kind], len(pool)))
        for candidate in sorted(chosen, key=lambda c: c.source):
            digest = hashlib.sha256(candidate.source.encode()).hexdigest()[:10]
            records.append({"id": f"{kind}-{digest}", "text": candidate.text, "source": candidate.source,
                             "kind": kind, "license": candidate.license})
    records.sort(key=lambda r: r["id"])
    body = "".join(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n" for record in records)
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as handle:
        handle.write(body.encode("utf-8"))
    data = buffer.getvalue()
    manifest = {
        "file": CORPUS_NAME,
        "sha256": hashlib.sha256(data).hexdigest(),
        "records": len(records),
        "per_kind": {kind: sum(r["kind"] == kind for r in records) for kind in ("math", "science", "code")},
        "candidates": {kind: len(pool) for kind, pool in pools.items()},
        "words": sum(len(r["text"].split()) for r in records),
        "seed": seed,
        "versions": versions(),
    }
    return data, manifest


def versions() -> dict[str, str]:
    return {"python": platform.python_version(), "sympy": importlib.metadata.version("sympy"),
            "numpy": importlib.metadata.version("numpy")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default: {DEFAULT_OUT})")
    parser.add_argument("--per-kind", type=int, default=None, metavar="N",
                        help="documents per kind (default: " + ", ".join(f"{k} {v}" for k, v in PER_KIND.items()) + ")")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    per_kind = dict(PER_KIND) if args.per_kind is None else {kind: args.per_kind for kind in PER_KIND}
    data, manifest = build(per_kind, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / CORPUS_NAME).write_bytes(data)
    (args.out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out / CORPUS_NAME}: {manifest['records']} documents {manifest['per_kind']}, "
          f"{len(data):,} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
