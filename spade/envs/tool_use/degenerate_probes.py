"""Degenerate-policy probes for tool environments: admission's ``degenerate_probe`` stage for the
tool-use domain (spade's addition, issue 23; the games probes are :mod:`spade.envs.degenerate_probes`).

Policies that do nothing useful play the environment through the same sandboxed calls a tool
episode uses (``reset``, ``call_tool``, ``step`` with the final answer):

* ``answer_done``: replies ``<answer>done</answer>`` every turn, without a single tool call;
* ``repeat_<tool>``, one per tool in schema order: calls that tool every turn with one fixed set of
  arguments (:func:`observed_arguments`: each required parameter's schema ``default``, else a value
  of the first observation that fits it, else its first enum value or a placeholder of its type),
  and answers ``done`` once every instruction is complete or on the last turn of the budget;
* ``once_<tool>`` (issue 40): calls that tool once with those arguments, then answers ``done`` once
  (a done signal that trusts one call);
* ``chain_tools`` (issue 40): calls the tools in turn, round after round in schema order, each with
  values copied from the latest result (an id a lookup printed, ...; before any result, schema
  defaults and placeholders: the instructions' own values are ``repeat_<tool>``'s), and answers
  ``done`` as ``repeat_<tool>`` does.

Each policy's family (``done``, ``repeat``, ``once``, ``chain``) is named in a rejection. The seeds
are the games probes' first round, drawn per candidate (:meth:`ProbeSettings.first_round`), and a
policy that scores nothing on the screening seeds is not played on the rest.

An episode scores its return (the answer's reward, clipped, iff the episode terminated), or 1.0
when the policy completed every instruction (the success the answer then earns in the base
class). A policy whose mean score over the seeds reaches the threshold completes the instructions
without doing the work (an answer accepted unconditionally, a criterion that counts calls, steps
that advance on any call, ...): the environment is rejected as ``degenerate_win``. The turn
budget, seeds, threshold, step-call and time budgets are the games probes' (``ProbeSettings``),
and so are the switches that turn both off (``selfplay.admission.probes``,
``selfplay.admission.paper_exact``). A policy stops being played once the seeds left cannot lift
its mean to the threshold. Unlike the games probes, an environment fault during a probe (a tool
that hangs, crashes or overflows on the probe's arguments) is not scored 0 but rejects the
environment with its kind at this stage, as every tool stage does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..degenerate_probes import PolicyResult, ProbeBudget, ProbeReport, ProbeSettings
from ..protocol import episode_return
from ..runner import DEFAULT_MAX_TURNS, turn_budget

DONE_ANSWER = "<answer>done</answer>"
ANSWER_DONE = "answer_done"
REPEAT_PREFIX = "repeat_"
ONCE_PREFIX = "once_"
CHAIN = "chain_tools"

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_INTEGER = re.compile(r"-?\d+")
_QUOTED = re.compile(r"[\"'“‘]([^\"'”’\n]{1,60})[\"'”’]")
# an identifier such as ORD-1042 or u7: letters and digits in one token
_IDENTIFIER = re.compile(r"(?<![\w-])(?=[\w-]*[A-Za-z])(?=[\w-]*\d)[\w-]+")
PLACEHOLDERS: dict[str, Any] = {"integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {},
                                "null": None, "string": "probe"}


def _kind(spec: dict[str, Any]) -> str | None:
    kind = spec.get("type")
    return kind[0] if isinstance(kind, list) and kind else kind if isinstance(kind, str) else None


def _from_observation(spec: dict[str, Any], observation: str) -> Any:
    """A value of the first observation that fits ``spec`` (the enum value it names first, its first
    integer or number, its first identifier / quoted phrase / number for a string), or the enum's
    first value or a placeholder of the type."""
    enum = spec.get("enum")
    if isinstance(enum, list) and enum:
        mentioned = []
        for index, value in enumerate(enum):
            found = re.search(rf"(?<![A-Za-z0-9]){re.escape(str(value))}(?![A-Za-z0-9])", observation, re.IGNORECASE)
            if found:
                mentioned.append((found.start(), index))
        return enum[min(mentioned)[1]] if mentioned else enum[0]
    kind = _kind(spec)
    if kind == "integer":
        found = _INTEGER.search(observation)
        return int(found.group()) if found else PLACEHOLDERS["integer"]
    if kind == "number":
        found = _NUMBER.search(observation)
        return float(found.group()) if found else PLACEHOLDERS["number"]
    if kind == "string" or kind is None:  # an identifier, else a quoted phrase, else a number
        for pattern in (_IDENTIFIER, _QUOTED, _NUMBER):
            found = pattern.search(observation)
            if found:
                return found.group(1) if pattern is _QUOTED else found.group()
        return PLACEHOLDERS["string"]
    return PLACEHOLDERS.get(kind, PLACEHOLDERS["string"])


def observed_arguments(tool: dict[str, Any], first_observation: str) -> dict[str, Any]:
    """The fixed arguments a ``repeat_<tool>`` policy passes: every required parameter (and every
    optional one with a schema ``default``), its ``default`` when given, else
    :func:`_from_observation`'s value."""
    parameters = tool.get("function", {}).get("parameters", {})
    parameters = parameters if isinstance(parameters, dict) else {}
    properties = parameters.get("properties", {})
    properties = properties if isinstance(properties, dict) else {}
    required = parameters.get("required", [])
    required = set(required) if isinstance(required, list) else set()
    arguments: dict[str, Any] = {}
    for key, spec in properties.items():
        spec = spec if isinstance(spec, dict) else {}
        if "default" in spec:
            arguments[key] = spec["default"]
        elif key in required:
            arguments[key] = _from_observation(spec, first_observation)
    return arguments


@dataclass(frozen=True)
class ToolProbePolicy:
    name: str
    description: str
    tool: str | None = None  # None: answer done every turn, no tool call (or, for "chain", every tool)
    schema: dict[str, Any] | None = None
    kind: str = "repeat"  # "done", "repeat" (one tool every turn), "once" (one call, then done), "chain"


def tool_probe_policies(tools: list[dict[str, Any]]) -> tuple[ToolProbePolicy, ...]:
    """``answer_done``, then ``repeat_<tool>`` for every tool in schema order, then (issue 40)
    ``once_<tool>`` (one call, then done) for every tool and ``chain_tools`` (every tool in turn,
    each with values copied from the latest result first)."""
    policies = [ToolProbePolicy(ANSWER_DONE, "replies <answer>done</answer> every turn, no tool call", kind="done")]
    named = [(tool.get("function", {}).get("name"), tool) for tool in tools]
    named = [(name, tool) for name, tool in named if isinstance(name, str) and name]
    for name, tool in named:
        policies.append(ToolProbePolicy(
            f"{REPEAT_PREFIX}{name}", f"calls {name} every turn with fixed arguments (schema defaults, "
            "values of the first observation), then answers done", name, tool))
    for name, tool in named:
        policies.append(ToolProbePolicy(f"{ONCE_PREFIX}{name}", f"calls {name} once with the first observation's "
                                        "values, then answers done", name, tool, kind="once"))
    if named:
        policies.append(ToolProbePolicy(CHAIN, "calls the tools in turn, each with values copied from the latest "
                                        "result, then answers done", kind="chain"))
    return tuple(policies)


@dataclass
class ToolPolicyResult(PolicyResult):
    """A probe policy's scores per seed, with the instructions it completed on each and the
    arguments it called its tool with."""

    completed: list[int] = field(default_factory=list)
    instructions: int = 0
    arguments: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "completed": list(self.completed), "instructions": self.instructions,
                "arguments": list(self.arguments)}


@dataclass(frozen=True)
class _Outcome:
    score: float
    completed: int
    arguments: dict[str, Any] | None


async def _episode(env: Any, policy: ToolProbePolicy, seed: int, turns: int, budget: ProbeBudget,
                   tools: list[dict[str, Any]]) -> _Outcome | None:
    """One probe episode; None when the budget ran out before it ended. An environment fault
    propagates: a tool environment that crashes, hangs or overflows on a probe call is rejected
    for it, as in the other tool stages."""
    first = await env.reset(seed=seed)
    arguments = None if policy.schema is None else observed_arguments(policy.schema, first.observation)
    all_done, value, calls = False, 0.0, 0
    chain = list(tools) if policy.kind == "chain" else []
    latest = ""  # what the last call returned: the chain copies from results, never from the instructions
    for turn in range(turns):
        if not budget.take():
            return None
        calling = policy.kind in ("repeat", "chain") or (policy.kind == "once" and calls == 0)
        if calling and not all_done and turn < turns - 1:
            tool = chain[calls % len(chain)] if chain else policy.schema
            name = tool.get("function", {}).get("name")
            if chain:  # values copied from the latest result (schema defaults and placeholders before any)
                arguments = observed_arguments(tool, latest)
            result = await env.call_tool(name, dict(arguments or {}))
            latest, calls = result.output, calls + 1
            all_done = result.progress.all_done
            continue
        outcome = await env.step(DONE_ANSWER)
        if outcome.terminated or outcome.truncated:
            value = episode_return([outcome.reward], outcome.terminated)
            break
        if policy.kind == "once":  # the done signal after one call was not taken: answer_done tries the rest
            break
    progress = (await env.tools()).progress
    return _Outcome(1.0 if progress.all_done else value, progress.current, arguments)


async def run_tool_probes(env: Any, tools: list[dict[str, Any]], instructions: int, settings: ProbeSettings, *,
                          max_turns: int | None = None) -> ProbeReport:
    """Play every tool probe policy on ``env`` (an open ``ToolEnvInstance``) and report each one's
    mean score; the first at or above the threshold is the winner (probing stops there).
    ``steps`` in the report counts the sandbox calls (tool calls and answers) the probes made."""
    turns = turn_budget(max_turns or DEFAULT_MAX_TURNS, env.max_turns)
    seeds = settings.first_round if settings.seeds else settings.for_candidate(env.class_name or "").first_round
    report = ProbeReport(settings.threshold, turns, seeds=seeds)
    budget = ProbeBudget(settings.max_steps, settings.max_seconds)
    for policy in tool_probe_policies(tools):
        result = ToolPolicyResult(policy.name, policy.description, policy.kind, instructions=instructions)
        report.results.append(result)
        for position, seed in enumerate(seeds):
            if result.cannot_reach(settings.threshold, len(seeds) - position):
                break
            if settings.screen_seeds and position == settings.screen_seeds and not any(r > 0 for r in result.returns):
                break  # screened out, as the games probes: nothing earned on the first seeds
            outcome = await _episode(env, policy, seed, turns, budget, tools)
            if outcome is None:
                break
            result.returns.append(outcome.score)
            result.seeds.append(seed)
            result.completed.append(outcome.completed)
            if outcome.arguments is not None:
                result.arguments.append(outcome.arguments)
        if report.judge(result, budget):
            break
    return report


def win_message(report: ProbeReport) -> str:
    """What the rejection says: the policy, how it played and what it achieved."""
    winner = report.winner
    assert isinstance(winner, ToolPolicyResult) and winner.mean_return is not None
    how = (f"with arguments {winner.arguments[0]}" if winner.arguments else "") if winner.policy != ANSWER_DONE else ""
    done = ", ".join(f"{c} of {winner.instructions}" for c in winner.completed)
    return (f"the probe policy '{winner.policy}' of family '{winner.family}' ({winner.description}"
            f"{'; ' + how if how else ''}) wins: "
            f"instructions completed per seed {done}, mean score {winner.mean_return:.3f} over seeds "
            f"{winner.seeds} (threshold {report.threshold:g}); a tool environment that such a policy completes "
            "does not check the work its instructions ask for")
