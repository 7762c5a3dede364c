"""Loading a trusted, hand-written tool environment in this process (tests, benchmarks, scripted
solutions). Generated code never goes through here: it runs in the sandbox."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from ..sandbox.runtime.tool_base import ToolUseBaseEnv

EXAMPLES_DIR = Path(__file__).resolve().parents[3] / "examples" / "envs" / "tool_use"


def is_tool_source(source: str) -> bool:
    """Whether ``source`` defines a class that names ``ToolUseBaseEnv`` among its bases (a syntax
    check only: nothing runs)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if (isinstance(base, ast.Name) and base.id == "ToolUseBaseEnv") or \
                        (isinstance(base, ast.Attribute) and base.attr == "ToolUseBaseEnv"):
                    return True
    return False


def load_trusted(source: str, name: str = "<tool env>") -> type:
    """The environment class of ``source``, executed here with ``ToolUseBaseEnv`` in its namespace."""
    namespace: dict[str, Any] = {"ToolUseBaseEnv": ToolUseBaseEnv, "__name__": "environment"}
    exec(compile(source, name, "exec"), namespace)  # noqa: S102 - trusted, hand-written sources only
    classes = [v for v in namespace.values() if isinstance(v, type) and v.__name__.endswith("Env")
               and issubclass(v, ToolUseBaseEnv) and v is not ToolUseBaseEnv]
    if not classes:
        raise ValueError(f"{name}: no ToolUseBaseEnv subclass ending in 'Env'")
    return classes[-1]


def example_paths() -> list[Path]:
    return sorted(EXAMPLES_DIR.glob("*.py"))


def scripted_calls(source: str, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """The scripted solution path (``solution_calls()``) of a hand-written environment for ``seed``."""
    env = load_trusted(source)()
    env.reset(seed=seed)
    return list(env.solution_calls())
