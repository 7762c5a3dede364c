"""Admission's degenerate-policy probes for tool environments (issue 23) through the real sandbox.

Answering done without a tool call, calling one tool over and over, one call then done, or every
tool in turn with values copied from the latest result (issue 40) must not complete the
instructions: environments where it does are rejected as ``degenerate_win`` naming the policy;
the example tool environments and the tests' honest fixture are admitted with every policy's
score in the tool report. The games probes' switches govern these too.
"""

from __future__ import annotations

import pytest

from conftest import make_harness
from spade.envs.admission import admit
from spade.envs.degenerate_probes import ProbeSettings
from spade.envs.protocol import ErrorKind, Stage
from spade.envs.tool_use.degenerate_probes import ANSWER_DONE, observed_arguments, tool_probe_policies
from spade.envs.tool_use.local import example_paths
from spade.selfplay.settings import AdmissionSettings, SelfPlaySettings


@pytest.fixture(scope="module")
def harness():
    h = make_harness()
    yield h
    h.close()


TOOLS = '''{
            "set_mode": {"description": "Set the mode.", "parameters": {"type": "object", "properties": {
                "mode": {"type": "string", "enum": ["a", "b", "c"]}}, "required": ["mode"]}},
            "read": {"description": "Read the mode.", "parameters": {"type": "object", "properties": {}}},
            "note": {"description": "Write a note.", "parameters": {"type": "object", "properties": {
                "text": {"type": "string"}}, "required": ["text"]}},
        }'''


def tool_env(criteria: str, *, first: str = "Set mode b.", extra: str = "") -> str:
    """Three tools over a small state: set_mode (an enum), read (counts reads), note (logs text);
    every call is logged in ``calls``. Honest criteria need mode b, then two reads, then mode c."""
    return f'''
class ProbeTargetEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        self._state = {{"mode": "a", "reads": 0, "notes": [], "calls": 0}}
        self._tools = {TOOLS}
        self._user_messages = ["{first}", "Read it twice.", "Now set mode c."]
        self._message_criteria = {criteria}
        self._current_msg = 0
        return self._user_messages[0], {{}}

    def tool_set_mode(self, mode):
        self._state["calls"] += 1
        self._state["mode"] = mode
        return "mode is " + mode

    def tool_read(self):
        self._state["calls"] += 1
        self._state["reads"] += 1
        return self._state["mode"]

    def tool_note(self, text):
        self._state["calls"] += 1
        self._state["notes"].append(text)
        return "noted"

    def solution(self):
        return ('set_mode({{"mode": "b"}}) -> read({{}}) -> read({{}}) -> set_mode({{"mode": "c"}}) '
                '-> <answer>done</answer>')
{extra}
'''


HONEST = tool_env('[lambda s: s["mode"] == "b", lambda s: s["mode"] == "b" and s["reads"] >= 2, '
                  'lambda s: s["mode"] == "c" and s["reads"] >= 2]')

# name -> (source, the policy that wins, instructions it completes out of 3)
EXPLOITS = {
    "done accepted without calls": (HONEST.replace("    def solution(self):", '''    def _check_answer(self, answer):
        return "done" in answer.lower()

    def solution(self):'''), ANSWER_DONE, 0),
    "any reply pays": (HONEST.replace("    def solution(self):", '''    def step(self, action):
        return "Thanks!", 1.0, True, False, {}

    def solution(self):'''), ANSWER_DONE, 0),
    "one repeated call completes everything": (
        tool_env('[lambda s: s["reads"] >= 1, lambda s: s["reads"] >= 2, lambda s: s["reads"] >= 3]'),
        "repeat_read", 3),
    "steps advance on any call": (
        tool_env('[lambda s: s["calls"] >= 1, lambda s: s["calls"] >= 1, lambda s: s["calls"] >= 1]'),
        "repeat_set_mode", 3),
    # the argument the first instruction names (mode b, not the enum's first value a) is enough
    "the first instruction's argument completes everything": (
        tool_env('[lambda s: s["mode"] == "b", lambda s: s["mode"] == "b", lambda s: s["mode"] == "b"]'),
        "repeat_set_mode", 3),
    # issue 40: the answer is trusted after one call (meant: after the calls the instructions need)
    "done trusted after one call": (HONEST.replace("    def solution(self):", '''    def _check_answer(self, answer):
        return self._state["calls"] == 1

    def solution(self):'''), "once_set_mode", 1),
    # issue 40: read() prints a ticket that, noted back, completes every instruction
    "a value one tool prints completes everything through another": (
        tool_env('[lambda s: s["ticket"] in s["notes"]] * 3').replace(
            '"calls": 0}', '"calls": 0, "ticket": "T-" + str(1000 + (seed or 0) % 9000)}').replace(
            '        return self._state["mode"]', '        return "ticket " + self._state["ticket"]'),
        "chain_tools", 3),
}


def verdict_for(harness, source: str, **kwargs):
    return harness.run(admit(harness.service, source, max_turns=12, require_tool_env=True, **kwargs), timeout=120)


@pytest.mark.parametrize("name", list(EXPLOITS), ids=lambda n: n.replace(" ", "_"))
def test_exploitable_tool_environment_is_rejected_naming_the_policy(harness, name):
    source, policy, completed = EXPLOITS[name]
    verdict = verdict_for(harness, source)
    assert not verdict.admitted
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.DEGENERATE_WIN, Stage.DEGENERATE_PROBE)
    assert f"'{policy}'" in verdict.error.message
    assert f"instructions completed per seed {completed} of 3" in verdict.error.message
    assert "degenerate_probe" in verdict.timings_ms


def test_the_rejection_says_with_which_arguments(harness):
    verdict = verdict_for(harness, EXPLOITS["the first instruction's argument completes everything"][0])
    assert "with arguments {'mode': 'b'}" in verdict.error.message


def test_honest_fixtures_and_examples_are_admitted_with_every_policy_reported(harness):
    from spade.designer.tool_prompts import _EXAMPLE as PROMPT_EXAMPLE  # the designer prompt's worked example
    from spade.envs.tool_use.local import is_tool_source
    from test_tool_sandbox import PAPER_STYLE  # written the way the paper's generated environments are

    sources = {"honest fixture": HONEST, "paper style": PAPER_STYLE, **{p.stem: p.read_text() for p in example_paths()}}
    assert len(sources) == 7
    verdict = verdict_for(harness, PROMPT_EXAMPLE)
    assert verdict.admitted and is_tool_source(verdict.code), verdict.error
    sources["designer prompt example"] = verdict.code
    for name, source in sources.items():
        verdict = verdict_for(harness, source, probes=ProbeSettings())
        assert verdict.admitted, (name, verdict.error)
        report = verdict.tool_report.probes
        assert report.winner is None and not report.budget_exhausted, name
        names = [r.policy for r in report.results]
        tools = _tool_names(source)
        assert names == [ANSWER_DONE] + [f"repeat_{t}" for t in tools] + [f"once_{t}" for t in tools] + [
            "chain_tools"], name
        assert all(r.mean_return < 0.5 for r in report.results), name
        data = verdict.to_json()["tool_report"]["probe_report"]
        assert data["winner"] is None and [p["policy"] for p in data["policies"]] == names


def _tool_names(source: str) -> list[str]:
    from spade.envs.tool_use.local import load_trusted

    env = load_trusted(source)()
    env.reset(seed=1)
    return [t["function"]["name"] for t in env.get_tools()]


def test_a_policy_completing_some_steps_only_is_admitted(harness):
    """note() completes the first of three steps (any note), not the rest: scored by its return, 0."""
    source = tool_env('[lambda s: len(s["notes"]) > 0, lambda s: s["reads"] >= 2, lambda s: s["mode"] == "c"]')
    verdict = verdict_for(harness, source)
    assert verdict.admitted, verdict.error
    note = next(r for r in verdict.tool_report.probes.results if r.policy == "repeat_note")
    # nothing earned on the two screening seeds: not played on the rest of the round
    assert note.completed == [1, 1] and note.mean_return == 0.0


def test_a_tool_exiting_on_a_probe_call_is_rejected_at_the_probe_stage(harness):
    """A fault during a probe call is the environment's (as in the other tool stages), not a 0 score."""
    source = HONEST.replace('''        self._state["notes"].append(text)''', '''        raise SystemExit(3)''')
    verdict = verdict_for(harness, source)
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.EXIT_CALLED, Stage.DEGENERATE_PROBE)


def test_the_games_switches_govern_the_tool_probes(harness):
    from spade.selfplay.sources.designer_source import admit_candidate

    source = EXPLOITS["one repeated call completes everything"][0]

    def verdict(**admission):
        sp = SelfPlaySettings(domain="tool_use", max_turns=12, admission=AdmissionSettings(**admission))
        return harness.run(admit_candidate(harness.service, sp, source), timeout=120)

    assert verdict().error.kind is ErrorKind.DEGENERATE_WIN
    for off in ({"probes": False}, {"paper_exact": True}):
        admitted = verdict(**off)
        assert admitted.admitted and admitted.tool_report.probes is None, off
        assert "degenerate_probe" not in admitted.timings_ms


def test_the_turn_budget_bounds_the_repeated_calls(harness):
    """Five reads complete everything: a run budget of 5 turns leaves four calls and the answer
    (as in training, where the answer takes a turn), so the environment is admitted; 6 turns are enough."""
    source = tool_env('[lambda s: s["reads"] >= 3, lambda s: s["reads"] >= 4, lambda s: s["reads"] >= 5]')
    short = harness.run(admit(harness.service, source, max_turns=5, require_tool_env=True), timeout=120)
    assert short.admitted and short.tool_report.probes.turns == 5
    assert next(r for r in short.tool_report.probes.results if r.policy == "repeat_read").completed == [2, 2]
    longer = harness.run(admit(harness.service, source, max_turns=6, require_tool_env=True), timeout=120)
    assert longer.error.kind is ErrorKind.DEGENERATE_WIN and "'repeat_read'" in longer.error.message


def test_observed_arguments():
    tool = {"function": {"name": "t", "parameters": {"type": "object", "properties": {
        "account": {"type": "string", "enum": ["checking", "savings"]},
        "amount": {"type": "integer"}, "rate": {"type": "number"}, "order": {"type": "string"},
        "flag": {"type": "boolean"}, "kind": {"type": "string", "default": "basic"},
        "optional": {"type": "string"}},
        "required": ["account", "amount", "rate", "order", "flag"]}}}
    observation = "Move 150 from savings to checking for order ORD-77, rate 2.5."
    assert observed_arguments(tool, observation) == {"account": "savings", "amount": 150, "rate": 150.0,
                                                     "order": "ORD-77", "flag": True, "kind": "basic"}
    assert observed_arguments(tool, "Nothing to see.") == {"account": "checking", "amount": 1, "rate": 1.0,
                                                           "order": "probe", "flag": True, "kind": "basic"}
    assert observed_arguments(tool, "Cancel 'the blue lamp' for 12.")["order"] == "the blue lamp"
    assert observed_arguments(tool, "Cancel 12 lamps.")["order"] == "12"
    # an enum value counts as mentioned only as a word of its own
    single = {"function": {"name": "m", "parameters": {"type": "object", "properties": {
        "mode": {"type": "string", "enum": ["a", "b"]}}, "required": ["mode"]}}}
    assert observed_arguments(single, "Set the mode to b.") == {"mode": "b"}
    assert observed_arguments(single, "Set the mode to bravo.") == {"mode": "a"}
    assert [p.name for p in tool_probe_policies([tool, single])] == [ANSWER_DONE, "repeat_t", "repeat_m", "once_t",
                                                                      "once_m", "chain_tools"]


def test_env_check_prints_the_tool_probes_one_line_per_family(tmp_path, capsys):
    from spade.cli import main

    exploit = tmp_path / "reads.py"
    exploit.write_text(EXPLOITS["one repeated call completes everything"][0])
    banking = next(p for p in example_paths() if p.stem == "banking")
    assert main(["env", "check", "-v", str(banking), str(exploit)]) == 1
    admitted, rejected = capsys.readouterr().out.split(f"{exploit}: ")
    assert "ok   degenerate_probe" in admitted
    for family, best in (("done", ANSWER_DONE), ("repeat", "repeat_"), ("once", "once_"), ("chain", "chain_tools")):
        lines = [line for line in admitted.splitlines() if line.strip().startswith(family + " ")]
        assert len(lines) == 1 and f"best {best}" in lines[0], family
    assert "rejected at degenerate_probe: degenerate_win" in rejected and "'repeat_read'" in rejected
    assert "FAIL degenerate_probe" in rejected
