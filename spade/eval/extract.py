"""Answer extraction from completions: ``\\boxed{}`` contents and choice letters.

Only the answer counts, never the reasoning (:func:`strip_thinking`): the text after the last
``</think>``; a reply inside a ``<think>`` block that never closes (cut at its token limit, or a
prompt that opened the block, ``inside``) has no answer at all, whatever its reasoning tried.
Extraction is strict, as the released evaluator's: the last ``\\boxed{...}`` only (no fallback to an
earlier box, no prose).
"""

from __future__ import annotations

import re
from typing import Optional

from ..agent.reasoning import CLOSE, OPEN

_BOX = re.compile(r"\\(?:boxed|fbox)\b")
# LaTeX wrappers a model puts around a boxed choice letter (\text{C}, \mathbf{C}, ...)
_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mathit|bf|rm)\s*")


def strip_thinking(text: str, *, inside: bool = False) -> str:
    """The answer part of a reply: the text after the last ``</think>``; "" when the reply is in
    reasoning that never closes (it has ``<think>`` and no ``</think>`` after it, or ``inside``:
    the prompt left ``<think>`` open); the whole text when it never reasons."""
    index = text.rfind(CLOSE)
    if index >= 0:
        return text[index + len(CLOSE):]
    if inside or OPEN in text:
        return ""
    return text


def last_boxed(text: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None when
    there is none or the last one is not a complete ``{...}`` (an earlier box does not stand in)."""
    text = strip_thinking(text)
    found = list(_BOX.finditer(text))
    if not found:
        return None
    index = found[-1].end()
    while index < len(text) and text[index] in " \t":
        index += 1
    if index >= len(text) or text[index] != "{":
        return None
    end = balancing_brace(text, index)
    return None if end is None else text[index + 1:end].strip()


def balancing_brace(text: str, start: int) -> Optional[int]:
    """The index of the ``}`` that balances the braces counted from ``start`` on (None when they
    never balance)."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return index
    return None


def boxed_choice(text: str, letters: str = "ABCD") -> Optional[str]:
    """A multiple-choice letter from the last ``\\boxed{}`` only (no ``<answer>`` tags, no prose):
    the box holds one of ``letters`` (either case), bare or wrapped (``\\text{C}``, ``(C)``,
    ``$C$``), optionally followed by the option's text after a non-letter (``C: 2.4``, ``C) ...``)."""
    content = last_boxed(text)
    if content is None:
        return None
    cleaned = _TEXT_WRAPPERS.sub("", content).replace("{", "").replace("}", "")
    cleaned = cleaned.strip().lstrip("($*").strip()
    if not cleaned or cleaned[0].upper() not in letters:
        return None
    if len(cleaned) > 1 and cleaned[1].isalnum():
        return None
    return cleaned[0].upper()

