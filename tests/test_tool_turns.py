"""How one agent reply is read in a tool-use episode (issue 29, "Reading a reply"): the valid calls
of a reply run even beside a malformed block, an answer is checked before calls (the released
``ToolUseBaseEnv.step`` searches ``<answer>`` first), and calls inside the reasoning are not calls
(SGLang's qwen3 reasoning rules, ``spade.serve.reasoning``)."""

from __future__ import annotations

from spade.envs.tool_use.replies import read_tool_turn
from spade.agent.tool_calls import Qwen3ToolCallParser, ToolCall

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}]
PARSER = Qwen3ToolCallParser()
GOOD = '<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call>'
BROKEN = '<tool_call>\n{"name": "lookup", "arguments": {\n</tool_call>'


def test_a_malformed_block_beside_a_valid_call_does_not_spoil_the_turn():
    for reply in (BROKEN + "\n" + GOOD, GOOD + "\n" + BROKEN):
        turn = read_tool_turn(reply, PARSER, TOOLS)
        assert turn.kind == "calls" and turn.calls == (ToolCall("lookup", {"q": "x"}),)
        assert len(turn.errors) == 1 and "not valid JSON" in turn.errors[0].message


def test_format_error_only_when_no_call_parses():
    turn = read_tool_turn(BROKEN + "\n" + BROKEN, PARSER, TOOLS)
    assert turn.kind == "format_error" and len(turn.errors) == 2
    assert read_tool_turn("nothing to do", PARSER, TOOLS).kind == "format_error"


def test_an_answer_is_read_before_calls():
    turn = read_tool_turn(GOOD + "\n<answer>done</answer>", PARSER, TOOLS)
    assert turn.kind == "answer" and turn.answer == "done" and turn.calls == ()
    # the first answer counts, as re.search in the released step
    assert read_tool_turn("<answer>a</answer> <answer>b</answer>", PARSER, TOOLS).answer == "a"


def test_calls_and_answers_inside_reasoning_are_not_read():
    assert read_tool_turn("<think>try " + GOOD + "</think>\n\n" + GOOD, PARSER, TOOLS).calls == (
        ToolCall("lookup", {"q": "x"}),)
    # cut inside the reasoning: all of it is reasoning, nothing was called
    assert read_tool_turn("<think>maybe " + GOOD, PARSER, TOOLS).kind == "format_error"
    assert read_tool_turn("<think><answer>done</answer>", PARSER, TOOLS).kind == "format_error"
    # a template that pre-fills <think>: the reply starts inside the reasoning
    prefilled = "plan: " + GOOD + "\n</think>\n\n<answer>done</answer>"
    assert read_tool_turn(prefilled, PARSER, TOOLS, inside_reasoning=True).kind == "answer"
    assert read_tool_turn("plan: " + GOOD, PARSER, TOOLS, inside_reasoning=True).kind == "format_error"
