"""The package's layers (ARCHITECTURE.md, "Layers"): imports run downward only, for the whole of
``spade``. Each top-level folder or module (a *part*) sits on one layer; a part imports only parts on
lower layers; no two module files import each other, directly or round a loop (imports inside
functions included); no file is over 700 lines. Inside ``spade/rollout`` the two engines do not import
each other and what both use imports neither.

A new top-level part must be given a layer here: the test names it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SPADE = Path(__file__).resolve().parents[1] / "spade"
MAX_LINES = 700

# top to bottom; a part may import the parts of any lower layer, none of its own layer or above
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer) for layer in (
    {"__init__", "__main__"},
    {"cli"},
    {"run"},
    {"train_config"},
    {"eval", "analysis", "pool"},
    {"serve", "selfplay"},
    {"training", "rollout"},
    {"envs"},
    {"designer"},
    {"agent"},
    {"rl", "models"},
    {"config", "collectives", "durable_files", "peak_memory", "process_group", "deferred_imports"},
))
ROLLOUT_SHARED = ("rollout.engine", "rollout.conversation", "rollout.weight_buckets")  # below both engines


def module_name(path: Path) -> str:
    """``spade/rollout/hf/engine.py`` -> ``rollout.hf.engine``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(SPADE).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def module_file(dotted: str, modules: set[str]) -> str | None:
    """The module of ours a dotted import (without ``spade.``) lands in: its longest known prefix."""
    bits = dotted.split(".")
    for n in range(len(bits), 0, -1):
        if ".".join(bits[:n]) in modules:
            return ".".join(bits[:n])
    return None


def imported_names(path: Path, module: str) -> list[str]:
    """Every ``spade`` name ``path`` imports, anywhere in it, without the leading ``spade.``."""
    if module == "__init__":  # spade/__init__.py: the package itself
        package: list[str] = []
    else:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module_path = ".".join(base + ([node.module] if node.module else []))
                found = [module_path] + [f"{module_path}.{alias.name}".lstrip(".") for alias in node.names]
                names.extend(found)
                continue
            found = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        names.extend(name.split(".", 1)[1] for name in found if name.startswith("spade."))
    return names


PACKAGES = {module_name(p) for p in SPADE.rglob("__init__.py")}


def import_graph() -> dict[str, set[str]]:
    """Module file -> the module files of ours it imports (a package's ``__init__`` is a node too)."""
    files = {module_name(p): p for p in SPADE.rglob("*.py")}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = {module_file(name, modules) for name in imported_names(path, module)}
        graph[module] = {t for t in targets if t is not None and t != module}
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


def part(module: str) -> str:
    return module.split(".")[0]


def layer_of(name: str) -> int:
    for index, layer in enumerate(LAYERS):
        if name in layer:
            return index
    raise KeyError(name)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_readers_see_what_they_should(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    source = tmp_path / "mod.py"
    source.write_text("from .x import y\nfrom ..run import trainer\nimport spade.rl.loss\ndef f():\n"
                      "    from spade.models import spec\n")
    assert set(imported_names(source, "selfplay.plays.mod")) >= {"selfplay.plays.x", "selfplay.plays.x.y",
                                                                 "selfplay.run", "selfplay.run.trainer",
                                                                 "rl.loss", "models", "models.spec"}


def test_every_part_has_a_layer(graph):
    unplaced = sorted({part(m) for m in graph} - set().union(*LAYERS))
    assert unplaced == [], f"give these parts a layer in LAYERS: {unplaced}"


def test_imports_run_downward_between_parts(graph):
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                    if part(t) != part(m) and layer_of(part(t)) <= layer_of(part(m)))
    assert upward == []


def test_no_import_loop_between_files(graph):
    """Between module files; a package's ``__init__`` only re-exports, so it is left out (importing a
    package runs its ``__init__`` before the module, which is not a loop of ours)."""
    files = {m: {t for t in targets if t not in PACKAGES} for m, targets in graph.items() if m not in PACKAGES}
    assert cycles(files) == []


def test_the_rollout_engines_stand_apart(graph):
    for name in ROLLOUT_SHARED:
        assert not {t for t in graph[name] if t.startswith(("rollout.hf.", "rollout.sglang."))}, name
    for module, targets in graph.items():
        for mine, other in (("rollout.hf.", "rollout.sglang."), ("rollout.sglang.", "rollout.hf.")):
            if module.startswith(mine):
                assert not any(t.startswith(other) for t in targets), (module, targets)
    assert "rollout.hf.engine" in graph and "rollout.sglang.engine" in graph


def test_no_file_over_700_lines():
    long = {str(p.relative_to(SPADE)): n for p in SPADE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
