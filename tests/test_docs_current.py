"""README.md and docs/ name things that exist: every repository path and dotted ``spade.`` name,
the config tree's sections, the environment error kinds and failure stages."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from spade.envs.protocol import ErrorKind, Stage
from spade.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]
# Paths of the paper's released repository (spade-rl/spade), quoted in the fidelity notes, not ours.
RELEASED = ("spade/core", "spade/slime")
PATH = re.compile(r"(?<![\w/.\-])((?:spade|megatron_patches|tools|tests|benchmarks|examples)/[\w/.\-]*\w)")
DOTTED = re.compile(r"(?<![\w/.])(spade(?:\.\w+)+)")
MEMBER = re.compile(r"(?<![\w/.\-])((?:spade|megatron_patches|tools)/[\w/]*\.py)::(\w+)")  # path::Name


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def _defines(module_file: Path, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", module_file.read_text()) is not None


def dotted_exists(name: str) -> bool:
    """``spade.a.b.C``: the longest prefix that is a module or package, and the next part named in it."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            return cut == len(parts) or _defines(module, parts[cut])
    return False


def path_exists(path: str) -> bool:
    """A file or folder; ``examples/corpus/demo`` of ``demo.*`` (a stem); ``spade/x/y.name``: ``name``
    in ``spade/x/y.py``."""
    if (ROOT / path).exists() or any((ROOT / path).parent.glob((ROOT / path).name + ".*")):
        return True
    module, _, name = path.rpartition(".")
    return bool(module) and (ROOT / (module + ".py")).is_file() and _defines(ROOT / (module + ".py"), name)


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_paths_and_names_exist(doc: Path) -> None:
    text = doc.read_text()
    missing = [p for p in PATH.findall(text) if not p.startswith(RELEASED) and not path_exists(p)]
    missing += [n for n in DOTTED.findall(text) if not dotted_exists(n)]
    missing += [f"{p}::{n}" for p, n in MEMBER.findall(text)
                if not ((ROOT / p).is_file() and re.search(rf"^(class|def) {n}\b", (ROOT / p).read_text(), re.M))]
    assert not missing, f"{doc.relative_to(ROOT)} names what the tree does not hold: {sorted(set(missing))}"


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def test_readme_config_sections() -> None:
    listed = re.search(r"One typed config tree \(`spade/train_config.py`: `([^`]+)`\)", _readme())
    assert listed, "README's config-tree sentence not found"
    assert [s.strip() for s in listed.group(1).split(",")] == [f.name for f in dataclasses.fields(TrainConfig)]


def _backticked_list(text: str) -> list[str]:
    return [word.strip() for word in text.replace("\n", " ").split(",")]


def test_sandbox_doc_error_kinds_and_stages() -> None:
    text = (ROOT / "docs" / "sandbox.md").read_text()
    kinds = re.search(r"The kinds:\s*`([^`]+)`", text)
    stages = re.search(r"`stage` \(`([^`]+)`\)", text)
    assert kinds and stages, "docs/sandbox.md's lists of error kinds and stages not found"
    assert sorted(_backticked_list(kinds.group(1))) == sorted(k.value for k in ErrorKind)
    assert sorted(_backticked_list(stages.group(1))) == sorted(s.value for s in Stage)


def test_readme_reading_order_comes_first() -> None:
    """The paragraph that says where to start reading follows the two commands at the top."""
    text = _readme()
    assert text.index("the one file to read first") < text.index("## Status")
