"""Admission of tool environments: the tool stages after the games stages, each gate's rejection
named with its stage, the beyond-the-paper diagnostics in every verdict and their switches."""

from __future__ import annotations

import pytest

from conftest import make_harness
from spade.envs.admission import admit
from spade.envs.protocol import ErrorKind, Stage
from spade.envs.tool_use.admission import ToolAdmissionSettings, probe_arguments, schema_problems
from spade.envs.tool_use.local import example_paths

GOOD = (example_paths()[0]).read_text()


@pytest.fixture(scope="module")
def harness():
    h = make_harness()
    yield h
    h.close()


def env_with(*, tools: str | None = None, criteria: str | None = None, extra: str = "") -> str:
    tools = tools or '''{
            "set_mode": {"description": "Set the mode.", "parameters": {"type": "object", "properties": {
                "mode": {"type": "string", "enum": ["a", "b"]}}, "required": ["mode"]}},
            "read": {"description": "Read the mode.", "parameters": {"type": "object", "properties": {}}},
            "noise": {"description": "Unrelated.", "parameters": {"type": "object", "properties": {}}},
        }'''
    criteria = criteria or '[lambda s: s["mode"] == "b", lambda s: s["count"] >= 2, lambda s: s["count"] >= 3]'
    return f'''
class GateEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        self._state = {{"mode": "x", "count": 0, "seed": seed}}
        self._tools = {tools}
        self._user_messages = ["Set mode b.", "Read it twice.", "Once more."]
        self._message_criteria = {criteria}
        self._current_msg = 0
        return self._user_messages[0], {{}}

    def tool_set_mode(self, mode):
        self._state["mode"] = mode
        return "ok"

    def tool_read(self):
        self._state["count"] += 1
        return self._state["mode"]

    def tool_noise(self):
        return "noise"

    def solution(self):
        return 'set_mode({{"mode": "b"}}) -> read({{}}) -> read({{}}) -> read({{}}) -> <answer>done</answer>'
{extra}
'''


def run(harness, source, **kwargs):
    return harness.run(admit(harness.service, source, max_turns=20, **kwargs), timeout=120)


@pytest.mark.parametrize("path", example_paths(), ids=[p.stem for p in example_paths()])
def test_examples_are_admitted_with_a_report(harness, path):
    verdict = run(harness, path.read_text(), require_tool_env=True)
    assert verdict.admitted, verdict.error
    assert verdict.tool_use and verdict.tool_report is not None
    report = verdict.tool_report
    assert 3 <= report.tools <= 8 and report.true_at_reset == [] and report.screen is None
    for stage in ("tool_schema", "reset_gate", "tool_probes"):
        assert stage in verdict.timings_ms
    assert verdict.to_json()["tool_report"]["instructions"] == report.instructions


def test_schema_gate(harness):
    two = '''{"set_mode": {"description": "Set.", "parameters": {"type": "object", "properties": {
                "mode": {"type": "string", "enum": ["a", "b"]}}, "required": ["mode"]}},
              "read": {"description": "Read.", "parameters": {"type": "object", "properties": {}}}}'''
    verdict = run(harness, env_with(tools=two))
    assert not verdict.admitted
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.BAD_TOOL_SCHEMA, Stage.TOOL_SCHEMA)
    assert "2 tools" in verdict.error.message


def test_schema_rules():
    settings = ToolAdmissionSettings()
    tool = lambda name, params: {"type": "function", "function": {"name": name, "description": "d",  # noqa: E731
                                                                   "parameters": params}}
    plain = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    enum = {"type": "object", "properties": {"m": {"type": "string", "enum": ["x"]}}}
    assert schema_problems([tool("a", plain), tool("b", enum), tool("c", plain)], settings) == []
    assert any("enum" in p for p in schema_problems([tool(n, plain) for n in "abc"], settings))
    assert any("required" in p for p in schema_problems([tool(n, enum) for n in "abc"], settings))
    bad = {"type": "object", "properties": {"q": {"type": "text"}}, "required": ["z"]}
    problems = schema_problems([tool("a", bad), tool("b", enum), tool("b", plain)], settings)
    assert any("unknown type" in p for p in problems) and any("unique" in p for p in problems)
    assert any("JSON Schema object" in p for p in schema_problems([tool("a", {"type": "array"})] * 3, settings))
    assert probe_arguments(tool("b", {"type": "object", "properties": {
        "m": {"type": "string", "enum": ["x", "y"]}, "n": {"type": "integer"}, "s": {"type": "string"}}})) == \
        {"m": "x", "n": 1, "s": "probe"}


def test_reset_gate_rejects_a_criterion_raising_under_every_seed(harness):
    verdict = run(harness, env_with(criteria='[lambda s: s["mode"] == "b", lambda s: s["missing"], '
                                             'lambda s: s["count"] >= 3]'))
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.CRITERION_ERROR, Stage.RESET_GATE)
    assert "[1]" in verdict.error.message


def test_reset_gate_tolerates_a_criterion_raising_under_one_seed(harness):
    verdict = run(harness, env_with(criteria='[lambda s: s["mode"] == "b", lambda s: 1 / (s["seed"] or 0) > 9, '
                                             'lambda s: s["count"] >= 3]'))
    assert verdict.admitted, verdict.error
    assert verdict.tool_report.gate_errors == {1: 1}


def test_diagnostics_reported_by_default_and_rejections_when_switched_on(harness):
    source = env_with(criteria='[lambda s: s["mode"] == "x", lambda s: s["count"] >= 0, lambda s: s["count"] >= 5]')
    # five reads complete every instruction: the degenerate-policy probes (issue 23) would reject it,
    # so they are off here (the paper's admission)
    verdict = run(harness, source, probes=None)
    assert verdict.admitted  # the paper's behaviour
    report = verdict.tool_report
    assert report.true_at_reset == [0, 1]
    assert report.unchangeable == [2]  # no single call reaches count 5
    assert 1 in report.trivial  # holds after every first call
    for switch, kind in (("reject_true_at_reset", ErrorKind.CRITERION_TRUE_AT_RESET),
                         ("reject_unchangeable", ErrorKind.CRITERION_UNCHANGEABLE),
                         ("reject_trivial", ErrorKind.TRIVIAL_INSTRUCTION)):
        rejected = run(harness, source, probes=None, tool_settings=ToolAdmissionSettings(**{switch: True}))
        assert (rejected.error.kind, rejected.error.stage) == (kind, Stage.TOOL_PROBES)


def test_model_screen(harness):
    seen = []

    async def says(verdict):
        async def screen(source, tools):
            seen.append((source, [t["function"]["name"] for t in tools]))
            return verdict
        return screen

    no = run(harness, GOOD, screen=harness.run(says(False)))
    assert (no.error.kind, no.error.stage) == (ErrorKind.SCREEN_REJECTED, Stage.MODEL_SCREEN)
    assert seen and seen[0][0].strip() == GOOD.strip() and "decline_request" in seen[0][1]
    assert run(harness, GOOD, screen=harness.run(says(None))).admitted  # no verdict counts as accept
    yes = run(harness, GOOD, screen=harness.run(says(True)))
    assert yes.admitted and yes.tool_report.screen is True
    off = run(harness, GOOD, screen=harness.run(says(False)), tool_settings=ToolAdmissionSettings(model_screen=False))
    assert off.admitted


def test_tool_domain_requires_a_tool_environment(harness):
    game = (example_paths()[0].parents[1] / "hidden_sequence.py").read_text()
    verdict = run(harness, game, require_tool_env=True)
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.NO_ENV_CLASS, Stage.LOAD)
    assert run(harness, game).admitted and not run(harness, game).tool_use


def test_a_tool_crashing_during_the_probes_is_named_by_stage(harness):
    source = env_with(extra="    def tool_noise(self):\n        while True:\n            pass\n")
    verdict = run(harness, source, probes=None)  # the degenerate-policy probes would meet it first
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.TIMEOUT, Stage.TOOL_PROBES)


def test_determinism_switch_reaches_tool_environments(harness):
    """A tool environment goes through the same determinism stage; ``selfplay.admission.determinism``
    false (the paper's admission) admits one whose first message ignores the seed."""
    from spade.selfplay.sources.designer_source import admit_candidate
    from spade.selfplay.settings import AdmissionSettings, SelfPlaySettings

    source = env_with().replace("return self._user_messages[0], {}",
                                "return self._user_messages[0] + str(__import__('random').random()), {}")
    assert source.count("__import__('random')") == 1

    def admitted(**admission):
        sp = SelfPlaySettings(domain="tool_use", max_turns=20, admission=AdmissionSettings(**admission))
        return harness.run(admit_candidate(harness.service, sp, source), timeout=120)

    on = admitted()
    assert (on.error.kind, on.error.stage) == (ErrorKind.NONDETERMINISTIC_RESET, Stage.DETERMINISM)
    off = admitted(determinism=False)
    assert off.admitted and off.tool_use, off.error
    assert "determinism" not in off.timings_ms and "tool_schema" in off.timings_ms
