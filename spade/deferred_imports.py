"""A library import that every spade process paid for at start-up and almost never used, made on first use.

transformers 5.19's ``transformers.generation.candidate_generator``, imported with any causal-LM
class, runs ``from sklearn.metrics import roc_curve`` when scikit-learn is installed (spade installs
it for its analysis). ``roc_curve`` serves one option of assisted decoding (adapting the
assistant model's confidence threshold), which spade never uses, and importing scikit-learn with
SciPy costs about 0.6-0.9 CPU-seconds in every process that loads a model: each ``spade train``
rank, rollout server and test subprocess.

:func:`install` (called by ``spade/__init__.py``) has that one module bind a ``roc_curve`` that
imports scikit-learn's when it is first called, and returns its result: the same function, imported
later. Nothing else changes: ``is_sklearn_available()`` is still true, every other import of
``sklearn.metrics`` (spade's analysis) gets the real module, and where scikit-learn or
``sklearn.metrics`` is already imported the module is loaded as usual.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

TARGET = "transformers.generation.candidate_generator"
DEFERRED = "sklearn.metrics"


def roc_curve(*args, **kwargs):
    """scikit-learn's ``roc_curve``, imported on this first call."""
    from sklearn.metrics import roc_curve as real

    return real(*args, **kwargs)


def _stand_in() -> types.ModuleType:
    """What ``sklearn.metrics`` is while the target module runs: ``roc_curve`` above, and the real
    module for any other name (importing it then)."""
    module = types.ModuleType(DEFERRED)
    module.roc_curve = roc_curve

    def other_name(name: str):
        if name.startswith("__"):  # the import system asks for __path__, __spec__, ...
            raise AttributeError(name)
        if sys.modules.get(DEFERRED) is module:
            del sys.modules[DEFERRED]
        return getattr(importlib.import_module(DEFERRED), name)

    module.__getattr__ = other_name  # type: ignore[method-assign]
    return module


class _LoaderWithDeferredSklearn(importlib.abc.Loader):
    """The target's own loader, with :func:`_stand_in` as ``sklearn.metrics`` while it executes."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        if DEFERRED in sys.modules or "sklearn" in sys.modules:
            self.loader.exec_module(module)
            return
        stand_in = _stand_in()
        sys.modules[DEFERRED] = stand_in
        try:
            self.loader.exec_module(module)
        finally:
            if sys.modules.get(DEFERRED) is stand_in:
                del sys.modules[DEFERRED]

    def __getattr__(self, name: str):  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self.loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _LoaderWithDeferredSklearn(spec.loader)
        return spec


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once); a no-op where the target is already imported."""
    if TARGET in sys.modules or any(isinstance(finder, _Finder) for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
