"""What one agent reply means in a tool-use episode (SPEC 4, "Tool use").

A reply is read after its reasoning is set aside (``spade.agent.reasoning.split``, SGLang's
``qwen3`` reasoning rules: a reply that opens ``<think>``, or whose prompt left one open, is
reasoning up to ``</think>``, and all of it when ``</think>`` never comes), so a tool call or an
answer inside the reasoning is not one. What is left is, in this order (the released
``ToolUseBaseEnv.step`` looks for ``<answer>`` before ``<tool_call>``):

* a final answer ``<answer>...</answer>`` (the first one; the protocol's ``<answer>done</answer>``
  after all instructions), even when the reply also holds calls;
* tool calls (``<tool_call>`` blocks in the model's native syntax, several per turn): every call
  that parses runs, and a malformed block beside them is only reported in ``errors`` (the
  released orchestrator runs the calls SGLang's parser returns and skips the rest);
* a format error when there is neither (no block parses, or there is no block and no answer),
  which the environment answers with the format-error observation (-0.1, not terminal).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ...agent.tool_calls import ToolCall, ToolCallError
from ...agent.reasoning import split

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class ToolTurn:
    kind: str  # "calls", "answer" or "format_error"
    calls: tuple[ToolCall, ...] = ()
    answer: Optional[str] = None
    errors: tuple[ToolCallError, ...] = ()  # blocks that gave no call (beside the calls, or alone)

    @property
    def malformed(self) -> bool:
        return self.kind == "format_error"


def read_tool_turn(response: str, parser: Any, tools: Optional[Sequence[Mapping[str, Any]]] = None, *,
                   inside_reasoning: bool = False) -> ToolTurn:
    """Read one reply (module docstring). ``inside_reasoning``: the prompt left ``<think>`` open,
    so the reply starts inside the reasoning (``spade.agent.reasoning.prompt_opens_reasoning``)."""
    body = split(response, inside=inside_reasoning).answer
    answer = _ANSWER.search(body)
    if answer:
        return ToolTurn("answer", answer=answer.group(1).strip())
    parsed = parser.parse(body, tools)
    if parsed.calls:
        return ToolTurn("calls", calls=parsed.calls, errors=parsed.errors)
    return ToolTurn("format_error", errors=parsed.errors)
