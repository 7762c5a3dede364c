"""No reply can crash a play (issue 45): malformed replies through the real episode runners
(``play_tool_episode``, ``play_episode``) against environments in the real sandbox (bubblewrap),
with a scripted policy that returns them.

A call the sandbox cannot take (``NaN``/``Infinity`` in JSON arguments, ``nan``/``inf`` for a
number-typed XML parameter, a set from the XML form's Python-literal fallback, nesting deeper than
a frame allows, a non-object) is reported like a malformed block and is not sent; a turn left with
no call is a format error. The environment is never blamed (no ``ENV_ERROR``) and the sandbox
service keeps running, since a frame the supervisor refuses would end every environment it serves.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spade.agent.tool_calls import Qwen3ToolCallParser
from spade.envs.runner import EndReason, StopEpisode, play_episode, play_tool_episode
from spade.envs.sandbox.runtime.tool_base import FORMAT_ERROR_MESSAGE, FORMAT_ERROR_REWARD
from spade.envs.tool_use.protocol import MAX_ARGUMENT_DEPTH, MAX_TOOL_NAME_CHARS
from spade.envs.tool_use.replies import UNKNOWN_TOOL_NAMES, read_tool_turn

pytestmark = pytest.mark.timeout(600)

PARSER = Qwen3ToolCallParser()
GAME = (Path(__file__).resolve().parents[2] / "examples" / "envs" / "hidden_sequence.py").read_text()

# every JSON-schema type a parameter can have, so the XML form types each value differently
TYPED_ENV = '''
class TypedEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        self.turn_count = 0
        self._call_history = []
        kinds = {"n": "number", "i": "integer", "o": "object", "a": "array", "b": "boolean", "s": "string"}
        self._tools = {"echo": {"description": "Echo typed values.", "parameters": {
            "type": "object", "properties": {k: {"type": v} for k, v in kinds.items()}}}}
        self._state = {"calls": 0}
        self._user_messages = ["Call echo twice.", "Then answer done."]
        self._message_criteria = [lambda s: s["calls"] >= 2, lambda s: True]
        self._current_msg = 0
        return self._user_messages[0], {}

    def tool_echo(self, **values):
        self._state["calls"] += 1
        return "echo " + " ".join(f"{k}={v}" for k, v in sorted(values.items()))
'''


def strict_text(text: str) -> bool:
    """Whether a tokenizer can take ``text``: strict UTF-8 (no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Scripted:
    """A policy that returns the given replies in order, then stops. Like the engine policy, it
    needs every prompt it is given to be text a tokenizer takes: while its own replies are (a real
    model's decoded text always is), a user or tool message that is not ends the play."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.masked = 0

    async def __call__(self, messages, tools=None):
        if all(strict_text(m.content) for m in messages if m.role == "assistant"):
            for message in messages:
                message.content.encode("utf-8")  # raises as the tokenizer would
        if not self.replies:
            raise StopEpisode("script done")
        return self.replies.pop(0)

    def mask_last_turn(self):
        self.masked += 1


def json_call(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def xml_call(parameter: str, value: str, name: str = "echo") -> str:
    return f"<tool_call>\n<function={name}>\n<parameter={parameter}>\n{value}\n</parameter>\n</function>\n</tool_call>"


# the TypedEnv's one tool as the sandbox offers it (OpenAI function format)
TOOLS = [{"type": "function", "function": {"name": "echo", "description": "Echo typed values.", "parameters": {
    "type": "object", "properties": {k: {"type": v} for k, v in
                                     {"n": "number", "i": "integer", "o": "object", "a": "array", "b": "boolean",
                                      "s": "string"}.items()}}}}]

GOOD = json_call('{"name": "echo", "arguments": {"s": "hi"}}')


def play_tool(sandbox, replies):
    async def go():
        env = await sandbox.service.open(TYPED_ENV, max_turns=len(replies) + 1)
        try:
            return await play_tool_episode(env, Scripted(replies), parser=PARSER, seed=0,
                                           max_turns=len(replies) + 1)
        finally:
            await env.close()
    return sandbox.run(go(), timeout=120)


def play_game(sandbox, replies):
    async def go():
        env = await sandbox.service.open(GAME, max_turns=len(replies) + 1)
        try:
            return await play_episode(env, Scripted(replies), seed=0, max_turns=len(replies) + 1)
        finally:
            await env.close()
    return sandbox.run(go(), timeout=120)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


UNSENDABLE = {
    "json NaN": json_call('{"name": "echo", "arguments": {"n": NaN}}'),
    "json Infinity": json_call('{"name": "echo", "arguments": {"n": -Infinity}}'),
    "json 1e999": json_call('{"name": "echo", "arguments": {"n": 1e999}}'),
    "xml nan": xml_call("n", "nan"),
    "xml inf": xml_call("n", "inf"),
    "xml set": xml_call("o", "{1, 2}"),
    "xml bytes": xml_call("a", "b'x'"),
    "xml complex": xml_call("o", "{'z': 1j}"),
    "too deep": json_call('{"name": "echo", "arguments": {"a": %s}}' % nested(MAX_ARGUMENT_DEPTH + 5)),
    "xml too deep": xml_call("a", nested(MAX_ARGUMENT_DEPTH + 5)),
    "list arguments": json_call('{"name": "echo", "arguments": [1, 2]}'),
    "long name": json_call(json.dumps({"name": "x" * (MAX_TOOL_NAME_CHARS + 1), "arguments": {}})),
    # "\ud800" is six ASCII characters a model can write; decoded, a lone surrogate the echo would return
    "json lone surrogate": json_call('{"name": "echo", "arguments": {"s": "a\\ud800b"}}'),
    "json lone surrogate key": json_call('{"name": "echo", "arguments": {"\\udc80": 1}}'),
    "json lone surrogate name": json_call('{"name": "\\udfff", "arguments": {}}'),
    "xml lone surrogate literal": xml_call("o", "{'k': '\\ud800'}"),
}


@pytest.mark.parametrize("case", sorted(UNSENDABLE))
def test_an_unsendable_call_is_a_format_error_for_its_turn(sandbox, case):
    episode = play_tool(sandbox, [UNSENDABLE[case], GOOD])
    assert episode.end_reason is EndReason.POLICY_STOPPED, (episode.end_reason, episode.error)
    first, second = episode.turns
    assert first.reward == FORMAT_ERROR_REWARD and first.observation.startswith(FORMAT_ERROR_MESSAGE)
    assert first.tool_calls == ()
    # the environment is unharmed: the next, valid call runs
    assert second.tool_calls and second.tool_calls[0]["returncode"] == 0
    assert sandbox.service.running


def test_a_sendable_call_beside_an_unsendable_one_still_runs(sandbox):
    episode = play_tool(sandbox, [UNSENDABLE["json NaN"] + "\n" + GOOD])
    (turn,) = episode.turns
    assert turn.reward == 0.0 and [c["name"] for c in turn.tool_calls] == ["echo"]
    assert json.loads(turn.action) == [{"name": "echo", "arguments": {"s": "hi"}}]


def test_an_answer_longer_than_the_sandbox_takes_is_a_format_error(sandbox):
    limit = sandbox.config.max_action_chars
    episode = play_tool(sandbox, ["<answer>" + "x" * limit + "</answer>", GOOD])
    assert episode.turns[0].reward == FORMAT_ERROR_REWARD
    assert "max_action_chars" in episode.turns[0].observation
    assert episode.turns[1].tool_calls[0]["returncode"] == 0


def test_a_game_action_longer_than_the_sandbox_takes_stops_the_episode(sandbox):
    limit = sandbox.config.max_action_chars
    episode = play_game(sandbox, ["reveal 2", "y" * (limit + 1)])
    assert len(episode.turns) == 1 and episode.end_reason is EndReason.POLICY_STOPPED
    assert "max_action_chars" in episode.stop_detail and episode.episode_return == 0.0
    assert sandbox.service.running


# -- generated replies ---------------------------------------------------------------------------

NAMES = st.sampled_from(["echo", "nope", "", "x" * 300])
PARAMETERS = st.sampled_from(["n", "i", "o", "a", "b", "s", "unknown"])
NUMBER_TEXT = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 5000,
                               "1" + "0" * 400, "0.5", "-0", "1e-400"])
LITERALS = st.sampled_from(["nan", "inf", "-inf", "{1, 2}", "{(1, 2): 3}", "b'x'", "1j", "(1,)", "...",
                            "None", "True", "{'a': {1}}", "frozenset()", "[1, [2, {3}]]", "'\\x00'",
                            "9" * 5000, "1e999", "{", "}", "null", "NULL"])
CONTROL = st.text(alphabet=st.characters(max_codepoint=0x1f) | st.sampled_from("\x00\ud800\udfff\ufffe\u2028"),
                  max_size=20)
TEXT = st.text(max_size=60) | CONTROL
ESCAPES = st.sampled_from(["\\ud800", "a\\udc80b", "\\udfff\\ud800", "\\u0000", "x\\u0000\\u001f",
                          "\\ud83d\\ude00", "\\ude00\\ud83d"])
STRAY = st.sampled_from(["<tool_call>", "</tool_call>", "<tool_call>\n", "\n</tool_call>", "<function=",
                         "<function=echo>", "</function>", "<parameter=", "<parameter=n>", "</parameter>",
                         "<answer>", "</answer>", "<think>", "</think>", "\\boxed{", "}", "{", "\\boxed{}"])


@st.composite
def json_bodies(draw) -> str:
    kind = draw(st.sampled_from(["number", "deep", "invalid", "value", "array", "escape"]))
    name = json.dumps(draw(NAMES))
    if kind == "number":
        return '{"name": %s, "arguments": {"%s": %s}}' % (name, draw(PARAMETERS), draw(NUMBER_TEXT))
    if kind == "escape":  # JSON escapes as a model writes them: lone or reversed surrogates, NUL
        escaped = '"%s"' % draw(ESCAPES)
        name = draw(st.sampled_from([name, escaped]))
        key, value = draw(st.sampled_from([('"s"', escaped), (escaped, "1"), (escaped, escaped)]))
        return '{"name": %s, "arguments": {%s: %s}}' % (name, key, value)
    if kind == "deep":
        depth = draw(st.sampled_from([MAX_ARGUMENT_DEPTH - 1, MAX_ARGUMENT_DEPTH + 1, 200, 5000]))
        return '{"name": %s, "arguments": {"a": %s}}' % (name, nested(depth))
    if kind == "invalid":
        good = '{"name": %s, "arguments": {"s": %s}}' % (name, json.dumps(draw(TEXT)))
        cut = draw(st.integers(0, len(good)))
        return good[:cut] + draw(TEXT) + good[cut:]
    if kind == "array":
        return json.dumps([{"name": draw(NAMES), "arguments": {}}, draw(st.integers() | st.text(max_size=5))])
    value = draw(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
                              lambda inner: st.lists(inner, max_size=3)
                              | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8))
    arguments = draw(st.sampled_from(["arguments", "parameters"]))
    return json.dumps({"name": draw(NAMES), arguments: value})  # floats: NaN / Infinity as Python writes them


@st.composite
def blocks(draw) -> str:
    kind = draw(st.sampled_from(["json", "xml", "stray", "text", "answer", "unclosed"]))
    if kind == "json":
        return json_call(draw(json_bodies()))
    if kind == "xml":
        value = draw(LITERALS | NUMBER_TEXT | TEXT | st.builds(nested, st.integers(1, 300)))
        return xml_call(draw(PARAMETERS), value, draw(NAMES))
    if kind == "stray":
        return draw(STRAY)
    if kind == "answer":
        return "<answer>" + draw(TEXT) + "</answer>"
    if kind == "unclosed":
        return "<tool_call>\n" + draw(json_bodies())
    return draw(TEXT)


@st.composite
def replies(draw) -> str:
    reply = "".join(draw(st.lists(blocks(), min_size=1, max_size=5)))
    if draw(st.integers(0, 9)) == 0:  # a very long reply
        reply = reply * 2000 + draw(TEXT) * 2000
    return reply


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(reply=replies() | st.text())
def test_every_call_read_from_a_reply_is_strict_json_and_strict_utf8(reply):
    """What reaches the sandbox (and, echoed by a tool, the next prompt) takes the strictest encoders:
    JSON without NaN/Infinity, UTF-8 without lone surrogates. Reading never raises."""
    for unknown in UNKNOWN_TOOL_NAMES:
        turn = read_tool_turn(reply, PARSER, TOOLS, unknown_tool_names=unknown)
        assert turn.kind in ("calls", "answer", "format_error")
        for call in turn.calls:
            call.name.encode("utf-8")
            json.dumps(call.arguments, allow_nan=False, ensure_ascii=False).encode("utf-8")
        for error in turn.errors:
            error.message.encode("utf-8")  # the format-error observation quotes these


def _check(sandbox, episode, played):
    assert episode.end_reason is not EndReason.ENV_ERROR, episode.error
    assert len(episode.turns) <= played
    assert sandbox.service.running


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                  HealthCheck.function_scoped_fixture])
@given(script=st.lists(replies(), min_size=1, max_size=3))
def test_generated_replies_never_end_a_tool_play(sandbox, script):
    episode = play_tool(sandbox, script)
    _check(sandbox, episode, len(script))
    for turn in episode.turns:
        assert turn.tool_calls or turn.action.startswith("<answer>") or turn.reward == FORMAT_ERROR_REWARD


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                  HealthCheck.function_scoped_fixture])
@given(script=st.lists(replies(), min_size=1, max_size=3))
def test_generated_replies_never_end_a_game_play(sandbox, script):
    episode = play_game(sandbox, script)
    _check(sandbox, episode, len(script))
    if episode.end_reason is EndReason.POLICY_STOPPED and episode.stop_detail != "script done":
        assert re.search("max_action_chars", episode.stop_detail)


def test_the_name_limit_is_the_supervisors():
    from spade.envs.sandbox import supervisor

    assert MAX_TOOL_NAME_CHARS == supervisor.MAX_TOOL_NAME_CHARS


# -- text an environment writes: the next prompt must stay tokenizable --------------------------------

SURROGATE_GAME = GAME.replace("return self._rules(), self._info()", "return self._rules() + chr(0xD800), self._info()")
SURROGATE_TOOL = TYPED_ENV.replace('return "echo " +', 'return chr(0xDC80) + "echo " +')


def test_an_environment_writing_a_lone_surrogate_is_at_fault_not_the_play(sandbox):
    """A lone surrogate in an observation or a tool result (``chr(0xD800)`` in the environment's code)
    would make the next prompt untokenizable: the sandbox refuses it as a bad return, the play ends
    with the environment's error, and admission rejects such a game at its smoke test."""
    from spade.envs.admission import admit

    assert "chr(0xD800)" in SURROGATE_GAME and "chr(0xDC80)" in SURROGATE_TOOL

    async def go(source, play, **kwargs):
        env = await sandbox.service.open(source, max_turns=3)
        try:
            return await play(env, Scripted([GOOD, GOOD]), seed=0, max_turns=3, **kwargs)
        finally:
            await env.close()

    for source, play, kwargs in ((SURROGATE_GAME, play_episode, {}),
                                 (SURROGATE_TOOL, play_tool_episode, {"parser": PARSER})):
        episode = sandbox.run(go(source, play, **kwargs), timeout=120)
        assert episode.end_reason is EndReason.ENV_ERROR and episode.error.kind.value == "bad_return"
        assert "lone surrogate" in episode.error.message
    verdict = sandbox.run(admit(sandbox.service, SURROGATE_GAME, seed=0), timeout=300)
    assert not verdict.admitted and verdict.error.kind.value == "bad_return", verdict.error
    assert sandbox.service.running
