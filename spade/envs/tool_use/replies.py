"""What one agent reply means in a tool-use episode (SPEC 4, "Tool use").

A reply is one of: tool calls (``<tool_call>`` blocks in the model's native syntax, several per
turn); a final answer ``<answer>...</answer>`` (the protocol's ``<answer>done</answer>`` after all
instructions); or a format error (no call and no answer, or a malformed call block), which the
environment answers with the format-error observation (-0.1, not terminal). A leading
``<think>...</think>`` block is ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from .actions import _strip_reasoning
from .tool_calls import ToolCall, ToolCallError

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class ToolTurn:
    kind: str  # "calls", "answer" or "format_error"
    calls: tuple[ToolCall, ...] = ()
    answer: Optional[str] = None
    errors: tuple[ToolCallError, ...] = ()

    @property
    def malformed(self) -> bool:
        return self.kind == "format_error"


def read_tool_turn(response: str, parser: Any, tools: Optional[Sequence[Mapping[str, Any]]] = None) -> ToolTurn:
    body = _strip_reasoning(response)
    parsed = parser.parse(body, tools)
    if parsed.errors:
        return ToolTurn("format_error", errors=parsed.errors)
    if parsed.calls:
        return ToolTurn("calls", calls=parsed.calls)
    answers = _ANSWER.findall(body)
    if answers:
        return ToolTurn("answer", answer=answers[-1].strip())
    return ToolTurn("format_error")
