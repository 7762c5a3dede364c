"""The shape of ``spade/rollout`` (issue 22): the hf and SGLang engines in folders of their own
beside what both use, files that import downward only (no circle between two files, imports
inside functions included), and no file over 700 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROLLOUT = Path(__file__).resolve().parents[1] / "spade" / "rollout"
PACKAGE = "spade.rollout"
SHARED = ("engine", "conversation", "weight_buckets")  # below both engines: import neither


def _dotted(path: Path) -> str:
    parts = path.relative_to(ROLLOUT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE,) + parts)


def _file_of(dotted: str) -> str | None:
    """The rollout module file (dotted, without the package) a dotted name lands in."""
    bits = dotted.split(".")
    if bits[:2] != PACKAGE.split("."):
        return None
    rest = bits[2:]
    for n in range(len(rest), 0, -1):
        if (ROLLOUT.joinpath(*rest[:n]).with_suffix(".py")).is_file():
            return ".".join(rest[:n])
    return None


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(ROLLOUT.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        here = _dotted(path)
        node = here.split(".", 2)[2]
        package = here.rsplit(".", 1)[0]
        targets: set[str] = set()
        for item in ast.walk(ast.parse(path.read_text())):
            if isinstance(item, ast.Import):
                names = [alias.name for alias in item.names]
            elif isinstance(item, ast.ImportFrom):
                base = package if not item.level else ".".join(package.split(".")[: len(package.split(".")) - item.level + 1])
                module = (base + "." + item.module if item.level else item.module) if item.module else base
                names = [module] + [module + "." + alias.name for alias in item.names]
            else:
                continue
            for name in names:
                target = _file_of(name)
                if target is not None and target != node:
                    targets.add(target)
        graph[node] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return found


def test_the_graph_reader_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_between_rollout_files():
    graph = import_graph()
    assert cycles(graph) == []
    assert "sglang.engine" in graph and "hf.engine" in graph


def test_what_both_engines_use_imports_neither():
    graph = import_graph()
    for name in SHARED:
        assert not {t for t in graph[name] if t.startswith(("hf.", "sglang."))}, name


def test_the_engines_do_not_import_each_other():
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith("hf."):
            assert not any(t.startswith("sglang.") for t in targets), (name, targets)
        if name.startswith("sglang."):
            assert not any(t.startswith("hf.") for t in targets), (name, targets)


def test_no_rollout_file_over_700_lines():
    long = {str(p.relative_to(ROLLOUT)): n for p in ROLLOUT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 700}
    assert long == {}
