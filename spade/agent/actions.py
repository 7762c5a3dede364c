r"""Turn an agent response into the action passed to ``env.step``.

The action is the content of the last complete ``\boxed{...}`` (nested braces
allowed), re-wrapped as ``\boxed{content}``; without one it is the stripped raw
text.  The reasoning is set aside first (``reasoning.drop_leading_block``: SGLang's
``qwen3`` reading; a reply cut inside ``<think>`` has no action).  Standard library only.
"""

from __future__ import annotations

import re

from .reasoning import drop_leading_block

__all__ = ["boxed_contents", "parse_action"]

_BOX_OPEN = re.compile(r"\\boxed\s*\{")


def parse_action(response: str) -> str:
    r"""The action in ``response``: ``\boxed{<last box content>}`` or the stripped text."""
    answer = drop_leading_block(response)
    contents = boxed_contents(answer)
    if contents:
        return "\\boxed{" + contents[-1].strip() + "}"
    return answer.strip()


def boxed_contents(text: str) -> list[str]:
    r"""Contents of every complete, non-nested ``\boxed{...}`` in ``text``, in order.

    A box whose brace is never closed is skipped; boxes inside it still count.
    """
    closing = _matching_braces(text)
    contents: list[str] = []
    taken_until = 0
    for match in _BOX_OPEN.finditer(text):
        brace = match.end() - 1
        if brace < taken_until or brace not in closing:
            continue
        contents.append(text[brace + 1:closing[brace]])
        taken_until = closing[brace] + 1
    return contents


def _matching_braces(text: str) -> dict[int, int]:
    """Map each ``{`` that gets closed to the index of its ``}``."""
    closing: dict[int, int] = {}
    open_braces: list[int] = []
    for index, char in enumerate(text):
        if char == "{":
            open_braces.append(index)
        elif char == "}" and open_braces:
            closing[open_braces.pop()] = index
    return closing
