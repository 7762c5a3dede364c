#!/usr/bin/env python3
"""Write docs/config.md, the reference of every key of a training config, from the config dataclasses.

The text of each key is the comment its field carries in the source (the comment lines right above
the field, or the comment at the end of its line); the type and default come from the dataclass
itself. Nested sections (``selfplay.rewards``, ``engine.sglang``, ...) get their own tables. The
file is generated, never edited by hand: tests/test_config_reference.py fails when it is stale.

    python tools/config_reference.py            # rewrite docs/config.md
    python tools/config_reference.py --check    # exit 1 when docs/config.md is not current
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import io
import sys
import tokenize
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as `python tools/x.py` from a checkout without installing
    sys.path.insert(0, str(REPO))

OUTPUT = REPO / "docs" / "config.md"
HEADER = """\
# Configuration reference

Every key of a `spade train` config, section by section, with its type, its default and what it
does. This page is generated from the config dataclasses (their field comments are the text) by
`python tools/config_reference.py`; do not edit it by hand. How a config is read (`include:`,
dotted overrides such as `selfplay.k=4`, relative paths) is in the docstring of
`spade/train_config.py`; where each value comes from (the paper, the released runs, spade) is in
[fidelity.md](fidelity.md); renamed keys still load and say their new name.
"""


@dataclass(frozen=True)
class Key:
    path: str  # dotted, e.g. "selfplay.rewards.designer_reward"
    type: str
    default: str
    text: str


@dataclass(frozen=True)
class Section:
    path: str
    owner: str  # the dataclass, e.g. "spade.selfplay.settings.SelfPlaySettings"
    summary: str  # the first paragraph of the dataclass's docstring
    keys: tuple[Key, ...]


@functools.lru_cache(maxsize=None)
def _source_of(path: str) -> tuple[ast.Module, dict[int, str]]:
    """The parsed file and its comments by line number."""
    text = Path(path).read_text()
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(text).readline) if tok.type == tokenize.COMMENT}
    return ast.parse(text), comments


def _class_node(cls: type) -> ast.ClassDef:
    tree, _ = _source_of(inspect.getsourcefile(cls))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return node
    raise LookupError(f"no class {cls.__name__} in {inspect.getsourcefile(cls)}")


def _field_comments(cls: type) -> dict[str, tuple[str, str]]:
    """Each annotated field of ``cls`` (and of its dataclass bases): its annotation as written and its
    comment (the comment lines directly above it, else the comment at the end of its line)."""
    found: dict[str, tuple[str, str]] = {}
    for base in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(base) or base is object:
            continue
        path = inspect.getsourcefile(base)
        tree, comments = _source_of(path)
        source = Path(path).read_text()
        for stmt in _class_node(base).body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            above: list[str] = []
            line = stmt.lineno - 1
            while line in comments and not _code_on(source, line):
                above.insert(0, comments[line])
                line -= 1
            trailing = comments.get(stmt.end_lineno, "") if _code_on(source, stmt.end_lineno) else ""
            text = " ".join(part for part in (" ".join(above), trailing) if part)
            found[stmt.target.id] = (ast.get_source_segment(source, stmt.annotation) or "", text)
    return found


def _code_on(source: str, line: int) -> bool:
    """Whether ``line`` (1-based) holds code before any comment."""
    lines = source.splitlines()
    if not 1 <= line <= len(lines):
        return False
    return not lines[line - 1].lstrip().startswith("#") and bool(lines[line - 1].strip())


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _shown(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "(required)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_shown(v)}" for k, v in value.items()) + "}"
    return str(value)


def _nested(hint: Any) -> Optional[type]:
    """The dataclass a field holds (directly or as Optional[...]), else None."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        return _nested(args[0])
    return None


def sections(cls: type, path: str) -> Iterator[Section]:
    """The section ``path`` (held by dataclass ``cls``) and, after it, every section nested in it."""
    hints = typing.get_type_hints(cls)
    written = _field_comments(cls)
    keys: list[Key] = []
    children: list[tuple[type, str]] = []
    for field in dataclasses.fields(cls):
        if not field.init or field.name.startswith("_"):
            continue
        key = f"{path}.{field.name}"
        annotation, text = written.get(field.name, ("", ""))
        text = text or _from_docstring(cls, field.name)
        child = _nested(hints.get(field.name))
        if child is not None:
            children.append((child, key))
            keys.append(Key(key, "section", f"see [{key}](#{_anchor(key)})", text))
            continue
        keys.append(Key(key, annotation, _shown(_default(field)), text))
    doc = inspect.getdoc(cls) or ""
    own_doc = doc if cls.__doc__ else ""  # a dataclass without one gets a generated signature
    summary = own_doc.split("\n\n")[0].replace("\n", " ") if own_doc and not own_doc.startswith(cls.__name__ + "(") else ""
    yield Section(path, f"{cls.__module__}.{cls.__qualname__}", summary, tuple(keys))
    for child, key in children:
        yield from sections(child, key)


def _from_docstring(cls: type, name: str) -> str:
    """The paragraph of the class docstring that speaks of ``name`` first (as ````name````), for a
    field without a comment of its own."""
    for paragraph in (cls.__doc__ and inspect.cleandoc(cls.__doc__) or "").split("\n\n"):
        if f"``{name}``" in paragraph:
            return " ".join(paragraph.split())
    return ""


def _anchor(path: str) -> str:
    return path.replace(".", "").lower()  # GitHub drops the dots of a heading in its anchor


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    from spade.train_config import SECTIONS, TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    out = [HEADER]
    out.append("Sections: " + ", ".join(f"[`{name}`](#{_anchor(name)})" for name in SECTIONS) + ".\n")
    for name in SECTIONS:
        for section in sections(hints[name], name):
            out.append(f"## {section.path}\n")
            out.append(f"`{section.owner}`" + (f": {_cell(section.summary)}" if section.summary else "") + "\n")
            out.append("| key | type | default | meaning |")
            out.append("|---|---|---|---|")
            for key in section.keys:
                out.append(f"| `{key.path}` | `{_cell(key.type)}` | `{_cell(key.default)}` | {_cell(key.text)} |"
                           .replace("| `see [", "| see [").replace(")` |", ") |"))
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/config.md is not current")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(REPO)} is stale: run `python tools/config_reference.py`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(REPO)} ({text.count(chr(10) + '| `')} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
