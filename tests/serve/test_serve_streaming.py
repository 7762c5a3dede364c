"""``spade serve`` streams tokens as the engine produces them: the real ``openai`` client against
spade serve's application and HTTP server (``BackgroundServer``: in this process, so that the test
can hold the hf engine's worker thread at a chosen forward and look at the engine's counters).

"Before generation finished" is shown with events, not timing: the worker is held inside its
N-th forward (``pause_at_forward``) while the client reads its first content chunk. The scripted
cases (multi-byte characters, stop strings, tool calls) stream a given text one token per chunk.
"""

from __future__ import annotations

import pytest

from test_rollout_engine import pause_at_forward
from test_serve import CALL_TEXT, HELLO, MODEL_NAME, WEATHER, ScriptedEngine, model_dir  # noqa: F401

import openai  # noqa: E402

pytestmark = pytest.mark.timeout(180)

HOLD_AT = 12  # the forward the worker is held in (1 prefill + 11 decode steps)


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


def _content(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_first_content_arrives_while_generation_is_held(served, client):
    engine = served.service.engine
    args = dict(model=MODEL_NAME, messages=HELLO, max_tokens=40, temperature=0, logprobs=True,
                extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**args)
    before = engine.stats.generated_tokens
    reached, go = pause_at_forward(engine.model, HOLD_AT)
    stream = client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args)
    chunks = iter(stream)
    read = []
    try:
        for chunk in chunks:
            read.append(chunk)
            if chunk.choices and chunk.choices[0].delta.content:
                break
        # the first content is here and the worker cannot pass its HOLD_AT-th forward until `go`:
        # 40 tokens were asked for, at most HOLD_AT exist
        assert _content(read), "no content before the end of the stream"
        assert engine.stats.running == 1 and not go.is_set()
        assert reached.wait(60) and engine.stats.generated_tokens - before <= HOLD_AT
    finally:
        go.set()
    read += list(chunks)
    assert _content(read) == whole.choices[0].message.content
    streamed_logprobs = [(e.token, e.logprob) for c in read if c.choices and c.choices[0].logprobs
                         for e in c.choices[0].logprobs.content]
    assert streamed_logprobs == [(e.token, e.logprob) for e in whole.choices[0].logprobs.content]
    assert len(streamed_logprobs) == 40
    assert read[-1].usage.completion_tokens == whole.usage.completion_tokens == 40
    finishes = [c.choices[0].finish_reason for c in read if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]


def test_seeded_stream_equals_the_completion_for_each_choice(client):
    args = dict(model=MODEL_NAME, messages=HELLO, max_tokens=16, temperature=1.0, seed=21, n=2)
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(stream=True, **args))
    for i in range(2):
        text = "".join(c.choices[0].delta.content or "" for c in chunks
                       if c.choices and c.choices[0].index == i)
        assert text == whole.choices[i].message.content
    assert whole.choices[0].message.content != whole.choices[1].message.content

    plain = client.completions.create(model=MODEL_NAME, prompt="the cat", max_tokens=12, seed=4,
                                      logprobs=1, echo=True)
    streamed = list(client.completions.create(model=MODEL_NAME, prompt="the cat", max_tokens=12,
                                              seed=4, logprobs=1, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == plain.choices[0].text
    tokens = [t for c in streamed if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in streamed if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert tokens == plain.choices[0].logprobs.tokens
    assert offsets == plain.choices[0].logprobs.text_offset


def test_client_going_away_stops_the_generation(served, client):
    engine = served.service.engine
    reached, go = pause_at_forward(engine.model, HOLD_AT)
    before_tokens, before_aborted = engine.stats.generated_tokens, engine.stats.aborted
    stream = client.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=500,
                                            temperature=0, stream=True, extra_body={"ignore_eos": True})
    try:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        assert reached.wait(60)
        stream.close()  # the client hangs up while the worker is held
    finally:
        go.set()
    # a weight update waits for the running batch to end (nothing joins it meanwhile)
    served.call(engine.update_weights([], version=engine.weight_version))
    assert engine.stats.running == 0 and engine.stats.aborted == before_aborted + 1
    abandoned = engine.stats.generated_tokens - before_tokens
    assert HOLD_AT <= abandoned < 500


def test_closing_the_server_ends_every_task_on_its_loop(model_dir):  # noqa: F811
    """Tasks still pending when the server stops (the engine's batcher, woken by
    ``engine.close()`` but not yet resumed; here also one that would wait for ever) are cancelled
    and awaited before the server's loop closes, as ``asyncio.run`` does. Left pending, they were
    reported as "Task was destroyed but it is pending!" when the process exited."""
    import asyncio

    from spade.cli.serve import ServeOptions, build_service

    from spade.serve.server import BackgroundServer

    async def linger() -> asyncio.Task:
        return asyncio.get_running_loop().create_task(asyncio.Event().wait(), name="lingering")

    service = build_service(ServeOptions(model=str(model_dir), served_model_name=MODEL_NAME))
    with BackgroundServer(service) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        client.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=2, temperature=0)
        lingering = server.call(linger())
        assert {t.get_name() for t in asyncio.all_tasks(server.loop)} >= {"hf-engine-batcher", "lingering"}
    assert server.loop.is_closed()
    assert not asyncio.all_tasks(server.loop) and lingering.cancelled()


# ---------------------------------------------------------------------------- scripted texts


@pytest.fixture()
def scripted(model_dir):  # noqa: F811
    from transformers import AutoTokenizer

    from spade.serve.server import BackgroundServer
    from spade.serve.service import ModelService

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    servers = []

    def serve(text: str):
        engine = ScriptedEngine(tokenizer, text)
        service = ModelService(engine, tokenizer, MODEL_NAME, max_context_tokens=1024,
                               eos_token_ids=[tokenizer.eos_token_id])
        server = BackgroundServer(service).start()
        servers.append(server)
        return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30), engine

    yield serve
    for server in servers:
        server.close()


TEXT = "Grüße 日本語 and so on, then more"


def test_multibyte_characters_arrive_whole(scripted):
    client, engine = scripted(TEXT)
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=HELLO, stream=True))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == TEXT
    assert len(pieces) > 10 and all("\ufffd" not in p for p in pieces)
    assert "日" in pieces and "本" in pieces  # three byte tokens each, sent as one character


def test_stop_string_split_over_tokens_cuts_and_stops(scripted):
    client, engine = scripted(TEXT)
    stop_ids = engine.ids[:-1]
    for stop in ("so on", "ße 日"):
        reply = client.completions.create(model=MODEL_NAME, prompt="x", stop=[stop, "zzz-never"])
        streamed = list(client.completions.create(model=MODEL_NAME, prompt="x", stop=[stop, "zzz-never"],
                                                  stream=True))
        text = "".join(c.choices[0].text for c in streamed)
        assert text == TEXT[:TEXT.index(stop)] == reply.choices[0].text
        assert streamed[-1].choices[0].finish_reason == "stop"
        assert all(stop not in c.choices[0].text for c in streamed)
        # the stream was closed as soon as the stop string was complete, before the text's end
        assert engine.closed_after is not None and engine.closed_after < len(stop_ids)
    # a longer stop string that starts earlier wins over a shorter one inside it
    streamed = list(client.completions.create(model=MODEL_NAME, prompt="x", stop=["and so on", "so"],
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed) == TEXT[:TEXT.index("and so on")]


def test_tool_calls_stream_as_tool_call_deltas(scripted):
    client, _ = scripted(CALL_TEXT)
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=HELLO, tools=[WEATHER],
                                                 stream=True))
    whole = client.chat.completions.create(model=MODEL_NAME, messages=HELLO, tools=[WEATHER])
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    content = "".join(d.content or "" for d in deltas)
    assert content == whole.choices[0].message.content == "I will look."
    assert "<tool_call" not in content and "get_weather" not in content
    calls = [call for d in deltas for call in (d.tool_calls or [])]
    assert [(c.index, c.function.name, c.function.arguments) for c in calls] == [
        (i, c.function.name, c.function.arguments) for i, c in enumerate(whole.choices[0].message.tool_calls)]
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
