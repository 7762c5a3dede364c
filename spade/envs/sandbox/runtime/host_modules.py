"""Pure modules of the trainer's own package, made importable inside the sandbox from their source.

The sandbox sees only this runtime folder, not the ``spade`` package. A few pure, standard-library
modules that code here must share with the trainer (the reply parser the probes play through)
travel as source text in the zygote's start record (:data:`SHARED`, read by the supervisor from
the installed package) and are executed once in the zygote, before any child is forked, as
modules of a package ``host``: ``host.actions`` is ``spade.agent.actions``, the same text.
Nothing here comes from a request or from generated code; a generated environment can no more
import ``host`` than any other name off the sandbox's import allow-list.
"""

from __future__ import annotations

import sys
import types

PACKAGE = "host"
# module name under ``host`` -> the trainer's module whose source it is, in dependency order
SHARED: tuple[tuple[str, str], ...] = (
    ("reasoning", "spade.agent.reasoning"),
    ("actions", "spade.agent.actions"),
)


def install(sources: dict[str, str]) -> list[str]:
    """Execute each shared module's source as ``host.<name>`` (relative imports between them
    work); returns the names installed. A missing source is skipped: what needs it says so."""
    package = sys.modules.get(PACKAGE)
    if package is None:
        package = types.ModuleType(PACKAGE)
        package.__path__ = []  # a package, so that relative imports resolve
        sys.modules[PACKAGE] = package
    installed = []
    for name, _ in SHARED:
        source = sources.get(name)
        if not isinstance(source, str):
            continue
        module = types.ModuleType(f"{PACKAGE}.{name}")
        module.__package__ = PACKAGE
        sys.modules[module.__name__] = module
        exec(compile(source, f"<host {name}>", "exec"), module.__dict__)
        setattr(package, name, module)
        installed.append(name)
    return installed


def parse_action() -> "types.FunctionType | None":
    """``spade.agent.actions.parse_action`` as installed here, or None when it was not sent."""
    module = sys.modules.get(f"{PACKAGE}.actions")
    return getattr(module, "parse_action", None)
