"""Answer extraction from completions: ``<answer>`` tags, ``\\boxed{}``, choice letters, code.

Thinking models put reasoning in ``<think>...</think>``; everything up to the last ``</think>`` is
dropped before extraction, so an answer "tried" while thinking does not count.
"""

from __future__ import annotations

import re
from typing import Optional

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_CHOICE_LINE = re.compile(r"(?:answer|option|choice)\s*(?:is)?\s*[:=]?\s*\(?\**\s*([A-Z])\b\)?", re.IGNORECASE)


def strip_thinking(text: str) -> str:
    """The text after the last ``</think>`` (the whole text when there is none)."""
    index = text.rfind("</think>")
    return text[index + len("</think>"):] if index >= 0 else text


def answer_tag(text: str) -> Optional[str]:
    """Strict ``<answer>`` extraction: the content of the last complete ``<answer>...</answer>``
    pair, stripped; None when there is no complete pair (an unclosed tag does not count)."""
    found = _ANSWER.findall(strip_thinking(text))
    return found[-1].strip() if found else None


def last_boxed(text: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if none
    or unbalanced."""
    text = strip_thinking(text)
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth, index = 1, start
        while index < len(text):
            char = text[index]
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    return text[start:index].strip()
            index += 1
    return None


def choice_letter(text: str, letters: str = "ABCD") -> Optional[str]:
    """A multiple-choice answer: ``<answer>`` tags, then ``\\boxed{}``, then the last
    "Answer: X" phrase; the letter must be one of ``letters``."""
    for candidate in (answer_tag(text), last_boxed(text)):
        if candidate is not None:
            cleaned = re.sub(r"\\text\{([^}]*)\}", r"\1", candidate).strip().strip("().*$ ")
            if len(cleaned) >= 1 and cleaned[0].upper() in letters and (len(cleaned) == 1 or not cleaned[1].isalpha()):
                return cleaned[0].upper()
    matches = [m.group(1).upper() for m in _CHOICE_LINE.finditer(strip_thinking(text))]
    matches = [m for m in matches if m in letters]
    return matches[-1] if matches else None


def code_block(text: str, languages: tuple[str, ...] = ("python", "py", "python3", "")) -> Optional[str]:
    """The last fenced code block in one of ``languages`` ("" matches an unlabelled fence)."""
    blocks = [body for lang, body in _FENCE.findall(strip_thinking(text)) if lang.lower() in languages]
    return blocks[-1] if blocks else None
