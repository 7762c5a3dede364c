"""``ToolUseBaseEnv``: the base class of tool-use environments (SPEC sections 4 and 5).

The sandbox puts this class into every generated module's namespace, so a generated tool
environment subclasses it without importing anything. It is also importable on the host
(``spade.envs.tool_use``) for hand-written environments and tests; it uses the standard library
only, and runs inside the hardened child like any generated code.

What a subclass provides in ``reset(seed=None)``: ``_state`` (a dict: the simulated backend),
``_tools`` (tool name -> ``{"description": str, "parameters": JSON Schema object}``), the
instructions ``_user_messages`` (3-5, given to the agent one at a time), ``_message_criteria`` (one
``state -> bool`` per instruction), ``_current_msg = 0`` and optionally ``_expected_answer``; it
returns the first instruction (``(text, info)`` or just ``text``). Each tool is a method
``tool_<name>(**arguments) -> str``.

What the base provides: ``get_tools()`` (the OpenAI function-calling list, in ``_tools`` order),
``execute_tool(name, arguments)`` (``{"output", "returncode"}``: 1 with the message for an unknown
tool, bad arguments or a raising tool; every success goes to ``_call_history``), the instruction
bookkeeping ``_advance_if_done()`` / ``all_instructions_done()``, a default ``_check_answer``, and
``step(action)`` for the plain-text protocol (``<answer>..</answer>`` or one
``<tool_call>`` + new line + ``{"name", "arguments"}`` + new line + ``</tool_call>``; anything else is a format error, -0.1).
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
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class ToolUseBaseEnv:
    """Simulated tools over a dict backend, and instructions checked by predicates on it."""

    def __init__(self, max_turns: int = 10, **kwargs: Any):
        self.max_turns = max_turns
        self.turn_count = 0
        self._tools: dict[str, dict[str, Any]] = {}
        self._state: dict[str, Any] = {}
        self._call_history: list[dict[str, Any]] = []
        self._expected_answer: Any = None
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
        """Run ``tool_<name>(**arguments)``: ``{"output": str, "returncode": 0 or 1}``."""
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return {"output": f"Error: arguments of {name!r} must be a JSON object", "returncode": 1}
        method = getattr(self, f"tool_{name}", None) if isinstance(name, str) else None
        if name not in self._tools or not callable(method):
            known = ", ".join(self._tools) or "none"
            return {"output": f"Error: unknown tool {name!r} (available: {known})", "returncode": 1}
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
        return {"output": output, "returncode": 0}

    # -- instructions --------------------------------------------------------------------------

    def _criterion_met(self, index: int) -> bool:
        try:
            return bool(self._message_criteria[index](self._state))
        except Exception:  # noqa: BLE001 - a raising criterion is simply not met
            return False

    def _advance_if_done(self) -> str | None:
        """Move past every instruction whose criterion now holds; the next instruction or None."""
        advanced = False
        while self._current_msg < len(self._message_criteria) and self._criterion_met(self._current_msg):
            self._current_msg += 1
            advanced = True
        if advanced and self._current_msg < len(self._user_messages):
            return self._user_messages[self._current_msg]
        return None

    def all_instructions_done(self) -> bool:
        return bool(self._user_messages) and self._current_msg >= len(self._user_messages)

    def _check_answer(self, answer: str) -> bool:
        """Accepted when every instruction is done (and the answer matches ``_expected_answer``
        when one is set)."""
        if not self.all_instructions_done():
            return False
        expected = self._expected_answer
        if expected is None or expected == "":
            return True
        return _normalise(answer) == _normalise(str(expected))

    # -- the plain-text protocol ---------------------------------------------------------------

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        answer = _ANSWER.search(action)
        if answer is not None:
            if self._check_answer(answer.group(1).strip()):
                return "Correct!", 1.0, True, False, {}
            left = max(0, len(self._user_messages) - self._current_msg)
            return (f"Not accepted: {left} request(s) are not complete yet.", 0.0, False, truncated, {})
        call = _TOOL_CALL.search(action)
        if call is None:
            return FORMAT_ERROR_MESSAGE, FORMAT_ERROR_REWARD, False, truncated, {}
        try:
            payload = json.loads(call.group(1))
        except ValueError:
            return FORMAT_ERROR_MESSAGE, FORMAT_ERROR_REWARD, False, truncated, {}
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return FORMAT_ERROR_MESSAGE, FORMAT_ERROR_REWARD, False, truncated, {}
        result = self.execute_tool(payload["name"], payload.get("arguments", {}))
        observation = "Tool result:\n" + result["output"]
        before = self._current_msg
        self._advance_if_done()  # a subclass's own version may return nothing: read the index
        if self._current_msg != before and self._current_msg < len(self._user_messages):
            observation += "\n\nNext request: " + self._user_messages[self._current_msg]
        return observation, 0.0, False, truncated, {}


def _normalise(text: str) -> str:
    return " ".join(text.strip().lower().split())
