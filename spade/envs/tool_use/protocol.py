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

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, runtime_checkable

from ..protocol import EnvInstance


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
