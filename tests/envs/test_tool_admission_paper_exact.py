"""``selfplay.admission.tool_use.schema_gate`` and ``admission.paper_exact`` (issue 39): the schema gate
is spade's (on by default); the released validation has none, so the paper-exact switch admits a
tool environment the gate rejects (two tools, no enum, no required parameter), in the real sandbox."""

from __future__ import annotations

import pytest

from conftest import make_harness
from spade.config import ConfigError, from_mapping
from spade.envs.admission import admit
from spade.envs.protocol import ErrorKind, Stage
from spade.envs.tool_use.admission import ToolAdmissionSettings
from spade.selfplay.settings import SelfPlaySettings
from test_tool_admission import env_with

LOOSE_TOOLS = '''{"set_mode": {"description": "Set.", "parameters": {"type": "object", "properties": {
                "mode": {"type": "string"}}}},
              "read": {"description": "Read.", "parameters": {"type": "object", "properties": {}}}}'''


@pytest.fixture(scope="module")
def harness():
    h = make_harness()
    yield h
    h.close()


def _admit(harness, settings: SelfPlaySettings):
    return harness.run(admit(harness.service, env_with(tools=LOOSE_TOOLS), max_turns=20, require_tool_env=True,
                             tool_settings=settings.admission.tool_settings(), probes=settings.admission_probe_settings(),
                             determinism=settings.admission.checks_determinism), timeout=120)


def test_default_keeps_the_schema_gate(harness):
    settings = SelfPlaySettings(domain="tool_use", k=8)
    assert settings.admission.tool_use.schema_gate and settings.admission.tool_settings().schema_gate
    verdict = _admit(harness, settings)
    assert not verdict.admitted
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.BAD_TOOL_SCHEMA, Stage.TOOL_SCHEMA)
    assert "2 tools" in verdict.error.message and "no parameter has an enum" in verdict.error.message


@pytest.mark.parametrize("overrides", [{"admission": {"paper_exact": True}},
                                       {"admission": {"tool_use": {"schema_gate": False}, "probes": False,
                                                      "determinism": False}}])
def test_paper_exact_or_the_switch_admits_what_the_release_admits(harness, overrides):
    settings = from_mapping(SelfPlaySettings, {"domain": "tool_use", "k": 8, **overrides}, where="selfplay")
    assert settings.admission.tool_settings().schema_gate is False
    verdict = _admit(harness, settings)
    assert verdict.admitted, verdict.error
    assert verdict.tool_report.tools == 2 and "tool_schema" in verdict.timings_ms  # schemas still read and reported


def test_schema_gate_key_is_validated():
    with pytest.raises(ConfigError, match=r"selfplay\.admission\.tool_use\.schema_gate: expected true or false"):
        from_mapping(SelfPlaySettings, {"admission": {"tool_use": {"schema_gate": "off"}}}, where="selfplay")
    with pytest.raises(ValueError, match="schema_gate must be true or false"):
        ToolAdmissionSettings(schema_gate="off")
