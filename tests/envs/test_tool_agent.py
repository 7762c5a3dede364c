"""The agent's tool protocol: the Qwen3 parser against calls rendered by the real Qwen3 chat
templates (tests/fixtures), the parser chosen by chat format, and a tool episode through the real
sandbox whose token sequence is built by template deltas (tools in ``tools=``, grouped results in
one delta) and equals the full rendering."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from chat_templates import CHATML, bpe_tokenizer
from conftest import make_harness
from spade.envs.tool_use.replies import read_tool_turn
from spade.agent.tool_calls import Qwen3ToolCallParser, UnknownToolFormat, parser_for_template
from spade.envs.runner import EndReason, play_tool_episode
from spade.envs.tool_use import FORMAT_ERROR_REWARD
from spade.envs.tool_use.local import EXAMPLES_DIR, load_trusted, scripted_calls
from spade.rollout.conversation import ChatFormat
from spade.rollout.engine import GenerationResult, SamplingParams
from spade.selfplay.plays.policy import EnginePolicy

FIXTURES = Path(__file__).parents[1] / "fixtures"
TEMPLATES = {"qwen3_hybrid": (FIXTURES / "qwen3_hybrid.jinja").read_text(),
             "qwen3_thinking_2507": (FIXTURES / "qwen3_thinking_2507.jinja").read_text()}
TOOLS = [{"type": "function", "function": {"name": "set_mode", "description": "Set the mode.", "parameters": {
    "type": "object", "properties": {"mode": {"type": "string", "enum": ["a", "b"]}, "level": {"type": "integer"}},
    "required": ["mode"]}}}]

GET_ORDER = {"type": "function", "function": {"name": "get_order", "parameters": {
    "type": "object", "properties": {"order_id": {"type": "string"}, "note": {"type": "string"}}}}}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_parser_reads_calls_rendered_by_the_real_template(name):
    tokenizer = bpe_tokenizer(TEMPLATES[name])
    calls = [{"name": "set_mode", "arguments": {"mode": "b", "level": 3}},
             {"name": "get_order", "arguments": {"order_id": "O12", "note": "ünïcode \"quoted\""}}]
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": "Working on it.",
                 "tool_calls": [{"type": "function", "function": c} for c in calls]}]
    head = tokenizer.apply_chat_template(messages[:1], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert "<tools>" in head and '"set_mode"' in head
    reply = full[full.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"):].split("<|im_end|>")[0]
    parser = parser_for_template(tokenizer.chat_template)
    assert isinstance(parser, Qwen3ToolCallParser)
    # SGLang's qwen25 detector returns only calls to the request's tools, so get_order is one
    parsed = parser.parse(reply, TOOLS + [GET_ORDER])
    assert [(c.name, c.arguments) for c in parsed.calls] == [(c["name"], c["arguments"]) for c in calls]
    assert parsed.errors == () and "Working on it." in parsed.content
    turn = read_tool_turn(reply, parser, TOOLS + [GET_ORDER])
    assert turn.kind == "calls" and len(turn.calls) == 2


def test_xml_form_and_answers_and_format_errors():
    parser = Qwen3ToolCallParser()
    xml = "<tool_call>\n<function=set_mode>\n<parameter=mode>\nb\n</parameter>\n<parameter=level>\n2\n" \
          "</parameter>\n</function>\n</tool_call>"
    turn = read_tool_turn("<think>plan</think>" + xml, parser, TOOLS)
    assert turn.kind == "calls" and (turn.calls[0].name, turn.calls[0].arguments) == ("set_mode",
                                                                                      {"mode": "b", "level": 2})
    assert read_tool_turn("All set. <answer>done</answer>", parser).answer == "done"
    assert read_tool_turn("I think I am finished", parser).kind == "format_error"
    bad = read_tool_turn('<tool_call>\n{"name": "set_mode", "arguments": {oops}}\n</tool_call>', parser)
    assert bad.malformed and "not valid JSON" in bad.errors[0].message
    with pytest.raises(UnknownToolFormat):
        parser_for_template(CHATML)


class ScriptedEngine:
    """Stands in for the model only: each reply is the tokenisation of a scripted text plus
    ``<|im_end|>`` (finish "stop")."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.prompts = tokenizer, list(replies), []

    async def generate(self, request):
        self.prompts.append(request.prompt_ids)
        text = self.replies.pop(0)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.convert_tokens_to_ids(
            "<|im_end|>")]
        return GenerationResult(token_ids=tuple(ids), logprobs=tuple(-0.5 for _ in ids), finish_reason="stop",
                                weight_version=0)


def call_text(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def harness():
    h = make_harness()
    yield h
    h.close()


@pytest.mark.parametrize("mask", [True, False])
def test_tool_episode_token_exact_through_the_sandbox(harness, mask):
    source = (EXAMPLES_DIR / "smart_home.py").read_text()
    calls = scripted_calls(source, 5)
    tokenizer = bpe_tokenizer(TEMPLATES["qwen3_hybrid"])
    replies = ["I will look first.\n" + call_text(*calls[0]) + "\n" + call_text(*calls[1]),  # two calls, one turn
               "not a call",  # format error
               *[call_text(*c) for c in calls[2:]],
               "<answer>done</answer>"]
    engine = ScriptedEngine(tokenizer, replies)
    policy = EnginePolicy(engine, tokenizer, SamplingParams(max_new_tokens=256), max_context_tokens=16384,
                          chat_format=ChatFormat(tokenizer))
    env = harness.run(harness.service.open(source, max_turns=20))
    try:
        episode = harness.run(play_tool_episode(env, policy, parser=Qwen3ToolCallParser(), seed=5, max_turns=20,
                                                mask_malformed=mask))
    finally:
        harness.run(env.close())
    assert episode.end_reason is EndReason.TERMINATED and episode.episode_return == 1.0
    assert [t.reward for t in episode.turns] == [0.0, FORMAT_ERROR_REWARD, 0.0, 0.0, 0.0, 1.0]
    assert [c["name"] for c in episode.turns[0].tool_calls] == [calls[0][0], calls[1][0]]
    # the released orchestrator's conversation: no system message, the first instruction as the
    # only opening user turn; the next instruction ends the result of the call that completed
    # the current one (no user turn of its own); the only later user turn is the format error's
    roles = [m.role for m in episode.messages]
    assert roles == ["user", "assistant", "tool", "tool", "assistant", "user"] + ["assistant", "tool"] * 3 + \
        ["assistant"]
    env_here = load_trusted(source)()
    assert episode.messages[0].content == env_here.reset(seed=5)[0]
    instructions = env_here._user_messages
    tool_texts = [m.content for m in episode.messages if m.role == "tool"]
    notices = [f"\n\n[STEP {n} COMPLETE — NEW INSTRUCTION] {instructions[n]}" for n in range(1, len(instructions))]
    notices.append("\n\n[ALL STEPS COMPLETE] Submit <answer>done</answer>.")
    everything = "".join(m.content for m in episode.messages)
    for notice in notices:
        assert everything.count(notice) == 1, notice
        assert any(text.endswith(notice) for text in tool_texts), notice
    assert tool_texts[-1].endswith(notices[-1])
    assert episode.messages[5].content.startswith("Format error")
    conversation = policy.conversation
    # everything before the last reply equals the template's full rendering (the template itself
    # rewrites a final assistant turn, adding an empty think block: that is why deltas are appended)
    rendered = tokenizer.apply_chat_template([m.to_dict() for m in episode.messages[:-1]],
                                             tools=harness.run(_tools(harness, source)), tokenize=False,
                                             add_generation_prompt=True)
    expected = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    last = tokenizer(replies[-1], add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert conversation.token_ids == expected + last
    assert list(engine.prompts[-1]) == expected
    masked_turn = conversation.loss_mask.count(1)
    total_generated = sum(len(tokenizer(r, add_special_tokens=False)["input_ids"]) + 1 for r in replies)
    format_error_tokens = len(tokenizer("not a call", add_special_tokens=False)["input_ids"]) + 1
    assert masked_turn == total_generated - (format_error_tokens if mask else 0)


async def _tools(harness, source):
    env = await harness.service.open(source)
    try:
        await env.reset(seed=5)
        return (await env.tools()).tools
    finally:
        await env.close()


def test_early_answer_names_the_open_step_and_hint_opens_the_episode(harness):
    source = (EXAMPLES_DIR / "smart_home.py").read_text()
    calls = scripted_calls(source, 2)
    instructions = load_trusted(source)()
    instructions.reset(seed=2)
    steps = instructions._user_messages
    seen = []

    async def policy(messages, tools=None):
        seen.append([m.role for m in messages])
        return replies.pop(0)

    replies = ["<answer>done</answer>", call_text(*calls[0]), call_text(*calls[1]), "<answer>done</answer>"]
    env = harness.run(harness.service.open(source, max_turns=20))
    try:
        episode = harness.run(play_tool_episode(env, policy, parser=Qwen3ToolCallParser(), seed=2, max_turns=4,
                                                hint="thermostat first"))
    finally:
        harness.run(env.close())
    assert seen[0] == ["user"]  # no system message
    assert episode.messages[0].content == f"{steps[0]}\n\nHINT: thermostat first"  # released hint_injection_template
    early, late = episode.turns[0], episode.turns[3]
    assert (early.reward, early.terminated) == (0.0, False)
    assert f"step 1 of {len(steps)}" in early.observation and steps[0] in early.observation
    assert episode.messages[2].role == "user" and episode.messages[2].content == early.observation
    # calls[1] completed step 1: the answer now names step 2
    assert f"step 2 of {len(steps)}" in late.observation and steps[1] in late.observation
    assert episode.end_reason is EndReason.TURN_BUDGET and episode.episode_return == 0.0
