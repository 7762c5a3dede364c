"""Program size (SPEC 6: about 320 lines, 13 state variables, 8-10 turns per episode).

* ``lines``: physical lines of the source; ``code_lines``: those that are neither blank nor only
  a comment.
* ``state_variables``: distinct attribute names assigned on ``self`` (``self.x = ...``,
  ``self.x += ...``, ``self.x: T = ...``, tuple targets too) anywhere in the environment class
  (the admitted ``class_name``; else every class whose name ends in ``Env``), found by walking the
  AST. Methods and class constants are not state.
* ``turns``: mean number of turns of the kept no-hint episodes.
"""

from __future__ import annotations

import ast
from typing import Any, Iterable


def line_counts(source: str) -> dict[str, int]:
    lines = source.splitlines()
    code = [line for line in lines if line.strip() and not line.strip().startswith("#")]
    return {"lines": len(lines), "code_lines": len(code)}


def _targets(node: ast.AST) -> Iterable[ast.AST]:
    if isinstance(node, (ast.Tuple, ast.List)):
        for element in node.elts:
            yield from _targets(element)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)
    else:
        yield node


def state_variables(source: str, class_name: str | None = None) -> list[str] | None:
    """Sorted names of ``self.*`` attributes assigned in the environment class; None if it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    chosen = [c for c in classes if class_name and c.name == class_name] or \
        [c for c in classes if c.name.endswith("Env")]
    names: set[str] = set()
    for cls in chosen:
        for node in ast.walk(cls):
            if isinstance(node, ast.Assign):
                targets = [t for target in node.targets for t in _targets(target)]
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = list(_targets(node.target))
            elif isinstance(node, ast.NamedExpr):
                targets = []
            else:
                continue
            for target in targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id == "self":
                    names.add(target.attr)
    return sorted(names)


def program_size(source: str, class_name: str | None, episode_turns: list[int]) -> dict[str, Any]:
    variables = state_variables(source, class_name)
    return {**line_counts(source), "state_variables": None if variables is None else len(variables),
            "state_variable_names": variables,
            "turns": (sum(episode_turns) / len(episode_turns)) if episode_turns else None}
