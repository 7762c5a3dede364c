r"""Turn an agent response into the action passed to ``env.step``.

The action is the content of the last complete ``\boxed{...}`` (nested braces
allowed), re-wrapped as ``\boxed{content}``; without one it is the stripped raw
text.  The reasoning is set aside first (``reasoning.drop_leading_block``: SGLang's
``qwen3`` reading; a reply cut inside ``<think>`` has no action).  Standard library only.

Which box is the action is ``selfplay.action_extraction`` (:data:`ACTION_EXTRACTIONS`):

- ``last_box`` (spade's default): the last complete box, nested braces allowed (above).
- ``first_flat_box``: the released code's reading (``spade/core/utils/parsing.py:7-36`` and
  ``:75-79`` of spade-rl/spade at 9b2b813): the first box anywhere in the answer whose content has
  no brace (then the first ``\boxed{{...}}``, then the first ``\boxed{{{...}}}``); only when there
  is none, the box that opens at the last ``\boxed``, read by brace depth, with up to two outer
  brace pairs peeled off.  An empty result gives the stripped text, as with no box.
"""

from __future__ import annotations

import re

from .reasoning import drop_leading_block

__all__ = ["ACTION_EXTRACTIONS", "boxed_contents", "first_flat_box", "parse_action"]

ACTION_EXTRACTIONS: tuple[str, ...] = ("last_box", "first_flat_box")

_BOX_OPEN = re.compile(r"\\boxed\s*\{")
# \boxed{x}, \boxed{{x}}, \boxed{{{x}}} with brace-free x, tried in this order (released parsing.py:10-14)
_FLAT_BOXES = tuple(re.compile(r"\\boxed" + r"\{" * n + r"([^{}]+)" + r"\}" * n) for n in (1, 2, 3))


def parse_action(response: str, extraction: str = "last_box") -> str:
    r"""The action in ``response``: ``\boxed{<content>}`` of the box ``extraction`` picks, or the
    stripped text when it picks none (see the module doc)."""
    answer = drop_leading_block(response)
    if extraction == "first_flat_box":
        content = first_flat_box(answer)
        return "\\boxed{" + content + "}" if content else answer.strip()
    if extraction != "last_box":
        raise ValueError(f"selfplay.action_extraction: {extraction!r} is not allowed; choose one of: "
                         f"{', '.join(ACTION_EXTRACTIONS)}")
    contents = boxed_contents(answer)
    if contents:
        return "\\boxed{" + contents[-1].strip() + "}"
    return answer.strip()


def first_flat_box(text: str) -> str | None:
    r"""The released code's box content (stripped), or None when it finds no closed box.

    The first brace-free box anywhere wins (single, then double, then triple braces); else the
    first ``{`` after the last ``\boxed`` is followed by depth to its closing brace and up to two
    outer ``{...}`` pairs of the content are removed.
    """
    for pattern in _FLAT_BOXES:
        found = pattern.search(text)
        if found:
            return found.group(1).strip()
    last = text.rfind("\\boxed")
    start = text.find("{", last) if last >= 0 else -1
    if start < 0:
        return None
    depth = 0
    for index in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            content = text[start + 1:index].strip()
            for _ in range(2):
                if content.startswith("{") and content.endswith("}"):
                    content = content[1:-1].strip()
            return content
    return None


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
