"""Constrained decoding through the real ``openai`` client against a real ``spade serve``
subprocess (test_serve's server: a tiny random Qwen3 with a Qwen3-layout tool template):
``response_format`` json_object / json_schema and ``tool_choice`` required / named, decoded with
xgrammar's masks in the hf engine. A random-weight model writes no JSON by itself (checked: the
same requests without the constraint do not parse), so every parse below is the grammar's doing.
Each output is checked with ``json.loads`` and validated with ``jsonschema`` against the schema.

Free strings run long in a random model's hands (the tool calls' ``city`` has one); the schema
below keeps to enums, bounded integers and a bounded array so the file stays fast. Schemas avoid
``maxLength`` on strings: xgrammar 0.2.7's bounded-length string rule lets control
characters and byte sequences that are not UTF-8 through (seen with this random model), so such
outputs can fail ``json.loads``; SGLang, which uses the same xgrammar, shares that.
"""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from test_serve import HELLO, MODEL_NAME, WEATHER, client, model_dir, server  # noqa: F401

import openai  # noqa: E402

pytestmark = pytest.mark.timeout(240)

SEEDS = (0, 1, 2)
PERSON = {
    "type": "object",
    "properties": {
        "name": {"enum": ["ann", "bo"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["cat", "dog", "bird"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
STRICT_WEATHER = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Time in a zone", "strict": True,
    "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
                   "required": ["zone"], "additionalProperties": False}}}


def _ask(client, seed, max_tokens=900, **extra):  # noqa: F811
    return client.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=max_tokens,
                                          temperature=1.0, seed=seed, **extra).choices[0]


def _parses(text) -> bool:
    try:
        json.loads(text)
        return True
    except (TypeError, ValueError):
        return False


def test_unconstrained_output_is_not_json(client):  # noqa: F811
    assert not any(_parses(_ask(client, seed, max_tokens=60).message.content) for seed in SEEDS)


def test_json_object(client):  # noqa: F811
    for seed in SEEDS:
        choice = _ask(client, seed, response_format={"type": "json_object"})
        assert choice.finish_reason == "stop"
        assert isinstance(json.loads(choice.message.content), dict)


def test_json_schema(client):  # noqa: F811
    format_ = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for seed in SEEDS:
        choice = _ask(client, seed, response_format=format_)
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_top_logprobs_of_a_constrained_reply_leave_masked_tokens_out(client):  # noqa: F811
    format_ = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    choice = _ask(client, 1, response_format=format_, logprobs=True, top_logprobs=20)
    jsonschema.validate(json.loads(choice.message.content), PERSON)
    entries = choice.logprobs.content
    assert entries and all(len(e.top_logprobs) <= 20 for e in entries)
    # the log-probs are those of the masked distribution: finite, and a step the grammar forces
    # (one allowed token) has that token alone, at log-prob 0
    assert all(math.isfinite(t.logprob) for e in entries for t in e.top_logprobs)
    assert any(len(e.top_logprobs) == 1 and e.logprob == pytest.approx(0.0, abs=1e-5) for e in entries)


def test_json_schema_streamed_equals_the_whole_reply(client):  # noqa: F811
    format_ = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    whole = _ask(client, 5, response_format=format_).message.content
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=900,
                                                 temperature=1.0, seed=5, response_format=format_,
                                                 stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole
    jsonschema.validate(json.loads(streamed), PERSON)


def test_completions_response_format(client):  # noqa: F811
    for seed in SEEDS:
        choice = client.completions.create(model=MODEL_NAME, prompt="the cat", max_tokens=900, seed=seed,
                                           extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                               "name": "person", "schema": PERSON}}}).choices[0]
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.text), PERSON)


def _check_calls(choice, tools, only=None):
    """Calls of the given tools (``only``: that one), whose arguments are JSON, and follow the
    tool's ``parameters`` when it is strict (SGLang's rule: a tool that is not strict gets any JSON)."""
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls
    functions = {t["function"]["name"]: t["function"] for t in tools}
    for call in calls:
        assert call.function.name in functions if only is None else call.function.name == only
        arguments = json.loads(call.function.arguments)
        if functions[call.function.name].get("strict"):
            jsonschema.validate(arguments, functions[call.function.name]["parameters"])
    return calls


def test_tool_choice_required(client):  # noqa: F811
    tools = [STRICT_WEATHER, TIME]
    for seed in SEEDS:
        calls = _check_calls(_ask(client, seed, tools=tools, tool_choice="required",
                                  parallel_tool_calls=False), tools)
        assert len(calls) == 1
    _check_calls(_ask(client, 7, tools=tools, tool_choice="required"), tools)  # one or more calls
    _check_calls(_ask(client, 8, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False),
                 [WEATHER])  # not strict: any JSON as arguments


def test_tool_choice_named(client):  # noqa: F811
    tools = [STRICT_WEATHER, TIME]
    for seed in SEEDS:
        choice = _ask(client, seed, tools=tools, parallel_tool_calls=False,
                      tool_choice={"type": "function", "function": {"name": "get_time"}})
        _check_calls(choice, tools, only="get_time")


@pytest.mark.parametrize("extra, param", [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
     "response_format.json_schema.schema"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}),
     "response_format.json_schema.schema"),
    (dict(response_format={"type": "xml"}), "response_format"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
     "response_format.json_schema.schema"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice.function.name"),
    (dict(tool_choice="required"), "tool_choice"),
])
def test_bad_constraints_are_refused(client, extra, param):  # noqa: F811
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(client, 0, **extra)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param


def test_tool_choice_required_streamed(client):  # noqa: F811
    tools = [STRICT_WEATHER, TIME]
    args = dict(model=MODEL_NAME, messages=HELLO, max_tokens=900, temperature=1.0, seed=4, tools=tools,
                tool_choice="required", parallel_tool_calls=False)
    whole = client.chat.completions.create(**args).choices[0]
    chunks = list(client.chat.completions.create(stream=True, **args))
    calls = [c for chunk in chunks if chunk.choices and chunk.choices[0].delta.tool_calls
             for c in chunk.choices[0].delta.tool_calls]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls]
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason == "tool_calls"


def test_a_grammar_that_does_not_compile_fails_its_request_only(model_dir):  # noqa: F811
    import asyncio

    from spade.rollout.engine import Constraint, GenerationRequest, SamplingParams
    from spade.rollout.hf.engine import HFEngine

    engine = HFEngine(str(model_dir), max_batch_size=4, batch_wait_ms=50)
    good = GenerationRequest((5, 6, 7), SamplingParams(max_new_tokens=300, seed=1, constraint=Constraint(
        "ebnf", 'root ::= "yes" | "no"')))
    bad = GenerationRequest((5, 6, 7), SamplingParams(max_new_tokens=8, constraint=Constraint(
        "ebnf", "root ::= undefined_rule")))

    async def run():
        return await asyncio.gather(engine.generate(good), engine.generate(bad), return_exceptions=True)

    try:
        done, failed = asyncio.run(run())
    finally:
        engine.close()
    assert isinstance(failed, Exception)
    assert engine.tokenizer.decode(done.token_ids, skip_special_tokens=True) in ("yes", "no")
    assert done.finish_reason == "stop"


def test_a_reply_that_would_open_inside_the_reasoning_is_not_constrained():
    """Refused before generation, so a scripted engine (test_serve_reasoning's) serves: the
    template's generation prompt opens <think> (Qwen3-Thinking-2507), and a grammar from the first
    token would forbid the reasoning."""
    from chat_templates import bpe_tokenizer
    from spade.serve.server import BackgroundServer
    from spade.serve.service import ModelService
    from test_serve_reasoning import INSIDE, OPENS_THINK, ReplyEngine

    tokenizer = bpe_tokenizer(OPENS_THINK)
    engine = ReplyEngine(tokenizer, INSIDE)
    service = ModelService(engine, tokenizer, MODEL_NAME, max_context_tokens=1024,
                           eos_token_ids=[tokenizer.eos_token_id])
    with BackgroundServer(service) as server:
        thinking = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30)
        with pytest.raises(openai.BadRequestError) as caught:
            _ask(thinking, 0, response_format={"type": "json_object"})
        assert caught.value.body["param"] == "response_format"
        assert "enable_thinking" in caught.value.body["message"]
        plain = _ask(thinking, 0)  # unconstrained, the same request is served
    assert plain.message.content and not engine.requests[0].sampling.constraint
