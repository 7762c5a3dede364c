"""Names bound in a pool game's module before it runs, as the paper's released loader binds them.

The released trainer (spade-rl/spade, ``spare/core/envs/synthetic_game_env.py``, its
``_inject_common_stdlib``) puts common standard-library modules and names, and numpy, into every
game's namespace before executing it, so a released game may use ``deque`` or ``math.sqrt``
without importing them. A load request with ``released_loader_names: true`` asks the child to do
the same (:func:`bind`). The table is fixed here: a request can only switch it on or off, never
name a module. Each module is imported by the child itself, and only when its top-level package is
on the sandbox's import allow-list, so the game gets nothing it could not import itself.

numpy (``np``, ``numpy``) is in the released table and on the allow-list only with
``sandbox.offer_numpy`` (the sandbox's Python runs isolated, ``-I -S``, without site-packages; the
switch mounts numpy and imports it in the zygote), so it is bound only then.
"""

from __future__ import annotations

import importlib
from typing import Any

# (name bound in the game's module, module it comes from, attribute of that module or None for
# the module itself), in the released table's order.
RELEASED_LOADER_NAMES: tuple[tuple[str, str, str | None], ...] = (
    *((module, module, None) for module in (
        "itertools", "math", "random", "re", "json", "collections", "functools", "string", "copy",
        "heapq", "operator", "statistics")),
    ("np", "numpy", None),
    ("numpy", "numpy", None),
    *((name, "collections", name) for name in ("deque", "defaultdict", "Counter", "OrderedDict", "namedtuple")),
    *((name, "itertools", name) for name in ("combinations", "permutations", "product", "chain", "accumulate")),
    ("reduce", "functools", "reduce"),
    ("lru_cache", "functools", "lru_cache"),
    ("deepcopy", "copy", "deepcopy"),
    ("heappush", "heapq", "heappush"),
    ("heappop", "heapq", "heappop"),
    *((name, "typing", name) for name in (
        "Tuple", "Dict", "List", "Optional", "Union", "Any", "Set", "FrozenSet", "Callable", "Iterable",
        "Sequence", "Mapping")),
)


def offered(allowed_imports: tuple[str, ...] | frozenset[str]) -> tuple[tuple[str, str, str | None], ...]:
    """The rows of the released table whose module is on ``allowed_imports`` (numpy is only with
    ``sandbox.offer_numpy``)."""
    allowed = frozenset(allowed_imports)
    return tuple(row for row in RELEASED_LOADER_NAMES if row[1].partition(".")[0] in allowed)


def bind(namespace: dict[str, Any], allowed_imports: tuple[str, ...] | frozenset[str]) -> list[str]:
    """Bind the offered names in ``namespace`` (a name already there is kept, as the released loader
    keeps it); returns the names bound. Runs in the child, before the game's code."""
    bound: list[str] = []
    for name, module_name, attribute in offered(allowed_imports):
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - a module that does not import here is not offered
            continue
        value = module if attribute is None else getattr(module, attribute)
        if name not in namespace:
            namespace[name] = value
            bound.append(name)
    return bound
