"""Tool environments in the real sandbox: ``ToolUseBaseEnv`` injected into the module, the tool
operations (schemas, structured calls, progress, criteria), and hostile tools, each ending in one
classified fault with the supervisor and the next environment unaffected."""

from __future__ import annotations

import contextlib
import json
import random
import textwrap

import pytest

from conftest import make_harness
from spade.envs.protocol import EnvFault, ErrorKind, InfrastructureFault, Stage
from spade.envs.tool_use import FORMAT_ERROR_REWARD, ToolUseBaseEnv

QUICK = dict(load_timeout_s=3.0, reset_timeout_s=2.0, step_timeout_s=2.0, memory_limit_mb=256)

# Written the way the paper's generated environments are: the base class is not imported, the
# subclass fills everything in reset, has its own _advance_if_done, _check_answer and solution(), and
# every tool ends with ``+ self._advance_if_done()`` (the released multi-turn prompt's contract).
PAPER_STYLE = '''
import random

class LibraryLoanEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        rng = random.Random(seed)
        self.turn_count = 0
        self._call_history = []
        copies = rng.randint(2, 4)
        self._state = {"books": {"B1": {"title": "Dune", "copies": copies}}, "loans": [], "holds": []}
        self._tools = {
            "find_book": {"description": "Find a book by title.",
                          "parameters": {"type": "object", "properties": {"title": {"type": "string"}},
                                         "required": ["title"]}},
            "lend": {"description": "Lend a book to a member.",
                     "parameters": {"type": "object", "properties": {
                         "book_id": {"type": "string"},
                         "member": {"type": "string"},
                         "length": {"type": "string", "enum": ["week", "month"]}},
                         "required": ["book_id", "member"]}},
            "place_hold": {"description": "Place a hold.",
                           "parameters": {"type": "object", "properties": {"book_id": {"type": "string"}},
                                          "required": ["book_id"]}},
        }
        self._user_messages = ["Lend 'Dune' to member M7 for a month.", "Now place a hold on the same book."]
        self._message_criteria = [
            lambda s: any(l["member"] == "M7" and l["length"] == "month" for l in s["loans"]),
            lambda s: "B1" in s["holds"],
        ]
        self._current_msg = 0
        self._expected_answer = "done"
        return self._user_messages[0], {"copies": copies}

    def tool_find_book(self, title):
        for book_id, book in self._state["books"].items():
            if book["title"].lower() == title.lower():
                return f"{book_id}: {book['title']} ({book['copies']} copies)" + self._advance_if_done()
        return "no such book" + self._advance_if_done()

    def tool_lend(self, book_id, member, length="week"):
        book = self._state["books"][book_id]
        book["copies"] -= 1
        self._state["loans"].append({"book": book_id, "member": member, "length": length})
        return f"lent {book_id} to {member} for a {length}" + self._advance_if_done()

    def tool_place_hold(self, book_id):
        self._state["holds"].append(book_id)
        return f"hold placed on {book_id}" + self._advance_if_done()

    def _advance_if_done(self):
        if self._current_msg >= len(self._user_messages):
            return ""
        if self._message_criteria[self._current_msg](self._state):
            self._current_msg += 1
            if self._current_msg >= len(self._user_messages):
                return "\\n\\n[ALL STEPS COMPLETE] Submit <answer>done</answer>."
            return f"\\n\\n[STEP {self._current_msg} COMPLETE — NEW INSTRUCTION] {self._user_messages[self._current_msg]}"
        return ""

    def _check_answer(self, answer):
        return answer.strip().lower() == "done" and self._current_msg >= len(self._user_messages)

    def solution(self):
        return "find_book(Dune) -> lend(B1, M7, month) -> place_hold(B1) -> <answer>done</answer>"
'''


def tool_env(body: str, *, tools: str = '{"ping": {"description": "p", "parameters": {"type": "object", '
                                          '"properties": {}}}}') -> str:
    """A minimal tool environment whose ``tool_ping`` runs ``body``."""
    return textwrap.dedent(f'''
class HostileToolEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        self._state = {{"n": 0}}
        self._tools = {tools}
        self._user_messages = ["ping once"]
        self._message_criteria = [lambda s: s["n"] > 0]
        self._current_msg = 0
        return "ping once", {{}}

    def tool_ping(self, **kw):
''') + textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 8) + "\n"


@pytest.fixture(scope="module")
def harness():
    h = make_harness(**QUICK)
    yield h
    h.close()


# The same environment whose tools do not append the notice and with no _advance_if_done of its
# own: the base class's _advance_if_done and execute_tool give the agent the same text.
BASE_ADVANCING = PAPER_STYLE[:PAPER_STYLE.index("    def _advance_if_done(self):")] + \
    PAPER_STYLE[PAPER_STYLE.index("    def _check_answer(self, answer):"):]
BASE_ADVANCING = BASE_ADVANCING.replace(" + self._advance_if_done()", "")

# the released notices (spare/core/prompts/tool_use_template.py, _advance_if_done), written out
LENT = "lent B1 to M7 for a month"
LENT_NOTICE = "\n\n[STEP 1 COMPLETE — NEW INSTRUCTION] Now place a hold on the same book."
HELD_NOTICE = "\n\n[ALL STEPS COMPLETE] Submit <answer>done</answer>."


@pytest.mark.parametrize("source", [PAPER_STYLE, BASE_ADVANCING], ids=["tools_append_notice", "base_appends"])
def test_paper_style_environment_runs_unchanged(harness, source):
    env = harness.run(harness.service.open(source, max_turns=12))
    try:
        assert env.tool_use and env.class_name == "LibraryLoanEnv" and env.max_turns == 12
        first = harness.run(env.reset(seed=3))
        assert first.observation == "Lend 'Dune' to member M7 for a month."
        schemas = harness.run(env.tools())
        assert [t["function"]["name"] for t in schemas.tools] == ["find_book", "lend", "place_hold"]
        assert schemas.tools[1]["type"] == "function"
        assert schemas.tools[1]["function"]["parameters"]["required"] == ["book_id", "member"]
        assert (schemas.progress.current, schemas.progress.total) == (0, 2)
        found = harness.run(env.call_tool("find_book", {"title": "dune"}))
        assert found.returncode == 0 and found.output.startswith("B1: Dune") and found.advanced == 0
        assert "[STEP" not in found.output
        # a wrong call is an observation, not a fault
        bad = harness.run(env.call_tool("lend", {"book": "B1"}))
        assert bad.returncode == 1 and "bad arguments" in bad.output
        unknown = harness.run(env.call_tool("delete_everything", {}))
        assert unknown.returncode == 1 and "unknown tool" in unknown.output
        # the call that completes instruction 1 brings instruction 2 at the end of its result, once
        lent = harness.run(env.call_tool("lend", {"book_id": "B1", "member": "M7", "length": "month"}))
        assert lent.output == LENT + LENT_NOTICE
        assert lent.advanced == 1 and lent.progress.instruction == "Now place a hold on the same book."
        # nothing more completed: no notice
        again = harness.run(env.call_tool("find_book", {"title": "Dune"}))
        assert again.advanced == 0 and again.output.startswith("B1: Dune") and "\n\n[" not in again.output
        early = harness.run(env.step("<answer>done</answer>"))
        assert (early.reward, early.terminated) == (0.0, False)
        held = harness.run(env.call_tool("place_hold", {"book_id": "B1"}))
        assert held.output == "hold placed on B1" + HELD_NOTICE
        assert held.progress.all_done and held.progress.instruction is None
        after = harness.run(env.call_tool("place_hold", {"book_id": "B1"}))
        assert after.output == "hold placed on B1" and after.advanced == 0
        criteria = harness.run(env.criteria())
        assert [c.value for c in criteria.criteria] == [True, True]
        done = harness.run(env.step("<answer>done</answer>"))
        assert done.as_tuple() == ("Correct!", 1.0, True, False, {})
    finally:
        harness.run(env.close())


TWO_AT_ONCE = '''
class CounterEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        self._state = {"n": 0, "looked": False}
        self._tools = {"bump": {"description": "Add one.", "parameters": {"type": "object", "properties": {}}},
                       "look": {"description": "Read the counter.", "parameters": {"type": "object", "properties": {}}}}
        self._user_messages = ["Bump the counter.", "Make sure it is positive.", "Look at it."]
        self._message_criteria = [lambda s: s["n"] >= 1, lambda s: s["n"] > 0, lambda s: s["looked"]]
        self._current_msg = 0
        return self._user_messages[0]

    def tool_bump(self):
        self._state["n"] += 1
        return "bumped" APPEND

    def tool_look(self):
        self._state["looked"] = True
        return "n=" + str(self._state["n"]) APPEND
'''


@pytest.mark.parametrize("append", [" + self._advance_if_done()", ""], ids=["tools_append_notice", "base_appends"])
def test_one_step_per_call_and_one_notice(harness, append):
    """A call that meets two criteria at once completes one step, with one notice (the released
    _advance_if_done moves one step per call); the next call completes the other."""
    env = harness.run(harness.service.open(TWO_AT_ONCE.replace("APPEND", append)))
    try:
        harness.run(env.reset())
        bumped = harness.run(env.call_tool("bump", {}))
        assert bumped.output == "bumped\n\n[STEP 1 COMPLETE — NEW INSTRUCTION] Make sure it is positive."
        assert bumped.advanced == 1
        looked = harness.run(env.call_tool("look", {}))
        assert looked.output == "n=1\n\n[STEP 2 COMPLETE — NEW INSTRUCTION] Look at it." and looked.advanced == 1
        again = harness.run(env.call_tool("look", {}))
        assert again.output == "n=1" + HELD_NOTICE and again.progress.all_done
    finally:
        harness.run(env.close())


def test_text_protocol_of_the_base_step(harness):
    env = harness.run(harness.service.open(BASE_ADVANCING, max_turns=12))
    try:
        harness.run(env.reset(seed=1))
        fmt = harness.run(env.step("I will lend the book"))
        assert (fmt.reward, fmt.terminated, fmt.truncated) == (FORMAT_ERROR_REWARD, False, False)
        fmt2 = harness.run(env.step("<tool_call>\n{not json}\n</tool_call>"))
        assert fmt2.reward == FORMAT_ERROR_REWARD
        lend = {"name": "lend", "arguments": {"book_id": "B1", "member": "M7", "length": "month"}}
        # SGLang's qwen25 layout needs the new lines; a block without them is not a call
        inline = harness.run(env.step("<tool_call>" + json.dumps(lend) + "</tool_call>"))
        assert inline.reward == FORMAT_ERROR_REWARD
        # a name that is not one of the tools runs and gets the unknown-tool error (the released
        # step and the native path's default), reward 0; a block with no name is no call
        unknown = harness.run(env.step('<tool_call>\n{"name": "burn", "arguments": {}}\n</tool_call>'))
        assert unknown.reward == 0.0 and unknown.observation.startswith("Tool result:\nError: unknown tool 'burn'")
        nameless = harness.run(env.step('<tool_call>\n{"arguments": {}}\n</tool_call>'))
        assert nameless.reward == FORMAT_ERROR_REWARD
        # a call inside the reasoning is not a call
        thought = harness.run(env.step("<think><tool_call>\n" + json.dumps(lend) + "\n</tool_call>"))
        assert thought.reward == FORMAT_ERROR_REWARD
        call = harness.run(env.step("<think>lend it</think>\n<tool_call>\n" + json.dumps(lend) + "\n</tool_call>"))
        assert call.observation == "Tool result:\n" + LENT + LENT_NOTICE and call.reward == 0.0
        assert not call.truncated
        # an array of calls in one block runs each, results in order
        both = harness.run(env.step("<tool_call>\n" + json.dumps([
            {"name": "find_book", "arguments": {"title": "Dune"}},
            {"name": "place_hold", "arguments": {"book_id": "B1"}}]) + "\n</tool_call>"))
        left = random.Random(1).randint(2, 4) - 1  # reset(seed=1)'s copies, one lent
        assert both.observation == (f"Tool result:\nB1: Dune ({left} copies)\n\nTool result:\nhold placed on B1"
                                    + HELD_NOTICE)
        done = harness.run(env.step("<answer>Done</answer>"))
        assert done.as_tuple() == ("Correct!", 1.0, True, False, {})
        truncating = harness.run(harness.service.open(BASE_ADVANCING, max_turns=2))
        try:
            harness.run(truncating.reset(seed=1))
            harness.run(truncating.step("no call"))
            assert harness.run(truncating.step("no call")).truncated  # turn_count reached max_turns
        finally:
            harness.run(truncating.close())
    finally:
        harness.run(env.close())


def test_base_class_in_process_defaults():
    class Tiny(ToolUseBaseEnv):
        def reset(self, seed=None):
            self._state = {"x": 0}
            self._tools = {"inc": {"description": "add one", "parameters": {"type": "object", "properties": {}}}}
            self._user_messages = ["Increment x.", "Increment x again."]
            self._message_criteria = [lambda s: s["x"] >= 1, lambda s: s["x"] >= 2]
            self._current_msg = 0
            return "Increment x."

        def tool_inc(self):
            self._state["x"] += 1
            return {"x": self._state["x"]}  # a non-string result is turned into text

    env = Tiny()
    assert env.max_turns == 10 and env.turn_count == 0 and env._call_history == []
    assert env.get_tools()[0] == {"type": "function", "function": {
        "name": "inc", "description": "add one", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(NotImplementedError):  # the designer writes solution(), as released
        env.solution()
    assert env.close() is None
    # before the work: "done" is not accepted, and the feedback names the open step
    assert not env._check_answer("done")
    observation, reward, terminated, truncated, _ = env.step("<answer>done</answer>")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "step 1 of 2" in observation and '"Increment x."' in observation
    assert env.execute_tool("inc", {}) == {
        "output": '{"x": 1}\n\n[STEP 1 COMPLETE — NEW INSTRUCTION] Increment x again.', "returncode": 0}
    assert env._call_history == [{"name": "inc", "arguments": {}}]
    assert env.execute_tool("inc", "not a dict")["returncode"] == 1
    observation = env.step("<answer>done</answer>")[0]
    assert "step 2 of 2" in observation and '"Increment x again."' in observation
    assert env.execute_tool("inc", {})["output"] == '{"x": 2}\n\n[ALL STEPS COMPLETE] Submit <answer>done</answer>.'
    assert env.all_instructions_done() and env._advance_if_done() == ""
    # after every step: only "done" (case and space aside) is accepted
    assert not env._check_answer("finished") and not env._check_answer("42")
    assert env.step("<answer>all finished</answer>")[1:3] == (0.0, False)
    assert env._check_answer(" Done ")
    assert env.step("<answer>done</answer>")[1:3] == (1.0, True)


HOSTILE_TOOLS = [
    ("loops", "while True:\n    pass", ErrorKind.TIMEOUT),
    ("sleeps", "import time\ntime.sleep(60)", ErrorKind.TIMEOUT),
    ("allocates", "x = []\nwhile True:\n    x.append(bytearray(1 << 24))", ErrorKind.MEMORY_LIMIT),
    ("exits", "import sys\nsys.exit(3)", ErrorKind.EXIT_CALLED),
    ("os_exit", "import sys\nsys.modules['os']._exit(0)", ErrorKind.EXIT_CALLED),
    ("huge_output", "self._state['n'] = 1\nreturn 'x' * 10_000_000", ErrorKind.OUTPUT_TOO_LARGE),
    ("mutates_schema", "self._tools['ping']['description'] = 'changed'\nreturn 'ok'", ErrorKind.BAD_RETURN),
    ("adds_tool", "self._tools['extra'] = {'description': 'e', 'parameters': {}}\nreturn 'ok'",
     ErrorKind.BAD_RETURN),
]


@pytest.mark.parametrize("name,body,kind", HOSTILE_TOOLS, ids=[c[0] for c in HOSTILE_TOOLS])
def test_hostile_tool_is_classified(harness, name, body, kind):
    env = harness.run(harness.service.open(tool_env(body)))
    try:
        harness.run(env.reset(seed=0))
        with pytest.raises(EnvFault) as caught:
            harness.run(env.call_tool("ping", {}))
        assert not isinstance(caught.value, InfrastructureFault)
        assert caught.value.error.kind is kind, caught.value.error
        assert caught.value.error.stage is Stage.STEP
        with pytest.raises(EnvFault):  # the environment is dead afterwards
            harness.run(env.call_tool("ping", {}))
    finally:
        harness.run(env.close())
    assert_next_env_works(harness)


def test_raising_and_non_string_tools_are_observations(harness):
    raising = harness.run(harness.service.open(tool_env("raise KeyError('order 9')")))
    try:
        harness.run(raising.reset())
        result = harness.run(raising.call_tool("ping", {}))
        assert result.returncode == 1 and "KeyError" in result.output and "order 9" in result.output
    finally:
        harness.run(raising.close())
    odd = harness.run(harness.service.open(tool_env("self._state['n'] = 1\nreturn [1, {'a': None}]")))
    try:
        harness.run(odd.reset())
        result = harness.run(odd.call_tool("ping", {}))
        assert (result.output, result.returncode, result.advanced) == (
            '[1, {"a": null}]\n\n[ALL STEPS COMPLETE] Submit <answer>done</answer>.', 0, 1)
    finally:
        harness.run(odd.close())


def test_the_sandbox_appends_the_notice_after_an_execute_tool_of_its_own(harness):
    own = ("\n    def execute_tool(self, name, arguments):\n"
           "        return {'output': getattr(self, 'tool_' + name)(**arguments), 'returncode': 0}\n")
    env = harness.run(harness.service.open(tool_env("self._state['n'] = 1\nreturn 'ok'") + own))
    try:
        harness.run(env.reset())
        result = harness.run(env.call_tool("ping", {}))
        assert result.output == "ok\n\n[ALL STEPS COMPLETE] Submit <answer>done</answer>." and result.advanced == 1
    finally:
        harness.run(env.close())
    # an _advance_if_done of an older contract that returns nothing: the step advances, no text added
    silent = "\n    def _advance_if_done(self):\n        self._current_msg = 1\n"
    env = harness.run(harness.service.open(tool_env("self._state['n'] = 1\nreturn 'ok'") + silent))
    try:
        harness.run(env.reset())
        result = harness.run(env.call_tool("ping", {}))
        assert (result.output, result.advanced, result.progress.all_done) == ("ok", 1, True)
    finally:
        harness.run(env.close())


def test_overridden_execute_tool_with_wrong_shape(harness):
    source = tool_env("return 'ok'") + "\n    def execute_tool(self, name, arguments):\n        return 42\n"
    env = harness.run(harness.service.open(source))
    try:
        harness.run(env.reset())
        with pytest.raises(EnvFault) as caught:
            harness.run(env.call_tool("ping", {}))
        assert caught.value.error.kind is ErrorKind.BAD_RETURN
    finally:
        harness.run(env.close())


@pytest.mark.parametrize("tools", ["[1, 2]", "{'ping': {'description': object()}}", "{'': {'description': 'x'}}"])
def test_bad_schemas_fail_at_reset(harness, tools):
    env = harness.run(harness.service.open(tool_env("return 'ok'", tools=tools)))
    try:
        with pytest.raises(EnvFault) as caught:
            harness.run(env.reset())
        assert caught.value.error.kind in (ErrorKind.BAD_RETURN, ErrorKind.RESET_ERROR, ErrorKind.NOT_SERIALIZABLE)
        assert caught.value.error.stage is Stage.RESET
    finally:
        harness.run(env.close())
    assert_next_env_works(harness)


def test_tool_ops_on_a_game_and_before_reset_are_protocol_errors(harness):
    game = "class G" + "Env:\n    def reset(self, seed=None):\n        return 's', {}\n" \
           "    def step(self, a):\n        return 'o', 0.0, False, False, {}\n"
    env = harness.run(harness.service.open(game))
    try:
        assert env.tool_use is False
        harness.run(env.reset())
        with pytest.raises(EnvFault) as caught:
            harness.run(env.tools())
        assert caught.value.error.kind is ErrorKind.PROTOCOL_ERROR
    finally:
        harness.run(env.close())


def test_criteria_report_raising_criteria(harness):
    source = tool_env("return 'ok'").replace('lambda s: s["n"] > 0', 'lambda s: s["missing"] > 0')
    env = harness.run(harness.service.open(source))
    try:
        harness.run(env.reset())
        result = harness.run(env.criteria())
        assert result.criteria[0].value is None and "KeyError" in result.criteria[0].error
    finally:
        harness.run(env.close())


def assert_next_env_works(harness, tries: int = 3) -> None:
    """A benign environment works after a hostile one. Under QUICK's 2-3 s limits a loaded CI
    machine can stall one benign call past them, so a timeout (only) is tried again; any other
    fault, a wrong answer, or a timeout on every try fails."""
    for attempt in range(1, tries + 1):
        env = None
        try:
            env = harness.run(harness.service.open(PAPER_STYLE))
            harness.run(env.reset(seed=0))
            assert harness.run(env.call_tool("find_book", {"title": "Dune"})).returncode == 0
            break
        except EnvFault as exc:
            if exc.error.kind is not ErrorKind.TIMEOUT or attempt == tries:
                raise
        finally:
            if env is not None:
                with contextlib.suppress(EnvFault):  # a timed-out environment is already gone
                    harness.run(env.close())
    assert harness.service.running
