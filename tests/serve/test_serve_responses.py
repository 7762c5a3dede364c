"""``spade serve``'s ``/v1/responses`` through the real ``openai`` client (``client.responses``).

The real tiny Qwen3 of ``test_serve`` (hf engine, ``BackgroundServer``) answers plain requests: the
Responses answer must equal the chat endpoint's for the same greedy request (the text, the usage,
the prompt: ``input_tokens`` against the chat template rendered here with ``instructions`` as the
system turn), and a stream's deltas must add up to it. A random tiny model does not call tools on
demand, so tool calls, multi-turn tool use and reasoning run on the scripted engines of
``test_serve`` / ``test_serve_reasoning`` (they reply with a given text; the HTTP server, the
service and the client are real). Every response and every stream event is validated against the
openai package's own pydantic types (``Response``, ``ResponseStreamEvent``), which are the
reference for the shapes.
"""

from __future__ import annotations

import json

import pytest

from spade.rollout.engine import GenerationChunk

from test_serve import CALL_TEXT, HELLO, MODEL_NAME, TOOLS_TEMPLATE, WEATHER, model_dir, server  # noqa: F401
from test_serve_reasoning import FULL, HYBRID, REASONING, ANSWER, ReplyEngine

import openai  # noqa: E402
from openai.types.responses import Response, ResponseStreamEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

pytestmark = pytest.mark.timeout(180)

EVENT = TypeAdapter(ResponseStreamEvent)
FLAT_WEATHER = {"type": "function", **WEATHER["function"]}  # the Responses API's tool shape


@pytest.fixture(scope="module")
def served(model_dir):  # noqa: F811 - the fixture imported above
    from spade.cli.serve import ServeOptions, build_service
    from spade.serve.server import BackgroundServer

    service = build_service(ServeOptions(model=str(model_dir), served_model_name=MODEL_NAME,
                                         max_batch_size=4))
    with BackgroundServer(service) as server:
        yield server


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture()
def scripted():
    """``start(text, template)``: a client of a server whose engine replies ``text``."""
    from chat_templates import bpe_tokenizer
    from spade.serve.server import BackgroundServer
    from spade.serve.service import ModelService

    servers = []

    def start(text: str, template: str = TOOLS_TEMPLATE, **options):
        tokenizer = bpe_tokenizer(template)
        engine = ReplyEngine(tokenizer, text)
        service = ModelService(engine, tokenizer, MODEL_NAME, max_context_tokens=1024,
                               eos_token_ids=[tokenizer.eos_token_id], **options)
        server = BackgroundServer(service).start()
        servers.append(server)
        return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30), engine

    yield start
    for server in servers:
        server.close()


def _raw(client, **body):
    """The response JSON, validated against openai's ``Response`` type."""
    reply = client.responses.with_raw_response.create(**body)
    data = json.loads(reply.text)
    Response.model_validate(data)
    return data


def _events(client, **body):
    """The stream's events as JSON, each validated against openai's ``ResponseStreamEvent``."""
    with client.responses.with_streaming_response.create(stream=True, **body) as reply:
        lines = [line for line in reply.iter_lines()]
    events = []
    for kind, data in zip(lines[0::3], lines[1::3]):  # "event: T", "data: {...}", ""
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        EVENT.validate_python(event)
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_text_equals_the_chat_endpoint(client):
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "system", "content": "Be brief."}, *HELLO],
        temperature=0, max_tokens=12)
    reply = client.responses.create(model=MODEL_NAME, instructions="Be brief.", input="hello",
                                    temperature=0, max_output_tokens=12)
    assert chat.choices[0].finish_reason == "length"  # this model and prompt: no EOS in 12 tokens
    assert reply.output_text == chat.choices[0].message.content
    assert reply.usage.input_tokens == chat.usage.prompt_tokens
    assert reply.usage.output_tokens == chat.usage.completion_tokens == 12
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.instructions == "Be brief." and reply.max_output_tokens == 12
    (message,) = reply.output
    assert message.type == "message" and message.role == "assistant" and message.status == "incomplete"
    assert reply.id.startswith("resp_") and message.id.startswith("msg_")


def test_input_items_render_like_chat_messages(client, model_dir):  # noqa: F811
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hel"},
                                                             {"type": "input_text", "text": "lo"}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
             {"role": "user", "content": "again"}]
    data = _raw(client, model=MODEL_NAME, input=items, max_output_tokens=3, temperature=0)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "hi"}, {"role": "user", "content": "again"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert data["usage"]["input_tokens"] == len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert data["usage"]["total_tokens"] == data["usage"]["input_tokens"] + data["usage"]["output_tokens"]


def test_stream_adds_up_to_the_response(client):
    body = dict(model=MODEL_NAME, input="hello", temperature=0, max_output_tokens=10)
    whole = _raw(client, **body)
    events = _events(client, **body)
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert text == whole["output"][0]["content"][0]["text"] == final["output"][0]["content"][0]["text"]
    assert events[-4]["text"] == text
    assert final["usage"] == whole["usage"] and final["status"] == "incomplete"
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    # the SDK's typed stream reads the same events (its stream helper's get_final_response wants
    # response.completed, which OpenAI's API, like this server, does not send for a cut reply)
    # (how many deltas depends on how the engine's steps reach the stream, so not compared)
    typed = list(client.responses.create(stream=True, **body))
    assert [e.type for e in typed if not e.type.endswith(".delta")] == [
        k for k in kinds if not k.endswith(".delta")]
    assert typed[-1].response.output_text == text


def test_logprobs_when_included(client):
    data = _raw(client, model=MODEL_NAME, input="hello", temperature=0, max_output_tokens=4,
                include=["message.output_text.logprobs"])
    part = data["output"][0]["content"][0]
    assert len(part["logprobs"]) == 4 and "".join(p["token"] for p in part["logprobs"]) == part["text"]
    assert all(p["logprob"] <= 0 for p in part["logprobs"])
    # with top_logprobs, each token's alternatives, most likely first, as chat returns them
    body = dict(model=MODEL_NAME, input="hello", temperature=0, max_output_tokens=4, top_logprobs=3,
                include=["message.output_text.logprobs"])
    part = _raw(client, **body)["output"][0]["content"][0]
    chat = client.chat.completions.create(model=MODEL_NAME, messages=HELLO, temperature=0, max_tokens=4,
                                          logprobs=True, top_logprobs=3).choices[0].logprobs.content
    assert [[(t["token"], t["logprob"]) for t in p["top_logprobs"]] for p in part["logprobs"]] == [
        [(t.token, t.logprob) for t in c.top_logprobs] for c in chat]
    assert all(len(p["top_logprobs"]) == 3 for p in part["logprobs"])
    streamed = [lp for e in _events(client, **body) if e["type"] == "response.output_text.delta"
                for lp in e["logprobs"]]
    assert [p["token"] for p in streamed] == [p["token"] for p in part["logprobs"]]
    # without the include, no log-probs, top_logprobs or not (the include is what asks for them)
    assert _raw(client, **{**body, "include": []})["output"][0]["content"][0]["logprobs"] == []


def test_function_calls_and_the_next_turn(scripted):
    client, engine = scripted(CALL_TEXT)
    data = _raw(client, model=MODEL_NAME, input="weather?", tools=[FLAT_WEATHER])
    message, first, second = data["output"]
    assert message["content"][0]["text"] == "I will look." and data["status"] == "completed"
    assert [(c["type"], c["name"], json.loads(c["arguments"])) for c in (first, second)] == [
        ("function_call", "get_weather", {"city": "Paris"}),
        ("function_call", "get_weather", {"city": "Rome", "days": 2})]
    assert first["call_id"] != second["call_id"] and first["id"].startswith("fc_")
    assert data["tools"] == [FLAT_WEATHER] and data["tool_choice"] == "auto"
    prompt = engine.tokenizer.decode(list(engine.requests[-1].prompt_ids))
    assert '"name": "get_weather"' in prompt and "# Tools" in prompt  # the template got the tools

    # the next turn sends the calls and their outputs back as input items (no stored state)
    history = [{"role": "user", "content": "weather?"}, message, first, second,
               {"type": "function_call_output", "call_id": first["call_id"], "output": "sunny"},
               {"type": "function_call_output", "call_id": second["call_id"], "output": "rain"}]
    _raw(client, model=MODEL_NAME, input=history, tools=[FLAT_WEATHER])
    chat_history = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "I will look.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}}]},
        {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rain"}]
    expected = engine.tokenizer.apply_chat_template(chat_history, tools=[WEATHER], tokenize=False,
                                                    add_generation_prompt=True)
    assert engine.tokenizer.decode(list(engine.requests[-1].prompt_ids)) == expected


def test_function_calls_stream(scripted):
    client, _ = scripted(CALL_TEXT)
    whole = _raw(client, model=MODEL_NAME, input="weather?", tools=[FLAT_WEATHER])
    events = _events(client, model=MODEL_NAME, input="weather?", tools=[FLAT_WEATHER])
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [json.loads(e["arguments"]) for e in done] == [{"city": "Paris"}, {"city": "Rome", "days": 2}]
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [i["type"] for i in added] == ["message", "function_call", "function_call"]
    final = events[-1]
    assert final["type"] == "response.completed"

    def shape(output):
        return [(i["type"], i.get("name"), i.get("arguments"), i.get("content")) for i in output]
    assert shape(final["response"]["output"]) == shape(whole["output"])
    # the SDK's stream helper reads the same calls
    with client.responses.stream(model=MODEL_NAME, input="weather?", tools=[FLAT_WEATHER]) as stream:
        for _ in stream:
            pass
        calls = [i for i in stream.get_final_response().output if i.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather", "get_weather"]


def test_reasoning_item(scripted):
    client, _ = scripted(FULL, HYBRID, reasoning_parser="qwen3")
    data = _raw(client, model=MODEL_NAME, input="2+2?")
    reasoning, message = data["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [
        {"type": "reasoning_text", "text": REASONING}]
    assert message["content"][0]["text"] == ANSWER
    events = _events(client, model=MODEL_NAME, input="2+2?")
    thought = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    said = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert (thought, said) == (REASONING, ANSWER)
    assert [i["type"] for i in events[-1]["response"]["output"]] == ["reasoning", "message"]
    # a reasoning item sent back reaches the template as the assistant turn's reasoning_content
    history = [{"role": "user", "content": "2+2?"}, reasoning, message, {"role": "user", "content": "and 3+3?"}]
    _raw(client, model=MODEL_NAME, input=history)


def test_constrained_decoding(client):
    """``text.format`` json_schema and a named ``tool_choice`` reach the chat path's constrained
    decoding: every reply parses and validates (the schemas and seeds of test_constrained_decoding)."""
    import jsonschema
    from test_constrained_decoding import PERSON, TIME

    format_ = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    for seed in (0, 1):
        body = dict(model=MODEL_NAME, input="hello", max_output_tokens=900, text={"format": format_},
                    extra_body={"seed": seed})
        data = _raw(client, **body)
        assert data["status"] == "completed" and data["text"]["format"] == format_
        jsonschema.validate(json.loads(data["output"][0]["content"][0]["text"]), PERSON)
        events = _events(client, **body)
        assert events[-1]["response"]["output"][0]["content"] == data["output"][0]["content"]
    time_tool = {"type": "function", **TIME["function"]}
    data = _raw(client, model=MODEL_NAME, input="hello", max_output_tokens=900, tools=[FLAT_WEATHER, time_tool],
                tool_choice={"type": "function", "name": "get_time"}, parallel_tool_calls=False,
                extra_body={"seed": 3})
    calls = [i for i in data["output"] if i["type"] == "function_call"]
    assert [c["name"] for c in calls] == ["get_time"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), TIME["function"]["parameters"])
    assert data["parallel_tool_calls"] is False


@pytest.mark.parametrize("body, param", [
    ({"store": True}, "store"),
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"top_logprobs": 21, "include": ["message.output_text.logprobs"]}, "top_logprobs"),
    ({"temperature": 3}, "temperature"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"truncation": "auto"}, "truncation"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"tool_choice": {"type": "function", "name": "nowhere"}, "tools": [FLAT_WEATHER]}, "tool_choice.name"),
])
def test_unsupported_fields_are_refused(client, body, param):
    request = {"model": MODEL_NAME, "input": "hello", **body}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(**request)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param, caught.value.body


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="other", input="hello")


def test_engine_error_mid_stream_is_response_failed(scripted):
    client, engine = scripted("hello there")

    async def broken(request):
        yield GenerationChunk((engine.ids[0],), (-0.5,))
        raise RuntimeError("the engine broke")
    engine.generate_stream = broken
    events = _events(client, model=MODEL_NAME, input="hi")
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "response.failed" and "response.completed" not in kinds
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert "the engine broke" in failed["error"]["message"]


def test_through_the_spade_serve_command(server, served):  # noqa: F811 - test_serve's subprocess
    """The same request to ``python -m spade serve`` (a subprocess) and to the in-process server
    gives the same greedy reply."""
    cli = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)
    body = dict(model=MODEL_NAME, input="hello", temperature=0, max_output_tokens=8)
    reply = cli.responses.create(**body)
    assert reply.output_text == _raw(openai.OpenAI(base_url=served.url, api_key="unused"), **body)[
        "output"][0]["content"][0]["text"]
    events = list(cli.responses.create(stream=True, **body))
    assert events[-1].response.output_text == reply.output_text
