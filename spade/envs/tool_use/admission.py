"""The tool-use admission stages (SPEC 3.6 and 5), run after the games stages.

1. ``tool_schema``: every tool's ``parameters`` is a JSON Schema object (``type: object``, a
   ``properties`` map of schemas with known types, ``required`` naming properties, enums non-empty
   lists); names are unique; SPEC 5's structure holds: 3-8 tools, at least one enum and at least
   one required parameter (distractor tools are allowed, nothing checks they go unused).
2. ``reset_gate``: reject when some criterion raises on the freshly reset state under every one of
   seeds 0, 1, 2 (one seed raising is a quirk of that draw; all three is a broken criterion).
3. ``degenerate_probe`` (spade's addition, issue 23; on with the games probes, off with
   ``selfplay.admission.probes: false`` or ``admission.paper_exact``): answering done without a tool
   call, or calling one tool over and over, must not complete the instructions
   (:mod:`.degenerate_probes`); a policy that does is named in the ``degenerate_win`` rejection.
4. ``tool_probes`` (beyond the paper; reported in every verdict, a rejection only when switched on):
   criteria already true at reset; criteria that no probe call changes (each tool called once on a
   fresh reset with arguments built from its schema: the first enum value, else a placeholder of
   the declared type); instructions whose criterion holds after every probe call (met by any
   first call). The probes are a coarse screen: a placeholder argument rarely names a real record,
   so "unchangeable" over-reports; that is why the default keeps the paper's behaviour.
5. ``model_screen``: an injected callable (the policy through the engine) judges whether every
   criterion can be met with the tools; ``None`` (no verdict: timeout, unparsable reply, no
   engine) counts as accept, ``False`` rejects.

``solution()`` is not checked: the released validation never calls it (``validate_game`` resets
and steps, the LLM validator reads the source), though the designer prompt asks for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from ..degenerate_probes import ProbeReport, ProbeSettings
from ..protocol import EnvError, ErrorKind, Stage
from .degenerate_probes import run_tool_probes, win_message

GATE_SEEDS = (0, 1, 2)
MIN_TOOLS, MAX_TOOLS = 3, 8
JSON_TYPES = frozenset({"string", "integer", "number", "boolean", "array", "object", "null"})

# (source, tools in OpenAI format) -> True (every criterion reachable), False, or None (no verdict)
ModelScreen = Callable[[str, list[dict[str, Any]]], Awaitable[Optional[bool]]]


@dataclass(frozen=True)
class ToolAdmissionSettings:
    """Switches of the tool-use stages; the defaults are the paper's behaviour."""

    min_tools: int = MIN_TOOLS
    max_tools: int = MAX_TOOLS
    reject_true_at_reset: bool = False   # the paper admits its own example with one such criterion
    reject_unchangeable: bool = False
    reject_trivial: bool = False
    model_screen: bool = True            # ask the policy (when an engine is there to ask)
    probe_seed: int = 42
    # Stage 1 (tool_schema) and the reset gate's instructions-versus-criteria count: spade's checks.
    # The released validation has neither (it loads, resets and steps the class, then the reset gate
    # and the model screen, core/orchestrator.py:1137-1176); false, or selfplay.admission.paper_exact,
    # leaves them out.
    schema_gate: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.schema_gate, bool):
            raise ValueError(f"tool admission: schema_gate must be true or false, got {self.schema_gate!r}")
        if not (1 <= self.min_tools <= self.max_tools):
            raise ValueError(f"tool admission: need 1 <= min_tools <= max_tools, got {self.min_tools}, "
                             f"{self.max_tools}")


@dataclass
class ToolReport:
    """What the tool stages found (JSON in the verdict; counted in ``env/tool_*`` metrics)."""

    tools: int = 0
    instructions: int = 0
    true_at_reset: list[int] = field(default_factory=list)
    unchangeable: list[int] = field(default_factory=list)
    trivial: list[int] = field(default_factory=list)
    gate_errors: dict[int, int] = field(default_factory=dict)  # criterion -> seeds on which it raised
    screen: Optional[bool] = None  # the model screen's verdict (None: no verdict or not asked)
    probes: Optional[ProbeReport] = None  # the degenerate-policy probes' scores (None: probes off)

    def to_json(self) -> dict[str, Any]:
        return {"tools": self.tools, "instructions": self.instructions, "true_at_reset": self.true_at_reset,
                "unchangeable": self.unchangeable, "trivial": self.trivial,
                "gate_errors": {str(k): v for k, v in self.gate_errors.items()}, "screen": self.screen,
                "probe_report": None if self.probes is None else self.probes.to_json()}


class ToolRejection(Exception):
    def __init__(self, error: EnvError):
        super().__init__(error.message)
        self.error = error


def schema_problems(tools: list[dict[str, Any]], settings: ToolAdmissionSettings) -> list[str]:
    """Everything wrong with the tool schemas (empty when they pass)."""
    problems: list[str] = []
    names = [t.get("function", {}).get("name") for t in tools]
    if len(set(names)) != len(names):
        problems.append("tool names are not unique")
    if not settings.min_tools <= len(tools) <= settings.max_tools:
        problems.append(f"{len(tools)} tools; an environment offers {settings.min_tools}-{settings.max_tools}")
    has_enum = has_required = False
    for tool in tools:
        function = tool.get("function", {})
        name = function.get("name")
        if not isinstance(function.get("description"), str) or not function["description"].strip():
            problems.append(f"tool {name!r} has no description")
        parameters = function.get("parameters")
        if not isinstance(parameters, dict) or parameters.get("type") != "object":
            problems.append(f"tool {name!r}: parameters must be a JSON Schema object ({{\"type\": \"object\"}})")
            continue
        properties = parameters.get("properties", {})
        if not isinstance(properties, dict):
            problems.append(f"tool {name!r}: properties must be an object")
            continue
        for key, spec in properties.items():
            problems += [f"tool {name!r}, parameter {key!r}: {p}" for p in _property_problems(spec)]
            if isinstance(spec, dict) and isinstance(spec.get("enum"), list) and spec["enum"]:
                has_enum = True
        required = parameters.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) and r in properties for r in required):
            problems.append(f"tool {name!r}: required must list declared properties")
        elif required:
            has_required = True
    if not has_enum:
        problems.append("no parameter has an enum")
    if not has_required:
        problems.append("no tool has a required parameter")
    return problems


def _property_problems(spec: Any) -> list[str]:
    if not isinstance(spec, dict):
        return ["its schema must be an object"]
    problems = []
    kind = spec.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if kind is None and "enum" not in spec and "anyOf" not in spec and "oneOf" not in spec:
        problems.append("no type")
    elif kind is not None and not all(k in JSON_TYPES for k in kinds):
        problems.append(f"unknown type {kind!r}")
    if "enum" in spec and (not isinstance(spec["enum"], list) or not spec["enum"]):
        problems.append("enum must be a non-empty list")
    return problems


def probe_arguments(tool: dict[str, Any]) -> dict[str, Any]:
    """Arguments for one probe call: every declared parameter, its first enum value or a
    placeholder of its type."""
    parameters = tool.get("function", {}).get("parameters", {})
    properties = parameters.get("properties", {}) if isinstance(parameters, dict) else {}
    arguments: dict[str, Any] = {}
    for key, spec in properties.items():
        spec = spec if isinstance(spec, dict) else {}
        if isinstance(spec.get("enum"), list) and spec["enum"]:
            arguments[key] = spec["enum"][0]
            continue
        kind = spec.get("type")
        kind = kind[0] if isinstance(kind, list) and kind else kind
        arguments[key] = {"integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {},
                          "null": None}.get(kind, "probe")
    return arguments


async def tool_stages(env: Any, source: str, settings: ToolAdmissionSettings, timings: dict[str, float],
                      screen: ModelScreen | None = None, clock: Any = None, probes: ProbeSettings | None = None,
                      max_turns: int | None = None) -> ToolReport:
    """Run stages 1-5 on an open tool environment; raises :class:`ToolRejection` with the stage.
    ``probes`` None leaves out the degenerate-policy probes; ``max_turns`` is the run's turn budget.

    ``env`` is a ``ToolEnvInstance``; sandbox faults propagate as ``EnvFault`` (the caller labels
    them with the stage it is in, read from ``timings``' last key) or ``InfrastructureFault``.
    """
    report = ToolReport()
    with clock(Stage.TOOL_SCHEMA):
        await env.reset(seed=settings.probe_seed)
        schemas = await env.tools()
        report.tools, report.instructions = len(schemas.tools), schemas.progress.total
        problems = schema_problems(schemas.tools, settings) if settings.schema_gate else []
        if settings.schema_gate and schemas.progress.total < 1:
            problems.append("no user instructions (_user_messages is empty)")
        if problems:
            raise ToolRejection(EnvError(ErrorKind.BAD_TOOL_SCHEMA, Stage.TOOL_SCHEMA, "; ".join(problems)[:2000]))
    with clock(Stage.RESET_GATE):
        n_criteria = None
        for seed in GATE_SEEDS:
            await env.reset(seed=seed)
            values = (await env.criteria()).criteria
            if n_criteria is None:
                n_criteria = len(values)
            for index, value in enumerate(values):
                if value.error is not None:
                    report.gate_errors[index] = report.gate_errors.get(index, 0) + 1
        if settings.schema_gate and n_criteria != report.instructions:
            raise ToolRejection(EnvError(ErrorKind.CRITERION_ERROR, Stage.RESET_GATE,
                                         f"{report.instructions} instructions but {n_criteria} criteria"))
        broken = [i for i, count in report.gate_errors.items() if count == len(GATE_SEEDS)]
        if broken:
            raise ToolRejection(EnvError(ErrorKind.CRITERION_ERROR, Stage.RESET_GATE,
                                         f"criteria {broken} raise on the freshly reset state under every "
                                         f"seed of {list(GATE_SEEDS)}"))
    if probes is not None:
        with clock(Stage.DEGENERATE_PROBE):
            report.probes = await run_tool_probes(env, schemas.tools, report.instructions, probes,
                                                  max_turns=max_turns)
        if report.probes.winner is not None:
            raise ToolRejection(EnvError(ErrorKind.DEGENERATE_WIN, Stage.DEGENERATE_PROBE, win_message(report.probes)))
    with clock(Stage.TOOL_PROBES):
        await env.reset(seed=settings.probe_seed)
        at_reset = [c.value for c in (await env.criteria()).criteria]
        report.true_at_reset = [i for i, v in enumerate(at_reset) if v is True]
        changed: set[int] = set()
        always_true = set(range(len(at_reset)))
        for tool in schemas.tools:
            await env.reset(seed=settings.probe_seed)
            await env.call_tool(tool["function"]["name"], probe_arguments(tool))
            after = [c.value for c in (await env.criteria()).criteria]
            changed |= {i for i, (a, b) in enumerate(zip(at_reset, after)) if a != b}
            always_true &= {i for i, v in enumerate(after) if v is True}
        report.unchangeable = [i for i in range(len(at_reset)) if i not in changed and i not in report.true_at_reset]
        report.trivial = sorted(always_true)
        for flag, found, kind, what in (
                (settings.reject_true_at_reset, report.true_at_reset, ErrorKind.CRITERION_TRUE_AT_RESET,
                 "already true at reset"),
                (settings.reject_unchangeable, report.unchangeable, ErrorKind.CRITERION_UNCHANGEABLE,
                 "not changed by any probe call"),
                (settings.reject_trivial, report.trivial, ErrorKind.TRIVIAL_INSTRUCTION,
                 "met by any first call")):
            if flag and found:
                raise ToolRejection(EnvError(kind, Stage.TOOL_PROBES, f"criteria {found} are {what}"))
    if screen is not None and settings.model_screen:
        with clock(Stage.MODEL_SCREEN):
            report.screen = await screen(source, schemas.tools)
            if report.screen is False:
                raise ToolRejection(EnvError(ErrorKind.SCREEN_REJECTED, Stage.MODEL_SCREEN,
                                             "the model screen judged that some instruction's criterion cannot "
                                             "be met with the tools offered"))
    return report
