"""The sandbox's tool operations, as the host sees them.

A tool environment in the sandbox answers, besides ``reset``/``step``:

* ``tools()``: its tool schemas (OpenAI function-calling format, fixed at reset) and progress;
* ``call_tool(name, arguments)``: one call with structured arguments -> ``output``, ``returncode``
  (0 success, 1 unknown tool / bad arguments / the tool raised) and progress after the call.
  After a success the environment's ``_advance_if_done()`` has run once (by the tool itself, as
  the released prompt asks, or else by ``execute_tool``/the sandbox), and ``output`` ends with its
  notice when the call completed the current instruction: ``[STEP n COMPLETE — NEW INSTRUCTION]
  <next instruction>``, or ``[ALL STEPS COMPLETE] Submit <answer>done</answer>.`` after the last
  (``spade.envs.sandbox.runtime.tool_base``). That notice is how the agent learns the next
  instruction; the progress fields (which instruction is current, how many the call completed,
  ``advanced``, the current instruction's text, all done or not) are bookkeeping for the host;
* ``criteria()``: each success criterion evaluated on the current state (admission's probes).

Every operation has the frame checks, wall-clock limit and error kinds of ``step``; a tool that
loops, allocates without bound, exits or returns the wrong shape ends in one classified fault.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, runtime_checkable

from ..protocol import EnvInstance
from ..sandbox.runtime import framing

MAX_TOOL_NAME_CHARS = 200  # the supervisor's limit on a call's name (supervisor.MAX_TOOL_NAME_CHARS)
# the arguments travel two levels down in a frame ({"op", ..., "arguments": ...}), and every hop
# refuses a frame nested deeper than framing.MAX_JSON_DEPTH: a margin of two more levels
MAX_ARGUMENT_DEPTH = framing.MAX_JSON_DEPTH - 4


def call_problem(name: Any, arguments: Any) -> Optional[str]:
    """Why the sandbox cannot be sent this call, or None. ``arguments`` must be a JSON object that a
    strict encoder takes (no NaN or Infinity, no sets, bytes or other non-JSON values, no integer
    beyond Python's int-to-text limit), nested at most ``MAX_ARGUMENT_DEPTH`` levels; ``name`` a
    string of at most ``MAX_TOOL_NAME_CHARS`` characters; neither may hold a lone surrogate
    (``"\\ud800"`` in JSON, ``'\\ud800'`` as a Python literal), which strict UTF-8 refuses. A model
    can write any of these (JSON's ``NaN``, a Python literal read by the XML form's fallback), so
    the host checks before sending: a frame the supervisor refuses would end every environment it
    serves, and a tool result echoing a lone surrogate would make the next prompt untokenizable."""
    if not isinstance(name, str) or len(name) > MAX_TOOL_NAME_CHARS:
        return f"the tool name must be a string of at most {MAX_TOOL_NAME_CHARS} characters"
    if not isinstance(arguments, dict):
        return f"the tool arguments must be a JSON object, got {type(arguments).__name__}"
    try:
        json.dumps(arguments, allow_nan=False)
    except (ValueError, TypeError, RecursionError) as exc:
        return f"the tool arguments are not strict JSON: {type(exc).__name__}: {str(exc)[:200]}"
    if _depth_over(arguments, MAX_ARGUMENT_DEPTH):
        return f"the tool arguments are nested deeper than {MAX_ARGUMENT_DEPTH} levels"
    try:  # JSON's "\ud800" decodes to a lone surrogate, which a tool may echo into the next prompt
        name.encode("utf-8")
        json.dumps(arguments, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"the tool call holds a lone surrogate ({exc.object[exc.start]!r}), which UTF-8 cannot encode "
                "(the tokenizer refuses such text)")
    return None


def _depth_over(value: Any, limit: int) -> bool:
    """Whether dicts and lists in ``value`` nest more than ``limit`` levels (no recursion)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


@dataclass(frozen=True)
class Progress:
    current: int  # index of the instruction being worked on (== total once all are done)
    total: int
    instruction: Optional[str]  # the text of instruction ``current``; None once all are done
    all_done: bool

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Progress":
        return cls(int(data["current"]), int(data["total"]), data.get("instruction"), bool(data["all_done"]))


@dataclass(frozen=True)
class ToolSchemas:
    tools: list[dict[str, Any]]
    progress: Progress


@dataclass(frozen=True)
class ToolResult:
    output: str
    returncode: int
    progress: Progress
    advanced: int = 0  # instructions completed by this call
    printed: str = ""  # what the environment printed, capped

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output, "returncode": self.returncode, "advanced": self.advanced,
                "current": self.progress.current, "total": self.progress.total,
                "instruction": self.progress.instruction, "all_done": self.progress.all_done}


@dataclass(frozen=True)
class CriterionValue:
    value: Optional[bool]  # None when the criterion raised
    error: Optional[str] = None


@dataclass(frozen=True)
class CriteriaResult:
    criteria: list[CriterionValue] = field(default_factory=list)
    progress: Optional[Progress] = None


@runtime_checkable
class ToolEnvInstance(EnvInstance, Protocol):
    """A live tool environment (``SandboxedEnv`` with ``tool_use`` true)."""

    tool_use: bool

    async def tools(self) -> ToolSchemas: ...

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult: ...

    async def criteria(self) -> CriteriaResult: ...
