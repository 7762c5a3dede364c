"""A tool call written inside the reasoning is not a call (issue 45): every reader of tool calls
reads the answer left by the reasoning split (``spade.agent.reasoning``), including reasoning that
does not open the reply (``"\\n<think>"``, text before the tag), which used to stay in ``content``
and have its calls read. The readers: an agent's tool-use turn (``read_tool_turn``, training and
``spade env``), ``spade serve``'s chat message (``protocol.chat_choice``) and its stream
(``streaming.ChatChoiceStream``)."""

from __future__ import annotations

import json
import random

import pytest

from spade.agent.reasoning import split
from spade.agent.tool_calls import Qwen3ToolCallParser
from spade.envs.tool_use.replies import read_tool_turn
from spade.serve import protocol
from spade.serve.streaming import ChatChoiceStream

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}]
OSLO = '<tool_call>\n{"name": "lookup", "arguments": {"q": "Oslo"}}\n</tool_call>'
PARIS = '<tool_call>\n{"name": "lookup", "arguments": {"q": "Paris"}}\n</tool_call>'
THOUGHT = "Maybe " + OSLO + " first? No, Paris."

# (reply, the prompt opened <think>, the calls it makes)
REPLIES = [
    ("\n<think>" + THOUGHT + "</think>\n\nOn it.", False, []),
    (" <think>" + THOUGHT + "</think>\n\n" + PARIS, False, ["Paris"]),
    ("Let me check. <think>" + THOUGHT + "</think>\n\n" + PARIS, False, ["Paris"]),
    ("<think>" + THOUGHT + "</think>\n\n" + PARIS, False, ["Paris"]),
    (THOUGHT + "\n</think>\n\n" + PARIS, True, ["Paris"]),  # the template opened <think>
    ("\n\n<think>" + THOUGHT, False, []),  # cut inside the reasoning (SGLang would call Oslo here)
    (OSLO, False, ["Oslo"]),  # no reasoning at all
]


def _cities(calls) -> list[str]:
    return [c.arguments["q"] for c in calls]


@pytest.mark.parametrize("text,inside,cities", REPLIES)
def test_an_agent_turn_reads_calls_from_the_answer_only(text, inside, cities):
    turn = read_tool_turn(text, Qwen3ToolCallParser(), TOOLS, inside_reasoning=inside)
    assert _cities(turn.calls) == cities
    assert turn.kind == ("calls" if cities else "format_error")


def _served_cities(calls: list[dict]) -> list[str]:
    return [json.loads(c["function"]["arguments"])["q"] for c in calls]


@pytest.mark.parametrize("text,inside,cities", REPLIES)
def test_served_message_and_stream_carry_no_call_from_the_reasoning(text, inside, cities):
    reading = split(text, inside=inside)
    choice = protocol.chat_choice(0, text, "stop", parse_tools=True, tools=TOOLS, reasoning=reading)
    assert _served_cities(choice["message"].get("tool_calls") or []) == cities
    assert choice["finish_reason"] == ("tool_calls" if cities else "stop")
    if "<think>" in text or inside:
        assert "Oslo" in choice["message"]["reasoning_content"]
    rng = random.Random(45)
    for _ in range(20):
        cuts = sorted(rng.choices(range(len(text) + 1), k=rng.randint(1, 12)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        stream = ChatChoiceStream(inside=inside, parse_tools=True, tools=TOOLS, new_call_id=lambda: "call_1")
        deltas = [stream.push(p, final=k == len(pieces) - 1) for k, p in enumerate(pieces)]
        assert "".join(d.reasoning for d in deltas) == (reading.reasoning or ""), pieces
        assert _served_cities([c for d in deltas for c in d.calls]) == cities, pieces


def test_the_sandboxed_tool_base_sets_reasoning_aside_as_the_runner_does():
    """``ToolUseBaseEnv.step`` runs inside the sandbox, where spade cannot be imported: its own
    reader must give the answer ``reasoning.split`` gives (a ``<think>`` anywhere opens reasoning)."""
    from spade.agent.reasoning import split
    from spade.envs.sandbox.runtime.tool_base import _answer_part

    replies = ["plain <tool_call>x</tool_call>", "<think>a</think>b", "<think><think>a</think>b", "\n<think>a</think>b",
               " x<think>a</think>b", "<think>never closed <tool_call>y</tool_call>", "a</think>b", "", "<think>"]
    for reply in replies:
        assert _answer_part(reply) == split(reply, inside=False).answer, reply
