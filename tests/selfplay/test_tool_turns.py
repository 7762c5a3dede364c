"""How one agent reply is read in a tool-use episode (issue 29, "Reading a reply"): the valid calls
of a reply run even beside a malformed block, an answer is checked before calls (the released
``ToolUseBaseEnv.step`` searches ``<answer>`` first), and calls inside the reasoning are not calls
(SGLang's qwen3 reasoning rules, ``spade.agent.reasoning``)."""

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


class _Env:
    """A tool environment stand-in: one tool, answers accepted."""

    max_turns = 4

    def __init__(self):
        self.called: list[str] = []

    async def reset(self, seed=None):
        return _Obs("do it")

    async def tools(self):
        from spade.envs.tool_use import Progress, ToolSchemas
        return ToolSchemas(TOOLS, Progress(0, 1, "do it", False))

    async def call_tool(self, name, arguments):
        from spade.envs.tool_use import Progress, ToolResult
        self.called.append(name)
        return ToolResult("ok", 0, Progress(0, 1, "do it", False))


class _Obs:
    def __init__(self, observation):
        self.observation = observation


class _Policy:
    def __init__(self, replies, opened):
        self.replies, self.prompt_opened_reasoning = list(replies), opened
        self.masked = 0

    async def __call__(self, messages, tools=None):
        if not self.replies:
            from spade.envs.runner import StopEpisode
            raise StopEpisode("done")
        return self.replies.pop(0)

    def mask_last_turn(self):
        self.masked += 1


def test_the_runner_reads_a_prefilled_think_as_reasoning():
    import asyncio

    from spade.envs.runner import play_tool_episode
    for opened, calls in ((False, ["lookup"]), (True, [])):
        env, policy = _Env(), _Policy(["plan: " + GOOD], opened)
        episode = asyncio.run(play_tool_episode(env, policy, parser=PARSER, seed=0, max_turns=4))
        assert env.called == calls
        assert policy.masked == (1 if opened else 0)
        assert episode.turns[0].reward == (-0.1 if opened else 0.0)


def test_the_engine_policy_knows_when_its_template_prefills_think():
    import asyncio

    from chat_templates import bpe_tokenizer
    from test_tool_agent import TEMPLATES, ScriptedEngine

    from spade.envs.runner import Message
    from spade.rollout.engine import SamplingParams
    from spade.selfplay.plays.policy import EnginePolicy
    for name, opened in (("qwen3_thinking_2507", True), ("qwen3_hybrid", False)):
        tokenizer = bpe_tokenizer(TEMPLATES[name])
        policy = EnginePolicy(ScriptedEngine(tokenizer, ["plan</think>\n\nhi"]), tokenizer,
                              SamplingParams(max_new_tokens=64), max_context_tokens=4096)
        asyncio.run(policy([Message("user", "go")], tools=TOOLS))
        assert policy.prompt_opened_reasoning is opened, name
