"""A tool call whose name is not one of the episode's tools, in training (issue 29).

The released orchestrator (spade-rl/spade c4e8fd8) parses a tool-use reply with its own parser,
which does not check names (``spare/core/utils/tool_call_parser.py:86-141``), runs every parsed
call through ``env.execute_tool`` (``spare/core/orchestrator.py:980-1010``), whose answer to an
unknown name is an error result, ``{"output": "Unknown tool '<name>'", "returncode": 1}``
(``spare/core/envs/tool_use_base_env.py:94-96``), sends that output back as the ``tool`` message
and records 0.0 for the turn (``orchestrator.py:1012``). The format-error branch, -0.1 and the
optional masking, is only taken when the parser returns no call at all (``orchestrator.py:933-978``).
So the expectation written out below: the unknown call runs, its tool message is the
environment's error, the turn's reward is 0.0 and the reply is not masked. SGLang's parser, used by
``spade serve`` and BFCL, keeps dropping the name (``unknown_tool_names="drop"``).
"""

from __future__ import annotations

import asyncio

import pytest

from spade.agent.tool_calls import Qwen3ToolCallParser, ToolCall
from spade.envs.runner import play_tool_episode
from spade.envs.tool_use.protocol import Progress, ToolResult, ToolSchemas
from spade.envs.tool_use.replies import UNKNOWN_TOOL_NAMES, read_tool_turn

LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}
TOOLS = [LOOKUP]
PARSER = Qwen3ToolCallParser()
UNKNOWN = '<tool_call>\n{"name": "burn", "arguments": {"what": "all"}}\n</tool_call>'
KNOWN = '<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call>'


def test_training_default_runs_a_call_to_an_unknown_name():
    turn = read_tool_turn(UNKNOWN, PARSER, TOOLS)
    assert turn.kind == "calls" and turn.calls == (ToolCall("burn", {"what": "all"}),)
    # beside a known call both run, in order
    both = read_tool_turn(UNKNOWN + "\n" + KNOWN, PARSER, TOOLS)
    assert [c.name for c in both.calls] == ["burn", "lookup"]
    # the XML form never checked names (qwen3_coder), in either setting
    xml = "<tool_call>\n<function=burn>\n<parameter=what>\nall\n</parameter>\n</function>\n</tool_call>"
    for setting in UNKNOWN_TOOL_NAMES:
        assert read_tool_turn(xml, PARSER, TOOLS, unknown_tool_names=setting).calls == (ToolCall("burn", {"what": "all"}),)


def test_sglang_setting_drops_the_name_and_the_turn_is_a_format_error():
    turn = read_tool_turn(UNKNOWN, PARSER, TOOLS, unknown_tool_names="drop")
    assert turn.kind == "format_error" and "not one of the tools" in turn.errors[0].message
    kept = read_tool_turn(UNKNOWN + "\n" + KNOWN, PARSER, TOOLS, unknown_tool_names="drop")
    assert kept.calls == (ToolCall("lookup", {"q": "x"}),)


def test_unknown_setting_is_refused_with_the_allowed_values():
    with pytest.raises(ValueError, match="unknown_tool_names.*execute.*drop"):
        read_tool_turn(UNKNOWN, PARSER, TOOLS, unknown_tool_names="keep")


class _Env:
    """A tool environment that answers an unknown name as the released ``execute_tool`` does."""

    max_turns = 2

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.progress = Progress(0, 1, "do it", False)

    async def reset(self, seed=None):
        return type("Reset", (), {"observation": "do it"})()

    async def tools(self) -> ToolSchemas:
        return ToolSchemas(TOOLS, self.progress)

    async def call_tool(self, name, arguments) -> ToolResult:
        self.calls.append(name)
        if name != "lookup":
            return ToolResult(f"Unknown tool '{name}'", 1, self.progress)
        return ToolResult("found", 0, self.progress)


class _Policy:
    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.masked = 0

    async def __call__(self, messages, tools=None) -> str:
        return self.replies.pop(0)

    def mask_last_turn(self) -> None:
        self.masked += 1


def test_episode_answers_an_unknown_name_with_the_tool_error_and_reward_zero():
    env, policy = _Env(), _Policy([UNKNOWN, KNOWN])
    episode = asyncio.run(play_tool_episode(env, policy, parser=PARSER, max_turns=2))
    assert env.calls == ["burn", "lookup"]
    first = episode.turns[0]
    assert first.reward == 0.0 and first.observation == "Unknown tool 'burn'"
    assert policy.masked == 0
    tool_messages = [m.content for m in episode.messages if m.role == "tool"]
    assert tool_messages == ["Unknown tool 'burn'", "found"]
