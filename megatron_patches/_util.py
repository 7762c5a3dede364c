"""Small helpers shared by the patch modules: when to patch, and how to swap an attribute once."""

from __future__ import annotations

from typing import Any

import torch

_MARK = "__spade_patch__"


def cuda_available() -> bool:
    """True when a CUDA device can be used; every CPU patch stands down then."""
    return torch.cuda.is_available()


def is_patched(owner: Any, name: str) -> bool:
    """Whether ``owner.name`` is already one of our replacements."""
    current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    target = getattr(current, "__func__", current)  # staticmethod/classmethod wrappers
    return bool(getattr(target, _MARK, False))


def replace(owner: Any, name: str, new: Any) -> bool:
    """Set ``owner.name = new`` unless an earlier call already did; returns True if it changed.

    The replaced object is kept on the replacement as ``__spade_original__`` so tests (and a
    curious reader) can reach the upstream version.
    """
    if is_patched(owner, name):
        return False
    original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    target = getattr(new, "__func__", new)
    setattr(target, _MARK, True)
    setattr(target, "__spade_original__", original)
    setattr(owner, name, new)
    return True


def original_of(owner: Any, name: str) -> Any:
    """The upstream object a replacement stands in for (or the current one if unpatched)."""
    current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
    target = getattr(current, "__func__", current)
    return getattr(target, "__spade_original__", current)
