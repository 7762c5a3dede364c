"""``spade serve`` through the real ``openai`` client, and its response path with given texts.

A module-scoped server runs ``python -m spade serve`` as a subprocess on a free 127.0.0.1 port with
a tiny random Qwen3 model whose chat template (written here, in Qwen3's layout) renders tools and
tool calls. A random tiny model does not emit tool calls on demand, so the parse path is tested on
the service with a scripted engine that returns the token ids of a given text, and the prompt path
by comparing the server's prompt token counts with the template rendered here.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import prewarmed
import pytest

from spade.rollout.engine import GenerationChunk, GenerationResult, RolloutEngine

import openai  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 90
MODEL_NAME = "tiny-qwen3"

pytestmark = pytest.mark.timeout(240)

TOOLS_TEMPLATE = r"""
{%- if tools -%}
{{- '<|im_start|>system\n# Tools\n<tools>' -}}
{%- for t in tools -%}{{- '\n' + (t | tojson) -}}{%- endfor -%}
{{- '\n</tools><|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'tool' -%}
{{- '<|im_start|>user\n<tool_response>\n' + m.content + '\n</tool_response><|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + m.role + '\n' + m.content -}}
{%- if m.tool_calls -%}{%- for c in m.tool_calls -%}
{{- '\n<tool_call>\n' + ({'name': c.function.name, 'arguments': c.function.arguments} | tojson) + '\n</tool_call>' -}}
{%- endfor -%}{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
""".strip()

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "days": {"type": "integer"}},
                       "required": ["city"]},
    },
}
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from chat_templates import bpe_tokenizer
    from support.models import save_tiny_qwen3

    directory = tmp_path_factory.mktemp("serve_model")
    return save_tiny_qwen3(directory, bpe_tokenizer(TOOLS_TEMPLATE), max_position_embeddings=1024, randomize=True)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(model_dir):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [prewarmed.python(), "-m", "spade", "serve", "--model", str(model_dir), "--port", str(port),
         "--served-model-name", MODEL_NAME, "--max-batch-size", "4"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while True:  # bounded poll of /health; fail at once if the server died
            if process.poll() is not None:
                pytest.fail(f"spade serve exited with {process.returncode}: {process.stderr.read()}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"spade serve did not answer /health within {STARTUP_TIMEOUT_S} s")
            time.sleep(0.2)  # poll interval, not an ordering device
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    assert process.returncode == 0, f"spade serve did not exit cleanly on SIGTERM: {process.returncode}"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)


def _prompt_tokens(tokenizer, messages, tools=None) -> int:
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------------------- over HTTP


def test_models_list(client):
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME


def test_chat_completion(client, tokenizer):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=6, seed=3)
    assert reply.object == "chat.completion" and reply.model == MODEL_NAME
    (choice,) = reply.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens == _prompt_tokens(tokenizer, HELLO)
    assert 1 <= reply.usage.completion_tokens <= 6
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_seeded_determinism_and_n(client):
    def ask(seed, n=1):
        return client.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=12,
                                              temperature=1.0, seed=seed, n=n)
    first, again, other = ask(11), ask(11), ask(12)
    assert first.choices[0].message.content == again.choices[0].message.content
    assert first.choices[0].message.content != other.choices[0].message.content
    pair = ask(11, n=2)
    assert [c.index for c in pair.choices] == [0, 1]
    assert pair.choices[0].message.content == first.choices[0].message.content  # choice j: seed + j
    assert pair.choices[1].message.content == other.choices[0].message.content


def test_greedy_and_stop_string(client):
    plain = client.completions.create(model=MODEL_NAME, prompt="hello world", max_tokens=10,
                                      temperature=0)
    text = plain.choices[0].text
    assert len(text) >= 2
    stop = text[1:3]
    cut = client.completions.create(model=MODEL_NAME, prompt="hello world", max_tokens=10,
                                    temperature=0, stop=[stop])
    assert cut.choices[0].text == text[:text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_completion_forms(client, tokenizer):
    ids = tokenizer("hello there", add_special_tokens=False)["input_ids"]
    by_text = client.completions.create(model=MODEL_NAME, prompt="hello there", max_tokens=5,
                                        temperature=0, echo=True, logprobs=1)
    by_ids = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=5, temperature=0)
    assert by_text.object == "text_completion"
    assert by_text.usage.prompt_tokens == by_ids.usage.prompt_tokens == len(ids)
    assert by_text.choices[0].text == "hello there" + by_ids.choices[0].text
    assert len(by_text.choices[0].logprobs.token_logprobs) == by_text.usage.completion_tokens
    assert all(lp <= 0 for lp in by_text.choices[0].logprobs.token_logprobs)
    two = client.completions.create(model=MODEL_NAME, prompt=["hello", "the cat"], max_tokens=3, n=2, seed=1)
    assert [c.index for c in two.choices] == [0, 1, 2, 3]


def test_streaming_matches_non_streaming(client):
    args = dict(model=MODEL_NAME, messages=HELLO, max_tokens=10, seed=5)
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens

    plain = client.completions.create(model=MODEL_NAME, prompt="the dog", max_tokens=8, seed=2)
    streamed = list(client.completions.create(model=MODEL_NAME, prompt="the dog", max_tokens=8,
                                              seed=2, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == plain.choices[0].text
    assert streamed[-1].choices[0].finish_reason == plain.choices[0].finish_reason


def test_sse_wire_format_ends_with_done(server):
    body = json.dumps({"model": MODEL_NAME, "messages": HELLO, "max_tokens": 3, "stream": True}).encode()
    request = urllib.request.Request(server + "/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.headers["Content-Type"].startswith("text/event-stream")
        events = [line for line in answer.read().decode().split("\n\n") if line.strip()]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"


def test_tools_reach_the_prompt(client, tokenizer):
    with_tools = client.chat.completions.create(model=MODEL_NAME, messages=HELLO, tools=[WEATHER],
                                                max_tokens=2, seed=0)
    assert with_tools.usage.prompt_tokens == _prompt_tokens(tokenizer, HELLO, [WEATHER])
    assert with_tools.usage.prompt_tokens > _prompt_tokens(tokenizer, HELLO) + 20
    # a whole tool round trip: the assistant's call and the tool's answer are rendered too
    history = HELLO + [
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    reply = client.chat.completions.create(model=MODEL_NAME, messages=history, tools=[WEATHER],
                                           max_tokens=2, seed=0)
    expected = [dict(m) for m in history]
    expected[1] = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert reply.usage.prompt_tokens == _prompt_tokens(tokenizer, expected, [WEATHER])
    # tool_choice "none": no tools in the prompt
    none = client.chat.completions.create(model=MODEL_NAME, messages=HELLO, tools=[WEATHER],
                                          tool_choice="none", max_tokens=2)
    assert none.usage.prompt_tokens == _prompt_tokens(tokenizer, HELLO)


def test_bad_requests_are_400_naming_the_field(client, server):
    cases = [
        (dict(messages=[{"role": "usr", "content": "x"}]), "messages[0].role"),
        (dict(messages=[]), "messages"),
        (dict(messages=HELLO, temperature=5), "temperature"),
        (dict(messages=HELLO, max_tokens=0), "max_tokens"),
        (dict(messages=HELLO, tools=[{"type": "function", "function": {}}]), "tools[0].function.name"),
    ]
    for kwargs, field in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL_NAME, **kwargs)
        assert caught.value.status_code == 400
        assert caught.value.body["param"] == field, kwargs
        assert field.split("[")[0] in caught.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=HELLO)
    request = urllib.request.Request(server + "/v1/completions", b"{not json",
                                     {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 400
    assert "not valid JSON" in json.loads(caught.value.read())["error"]["message"]


# ---------------------------------------------------------------------------- the response path


class ScriptedEngine(RolloutEngine):
    """A ``RolloutEngine`` stand-in that answers every request with the ids of a given text;
    ``generate_stream`` sends them one token per chunk and, when its caller closes it early,
    records after how many tokens (``closed_after``)."""

    def __init__(self, tokenizer, text: str) -> None:
        self.ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        self.requests = []
        self.closed_after = None

    @property
    def weight_version(self) -> int:
        return 0

    async def generate(self, request):
        self.requests.append(request)
        return GenerationResult(self.ids, [-0.5] * len(self.ids), "stop", 0)

    async def generate_stream(self, request):
        self.requests.append(request)
        self.closed_after, sent = None, 0
        try:
            for token in self.ids[:-1]:
                yield GenerationChunk((token,), (-0.5,))
                sent += 1
            yield GenerationChunk((self.ids[-1],), (-0.5,), "stop", 0)
            sent += 1
        finally:
            if sent < len(self.ids):
                self.closed_after = sent

    async def update_weights(self, named_tensors, version: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _service(tokenizer, text):
    from spade.serve.service import ModelService

    engine = ScriptedEngine(tokenizer, text)
    return ModelService(engine, tokenizer, MODEL_NAME, max_context_tokens=1024,
                        eos_token_ids=[tokenizer.eos_token_id]), engine


def _post(service, path, body):
    from spade.serve.http import Request, StreamResponse

    async def go():
        answer = await service.handle(Request("POST", path, {}, {}, json.dumps(body).encode()))
        if isinstance(answer, StreamResponse):
            return answer.status, b"".join([c async for c in answer.chunks]).decode()
        return answer.status, json.loads(answer.body)
    return asyncio.run(go())


CALL_TEXT = ('I will look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
             '</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n'
             '<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>')


def test_generated_tool_calls_become_tool_calls(tokenizer):
    service, engine = _service(tokenizer, CALL_TEXT)
    status, reply = _post(service, "/v1/chat/completions",
                          {"messages": HELLO, "tools": [WEATHER], "max_tokens": 100})
    assert status == 200
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "I will look."
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_weather"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"},
                                                                       {"city": "Rome", "days": 2}]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    # the prompt the engine got holds the tool schema, rendered by the model's template
    prompt = tokenizer.decode(list(engine.requests[0].prompt_ids))
    assert '"name": "get_weather"' in prompt and "# Tools" in prompt

    status, events = _post(service, "/v1/chat/completions",
                           {"messages": HELLO, "tools": [WEATHER], "stream": True})
    chunks = [json.loads(e[6:]) for e in events.split("\n\n") if e.startswith("data: {")]
    deltas = [c["choices"][0] for c in chunks]
    streamed = [call for d in deltas for call in d["delta"].get("tool_calls", [])]
    assert [(c["index"], c["function"]["name"]) for c in streamed] == [(0, "get_weather"), (1, "get_weather")]
    assert deltas[-1]["finish_reason"] == "tool_calls"
    assert events.rstrip().endswith("data: [DONE]")


def test_no_tools_or_malformed_call_stays_text(tokenizer):
    service, _ = _service(tokenizer, CALL_TEXT)
    _, reply = _post(service, "/v1/chat/completions", {"messages": HELLO})
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": CALL_TEXT}
    assert reply["choices"][0]["finish_reason"] == "stop"
    broken = 'Sure <tool_call>{"name": "get_weather", "arguments": {</tool_call>'
    service, _ = _service(tokenizer, broken)
    _, reply = _post(service, "/v1/chat/completions", {"messages": HELLO, "tools": [WEATHER]})
    assert reply["choices"][0]["message"]["content"] == broken
    assert "tool_calls" not in reply["choices"][0]["message"]
    assert reply["choices"][0]["finish_reason"] == "stop"


def test_template_without_tools_refuses_tools():
    from chat_templates import CHATML, bpe_tokenizer

    plain = bpe_tokenizer(CHATML)
    service, _ = _service(plain, "hi")
    status, reply = _post(service, "/v1/chat/completions", {"messages": HELLO, "tools": [WEATHER]})
    assert status == 400 and reply["error"]["param"] == "tools"
    assert "does not render tools" in reply["error"]["message"]
