"""``ToolUseBaseEnv``: the base class of tool-use environments (SPEC sections 4 and 5).

The sandbox puts this class into every generated module's namespace, so a generated tool
environment subclasses it without importing anything. It is also importable on the host
(``spade.envs.tool_use``) for hand-written environments and tests; it uses the standard library
only, and runs inside the hardened child like any generated code.

What a subclass provides: ``reset(seed=None)`` filling ``_state`` (a dict: the simulated backend),
``_tools`` (tool name -> ``{"description": str, "parameters": JSON Schema object}``), the
instructions ``_user_messages`` (3-5, given to the agent one at a time), ``_message_criteria`` (one
``state -> bool`` per instruction), ``_current_msg = 0`` and ``_expected_answer = "done"``, and
returning the first instruction (``(text, info)`` or just ``text``); one method
``tool_<name>(**arguments) -> str`` per tool; ``solution()`` (the correct tool-call sequence and
final answer, as text).

The multi-turn protocol (the paper's App. C; the released ``spare/core/prompts/tool_use_template.py``):
the next instruction arrives inside a tool result. After a successful tool call whose effect meets
the current instruction's criterion, ``_advance_if_done()`` moves to the next instruction and
returns the notice that ends that tool's result: ``[STEP n COMPLETE — NEW INSTRUCTION] <next>``, or
after the last one ``[ALL STEPS COMPLETE] Submit <answer>done</answer>.`` (``""`` when nothing
advanced). The released prompt has every tool method end with ``return text +
self._advance_if_done()``; here ``execute_tool`` also appends it after a tool that did not advance
itself, so a tool written either way shows the notice exactly once. The episode ends with
``<answer>done</answer>`` once every instruction is complete (``_check_answer``).

What the base provides: ``get_tools()`` (the OpenAI function-calling list, in ``_tools`` order),
``execute_tool(name, arguments)`` (``{"output", "returncode"}``: 1 with the message for an unknown
tool, bad arguments or a raising tool; every success goes to ``_call_history`` and gets the
progress notice), ``_advance_if_done()``, ``all_instructions_done()``, ``_check_answer``,
``_incorrect_answer_feedback()``, ``solution()`` (raises until a subclass writes it), ``close()``,
and ``step(action)`` for agent text (module ``step`` notes below).
"""

from __future__ import annotations

import json
import re
from typing import Any

FORMAT_ERROR_REWARD = -0.1
FORMAT_ERROR_MESSAGE = (
    "Format error: call a tool as <tool_call>, a new line, {\"name\": \"TOOL\", \"arguments\": {...}}, "
    "a new line and </tool_call>; "
    "or, once every request is complete, reply <answer>done</answer>."
)
# the released notices (tool_use_template.py, _advance_if_done), each after a blank line
STEP_COMPLETE_NOTICE = "\n\n[STEP {step} COMPLETE — NEW INSTRUCTION] {instruction}"
ALL_STEPS_COMPLETE_NOTICE = "\n\n[ALL STEPS COMPLETE] Submit <answer>done</answer>."
DONE = "done"

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"


class ToolUseBaseEnv:
    """Simulated tools over a dict backend, and instructions checked by predicates on it."""

    def __init__(self, max_turns: int = 10, **kwargs: Any):
        self.max_turns = max_turns
        self.turn_count = 0
        self._tools: dict[str, dict[str, Any]] = {}
        self._state: dict[str, Any] = {}
        self._call_history: list[dict[str, Any]] = []
        self._expected_answer: Any = DONE
        self._user_messages: list[str] = []
        self._message_criteria: list[Any] = []
        self._current_msg = 0
        self.reset()

    # -- what a subclass overrides -------------------------------------------------------------

    def reset(self, seed: int | None = None) -> Any:
        self.turn_count = 0
        self._call_history = []
        self._current_msg = 0
        first = self._user_messages[0] if self._user_messages else ""
        return first, {}

    def solution(self) -> str:
        """The correct tool-call sequence and final answer, as text (the subclass writes it)."""
        raise NotImplementedError("a tool environment must implement solution()")

    def close(self) -> None:
        """Release what the environment holds (nothing, in the base)."""

    # -- tools ---------------------------------------------------------------------------------

    def get_tools(self) -> list[dict[str, Any]]:
        """The tools in OpenAI function-calling format, in the order of ``_tools``."""
        tools = []
        for name, spec in self._tools.items():
            spec = spec if isinstance(spec, dict) else {}
            tools.append({"type": "function", "function": {
                "name": name,
                "description": spec.get("description", ""),
                "parameters": spec.get("parameters", {"type": "object", "properties": {}}),
            }})
        return tools

    def execute_tool(self, name: str, arguments: Any = None) -> dict[str, Any]:
        """Run ``tool_<name>(**arguments)``: ``{"output": str, "returncode": 0 or 1}``; a success
        ends with the progress notice when the call completed the current instruction."""
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return {"output": f"Error: arguments of {name!r} must be a JSON object", "returncode": 1}
        method = getattr(self, f"tool_{name}", None) if isinstance(name, str) else None
        if name not in self._tools or not callable(method):
            known = ", ".join(self._tools) or "none"
            return {"output": f"Error: unknown tool {name!r} (available: {known})", "returncode": 1}
        before = self._current_msg
        try:
            output = method(**arguments)
        except MemoryError:
            raise  # the sandbox's memory limit, not a tool error
        except TypeError as exc:
            return {"output": f"Error: bad arguments for {name!r}: {exc}", "returncode": 1}
        except Exception as exc:  # noqa: BLE001 - a failing tool is an observation, not a crash
            return {"output": f"Error: {type(exc).__name__}: {exc}", "returncode": 1}
        if not isinstance(output, str):
            output = json.dumps(output, default=str) if isinstance(output, (dict, list)) else str(output)
        self._call_history.append({"name": name, "arguments": dict(arguments)})
        if self._current_msg == before:  # the tool did not run _advance_if_done itself
            output += self.progress_notice()
        return {"output": output, "returncode": 0}

    def progress_notice(self) -> str:
        """``_advance_if_done()``'s notice, or "" for anything else it returns (an override from
        an older contract may return nothing)."""
        notice = self._advance_if_done()
        return notice if isinstance(notice, str) else ""

    # -- instructions --------------------------------------------------------------------------

    def _criterion_met(self, index: int) -> bool:
        try:
            return bool(self._message_criteria[index](self._state))
        except Exception:  # noqa: BLE001 - a raising criterion is simply not met
            return False

    def _advance_if_done(self) -> str:
        """Past the current instruction when its criterion holds (one per call, as released):
        the notice that ends the tool result, or "" when nothing advanced."""
        if self._current_msg >= len(self._user_messages) or self._current_msg >= len(self._message_criteria):
            return ""
        if not self._criterion_met(self._current_msg):
            return ""
        self._current_msg += 1
        if self._current_msg >= len(self._user_messages):
            return ALL_STEPS_COMPLETE_NOTICE
        return STEP_COMPLETE_NOTICE.format(step=self._current_msg, instruction=self._user_messages[self._current_msg])

    def all_instructions_done(self) -> bool:
        return bool(self._user_messages) and self._current_msg >= len(self._user_messages)

    def _check_answer(self, answer: str) -> bool:
        """Accepted only when every instruction is complete and the answer is ``done`` (case and
        surrounding space ignored), as the released multi-turn contract's ``_check_answer``."""
        return self.all_instructions_done() and _normalise(answer) == DONE

    def _incorrect_answer_feedback(self) -> str:
        """What a rejected answer gets back: the step still open, by number and text."""
        total, current = len(self._user_messages), self._current_msg
        if isinstance(current, int) and 0 <= current < total:
            return (f"Not accepted: step {current + 1} of {total} is still open: \"{self._user_messages[current]}\" "
                    "Carry it out with the tools, then reply <answer>done</answer>.")
        return "Not accepted: every step is complete, so the answer to submit is <answer>done</answer>."

    # -- agent text ----------------------------------------------------------------------------

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One agent reply as text, read by the rules of the host's native path
        (``spade.envs.tool_use.replies``) as far as they fit the standard library: reasoning
        (a reply opening ``<think>``, up to ``</think>``) is set aside; the first
        ``<answer>..</answer>`` is checked first; else every tool call in SGLang's ``qwen25``
        JSON layout (``<tool_call>``, a new line, an object or an array of objects with a
        ``name``, a new line, ``</tool_call>``) runs, and the results come back together (a name
        outside the tools runs too and gets the unknown-tool error, as in the released step and
        the native path's default ``unknown_tool_names="execute"``); no call at all is a format
        error (-0.1, not terminal)."""
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        body = _answer_part(action if isinstance(action, str) else str(action))
        answer = _ANSWER.search(body)
        if answer is not None:
            if self._check_answer(answer.group(1).strip()):
                return "Correct!", 1.0, True, False, {}
            return self._incorrect_answer_feedback(), 0.0, False, truncated, {}
        calls = _json_calls(body)
        if not calls:
            return FORMAT_ERROR_MESSAGE, FORMAT_ERROR_REWARD, False, truncated, {}
        results = [self.execute_tool(name, arguments)["output"] for name, arguments in calls]
        observation = "\n\n".join("Tool result:\n" + output for output in results)
        return observation, 0.0, False, truncated, {}


def _normalise(text: str) -> str:
    return " ".join(str(text).strip().lower().split())


def _answer_part(text: str) -> str:
    """The reply without its reasoning (``spade.agent.reasoning.split`` for a reply that is not
    inside reasoning from the start, as SGLang's ``qwen3`` parser reads it): a reply holding
    ``<think>`` anywhere is reasoning up to the first ``</think>``, all of it when none follows."""
    if _THINK_OPEN not in text:
        return text
    _, closed, answer = text.partition(_THINK_CLOSE)
    return answer if closed else ""


def _json_calls(text: str) -> list[tuple[str, Any]]:
    """The JSON calls by SGLang's ``qwen25`` block rules (``spade.agent.tool_calls``): blocks
    opened by ``<tool_call>`` and a new line, closed by the first new line followed by
    ``</tool_call>``; an item without a non-empty ``name`` string gives no call (names are not
    checked against the tools); arguments are ``parameters`` when truthy, else ``arguments``,
    else ``{}``."""
    calls: list[tuple[str, Any]] = []
    position = 0
    while True:
        start = text.find(_CALL_OPEN, position)
        if start < 0:
            return calls
        if not text.startswith(_CALL_OPEN + "\n", start):
            end = text.find(_CALL_CLOSE, start + len(_CALL_OPEN))
            if end < 0:
                return calls
            position = end + len(_CALL_CLOSE)
            continue
        body_start = start + len(_CALL_OPEN) + 1
        end = text.find("\n" + _CALL_CLOSE, body_start)
        if end < 0:
            return calls
        position = end + 1 + len(_CALL_CLOSE)
        try:
            value = json.loads(text[body_start:end].strip())
        except ValueError:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and isinstance(item.get("name"), str) and item["name"]:
                calls.append((item["name"], item.get("parameters") or item.get("arguments", {})))
