"""What one agent reply means in a tool-use episode (SPEC 4, "Tool use").

A reply is read after its reasoning is set aside (``spade.agent.reasoning.split``, SGLang's
``qwen3`` reasoning rules: a reply with a ``<think>`` in it, or whose prompt left one open, is
reasoning up to ``</think>``, and all of it when ``</think>`` never comes), so a tool call or an
answer inside the reasoning is not one. What is left is, in this order (the released
``ToolUseBaseEnv.step`` looks for ``<answer>`` before ``<tool_call>``):

* a final answer ``<answer>...</answer>`` (the first one; the protocol's ``<answer>done</answer>``
  after all instructions), even when the reply also holds calls;
* tool calls (``<tool_call>`` blocks in the model's native syntax, several per turn): every call
  that parses runs, and a malformed block beside them is only reported in ``errors`` (the
  released orchestrator runs the calls its parser returns and skips the rest);
* a format error when there is neither (no block parses, or there is no block and no answer),
  which the environment answers with the format-error observation (-0.1, not terminal).

A call the sandbox cannot be sent (``spade.envs.tool_use.protocol.call_problem``: arguments that
are not a JSON object a strict encoder takes, such as JSON's ``NaN``/``Infinity``, a lone surrogate
decoded from ``"\\ud800"`` or a set read by the XML form's Python-literal fallback, nesting too deep,
a name too long) counts as a malformed block: it is reported in ``errors`` and does not run.
Reading never raises on a reply: anything that goes wrong while reading it (a parser that raises)
makes the turn a format error.

A JSON call whose name is not one of the episode's tools (``unknown_tool_names``):

* ``"execute"`` (the default, the released training loop): it is a call like any other; the
  environment answers it with its unknown-tool error as the tool result, and the turn's reward is
  0, not a format error. The released parser does not check names
  (``spare/core/utils/tool_call_parser.py``) and ``ToolUseBaseEnv.execute_tool`` answers
  ``Unknown tool '<name>'`` (``spare/core/envs/tool_use_base_env.py``).
* ``"drop"``: SGLang's ``qwen25`` detector, which ``spade serve`` and the BFCL harness follow: the
  call is dropped (reported in ``errors``), so a turn whose only call names an unknown tool is a
  format error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ...agent.tool_calls import ToolCall, ToolCallError
from ...agent.reasoning import split
from .protocol import call_problem

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

UNKNOWN_TOOL_NAMES = ("execute", "drop")  # the values of ``unknown_tool_names``, default first


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
                   inside_reasoning: bool = False,
                   unknown_tool_names: str = UNKNOWN_TOOL_NAMES[0]) -> ToolTurn:
    """Read one reply (module docstring). ``inside_reasoning``: the prompt left ``<think>`` open,
    so the reply starts inside the reasoning (``spade.agent.reasoning.prompt_opens_reasoning``).
    ``unknown_tool_names``: ``"execute"`` or ``"drop"`` (module docstring)."""
    if unknown_tool_names not in UNKNOWN_TOOL_NAMES:
        raise ValueError(f"unknown_tool_names: {unknown_tool_names!r} is not allowed; choose one of: "
                         f"{', '.join(UNKNOWN_TOOL_NAMES)}")
    try:
        body = split(response, inside=inside_reasoning).answer
        answer = _ANSWER.search(body)
        if answer:
            return ToolTurn("answer", answer=answer.group(1).strip())
        parsed = parser.parse(body, tools, drop_unknown_names=unknown_tool_names == "drop")
        calls, errors = [], list(parsed.errors)
        for call in parsed.calls:
            problem = call_problem(call.name, call.arguments)
            if problem is None:
                calls.append(call)
            else:
                errors.append(ToolCallError(problem, str(call.name)[:200]))
    except Exception as exc:  # noqa: BLE001 - a reply must never end a play (module docstring)
        return ToolTurn("format_error", errors=(ToolCallError(
            f"the reply could not be read: {type(exc).__name__}: {str(exc)[:200]}", ""),))
    if calls:
        return ToolTurn("calls", calls=tuple(calls), errors=tuple(errors))
    return ToolTurn("format_error", errors=tuple(errors))
