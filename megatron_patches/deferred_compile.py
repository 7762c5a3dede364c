"""Import megatron-core without building its ``torch.compile`` wrappers at import time.

megatron-core 0.16.1 sets ``megatron.core.jit.jit_fuser = torch.compile`` (torch >= 2.2) and
decorates its fusion functions with it when their modules are imported. Each ``torch.compile(fn)``
imports TorchInductor, about 1 s of CPU in every process that imports ``megatron.core`` (half of
that import), although the CPU path rarely or never calls a fused function. ``import_megatron_core``
imports the package while ``torch.compile`` is replaced by :func:`deferred`, which returns a
function that calls the real ``torch.compile`` on its first call and the compiled function from
then on: what runs is the same; only the moment of compilation's imports moves. ``torch.compile``
itself is restored as soon as the import ends, so code outside megatron is never affected.

The same import also loads Weights & Biases where it is installed (spade's trackers install it):
``megatron.core.timers`` and the dynamic inference engine and context try ``import wandb`` for
their own logging, which spade never uses (its trackers log; ``spade.run.trackers``), and that is
about 0.45 s of CPU in every process. While ``megatron.core`` is imported, ``wandb`` is marked
absent (megatron then sets its own ``wandb = None``, as without the package); the mark is removed
afterwards, so spade's W&B tracker imports the real package. Where ``wandb`` is already imported,
megatron gets it as before.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Optional

import torch

__all__ = ["deferred", "import_megatron_core"]


def deferred(compile_fn: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for ``compile_fn`` (``torch.compile``) that compiles on a function's first call.

    Supports both decorator forms, ``@compile`` and ``@compile(**options)``."""

    def compile_later(fn: Optional[Callable[..., Any]] = None, **options: Any) -> Callable[..., Any]:
        if fn is None:
            return lambda f: compile_later(f, **options)
        compiled: Optional[Callable[..., Any]] = None

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal compiled
            if compiled is None:
                compiled = compile_fn(fn, **options)
            return compiled(*args, **kwargs)

        return call

    return compile_later


def import_megatron_core() -> None:
    """Import ``megatron.core`` with its fusion functions compiled on first use (a no-op once imported)."""
    if "megatron.core" in sys.modules:
        return
    real = torch.compile
    torch.compile = deferred(real)
    hide_wandb = "wandb" not in sys.modules
    if hide_wandb:
        sys.modules["wandb"] = None  # type: ignore[assignment]  # `import wandb` raises ImportError
    try:
        import megatron.core  # noqa: F401
    finally:
        torch.compile = real
        if hide_wandb and sys.modules.get("wandb", 0) is None:
            del sys.modules["wandb"]
