"""``spade serve`` separates a thinking model's reasoning from its answer, as SGLang's reasoning
parser does (``--reasoning-parser qwen3`` / ``deepseek-r1``): the real ``openai`` client against the
HTTP server (``BackgroundServer``) over a scripted engine that replies with a given text.

The expected values are written by hand from the rules of SGLang's parser
(``sgl-project/sglang``, ``python/sglang/srt/parser/reasoning_parser.py``,
``BaseReasoningFormatDetector.detect_and_parse`` / ``parse_streaming_increment`` and
``serving_chat.py`` ``_build_chat_response``): leading ``<think>`` tags are dropped; the text
before the first ``</think>`` is ``reasoning_content``, the text after it ``content``, neither
stripped of whitespace; no ``</think>`` while inside reasoning means the reply was cut there, so
all of it is reasoning and ``content`` is empty; a reply with no ``<think>`` in it (and whose
prompt did not open one) is all ``content``; tool calls are parsed from ``content`` only. These rules
are checked against SGLang's own parser by tests/agent/test_reasoning_differential.py.
"""

from __future__ import annotations

import json

import pytest

from chat_templates import CORPUS, GENERATION_PROMPT_OPENS_THINK, SPECIAL_TOKENS, bpe_tokenizer, chatml_with_tools
from spade.rollout.engine import GenerationChunk, GenerationResult
from test_serve import HELLO, MODEL_NAME, WEATHER, ScriptedEngine, model_dir  # noqa: F401

import openai  # noqa: E402

pytestmark = pytest.mark.timeout(120)

_TOOLS_HEADING = r"# Tools\n"
# Qwen3's hybrid models: the model opens <think> itself; enable_thinking=false closes an empty block
HYBRID = chatml_with_tools(r"""
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and not enable_thinking -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}""", _TOOLS_HEADING)
# Qwen3-Thinking-2507: the generation prompt opens <think>, the reply starts inside the reasoning
OPENS_THINK = chatml_with_tools(GENERATION_PROMPT_OPENS_THINK, _TOOLS_HEADING)

REASONING = "\nTwo plus two: count up from two.\n"
ANSWER = "\n\nThe answer is 4."
FULL = "<think>" + REASONING + "</think>" + ANSWER  # a hybrid Qwen3 reply in thinking mode
INSIDE = "Two plus two: count up from two.\n</think>" + ANSWER  # after a prompt that opened <think>
OSLO = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
PARIS = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THOUGHT_WITH_CALL = "\nMaybe " + OSLO + " first? No, the user means Paris.\n"
CALL_REPLY = "<think>" + THOUGHT_WITH_CALL + "</think>\n\n" + PARIS


class ReplyEngine(ScriptedEngine):
    """``ScriptedEngine`` that also honours ``max_new_tokens``: a longer reply is cut there with
    finish reason "length", as an engine cuts it; ``prompt_text`` is the last prompt, decoded."""

    def __init__(self, tokenizer, text: str) -> None:
        super().__init__(tokenizer, text)
        self.tokenizer = tokenizer

    @property
    def prompt_text(self) -> str:
        return self.tokenizer.decode(list(self.requests[-1].prompt_ids))

    def _reply(self, request):
        self.requests.append(request)
        limit = request.sampling.max_new_tokens
        if limit is not None and limit < len(self.ids):
            return self.ids[:limit], "length"
        return self.ids, "stop"

    async def generate(self, request):
        ids, finish = self._reply(request)
        return GenerationResult(ids, [-0.5] * len(ids), finish, 0)

    async def generate_stream(self, request):
        ids, finish = self._reply(request)
        for k, token in enumerate(ids):
            last = k == len(ids) - 1
            yield GenerationChunk((token,), (-0.5,), finish if last else None, 0 if last else None)


def plain_tokenizer(chat_template: str):
    """A byte-level BPE without ``<think>`` / ``</think>`` as tokens of their own, so that the tags
    arrive over several tokens (several stream chunks)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(CORPUS, trainer=trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = chat_template
    return tokenizer


@pytest.fixture()
def serve():
    from spade.serve.server import BackgroundServer
    from spade.serve.service import ModelService

    servers = []

    def start(text: str, template: str = HYBRID, *, tokenizer=None, **options):
        tokenizer = tokenizer or bpe_tokenizer(template)
        engine = ReplyEngine(tokenizer, text)
        service = ModelService(engine, tokenizer, MODEL_NAME, max_context_tokens=1024,
                               eos_token_ids=[tokenizer.eos_token_id], **options)
        server = BackgroundServer(service).start()
        servers.append(server)
        return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30), engine

    yield start
    for server in servers:
        server.close()


def ask(client, stream: bool = False, **kwargs):
    args = dict(model=MODEL_NAME, messages=HELLO, **kwargs)
    if stream:
        return list(client.chat.completions.create(stream=True, **args))
    return client.chat.completions.create(**args).choices[0]


def reasoning_of(message):
    return getattr(message, "reasoning_content", None)


def streamed(chunks):
    """(reasoning deltas, content deltas, tool-call deltas, finish reasons) of choice 0."""
    deltas = [c.choices[0] for c in chunks if c.choices]
    return ([reasoning_of(d.delta) for d in deltas if reasoning_of(d.delta)],
            [d.delta.content for d in deltas if d.delta.content],
            [call for d in deltas for call in (d.delta.tool_calls or [])],
            [d.finish_reason for d in deltas if d.finish_reason])


# ---------------------------------------------------------------------------- whole responses


def test_a_think_block_then_an_answer(serve):
    client, _ = serve(FULL)
    choice = ask(client)
    assert choice.message.content == ANSWER
    assert reasoning_of(choice.message) == REASONING
    assert choice.finish_reason == "stop"
    reasoning, content, calls, finishes = streamed(ask(client, stream=True))
    assert "".join(reasoning) == REASONING and "".join(content) == ANSWER
    assert not calls and finishes == ["stop"]


def test_a_reply_that_starts_inside_the_reasoning(serve):
    # the template's generation prompt ends in "<think>\n" (Qwen3-Thinking-2507): no opening tag
    client, engine = serve(INSIDE, OPENS_THINK)
    choice = ask(client)
    assert engine.prompt_text.endswith("<|im_start|>assistant\n<think>\n")
    assert reasoning_of(choice.message) == "Two plus two: count up from two.\n"
    assert choice.message.content == ANSWER
    reasoning, content, _, _ = streamed(ask(client, stream=True))
    assert "".join(reasoning) == "Two plus two: count up from two.\n" and "".join(content) == ANSWER


def test_a_reply_cut_inside_the_reasoning(serve):
    tokenizer = bpe_tokenizer(HYBRID)
    ids = tokenizer(FULL, add_special_tokens=False)["input_ids"]
    cut = 6
    text = tokenizer.decode(ids[:cut])
    assert text.startswith("<think>") and "</think>" not in text and len(text) > len("<think>") + 3
    client, _ = serve(FULL, tokenizer=tokenizer)
    choice = ask(client, max_tokens=cut)
    assert choice.finish_reason == "length"
    assert choice.message.content == ""
    assert reasoning_of(choice.message) == text[len("<think>"):]
    reasoning, content, _, finishes = streamed(ask(client, stream=True, max_tokens=cut))
    assert "".join(reasoning) == text[len("<think>"):] and content == [] and finishes == ["length"]
    # the same cut after a prompt that opened <think>: the whole reply is reasoning
    inside_ids = tokenizer(INSIDE, add_special_tokens=False)["input_ids"]
    client, _ = serve(INSIDE, OPENS_THINK, tokenizer=bpe_tokenizer(OPENS_THINK))
    choice = ask(client, max_tokens=4)
    assert choice.message.content == "" and choice.finish_reason == "length"
    assert reasoning_of(choice.message) == tokenizer.decode(inside_ids[:4])


def test_a_tool_call_inside_the_reasoning_is_not_a_call(serve):
    client, _ = serve(CALL_REPLY)
    choice = ask(client, tools=[WEATHER])
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    assert reasoning_of(choice.message) == THOUGHT_WITH_CALL  # the Oslo block stays, as written
    assert not choice.message.content
    reasoning, content, calls, finishes = streamed(ask(client, stream=True, tools=[WEATHER]))
    assert "".join(reasoning) == THOUGHT_WITH_CALL and not "".join(content).strip()
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    assert finishes == ["tool_calls"]


# ---------------------------------------------------------------------------- streaming


@pytest.mark.parametrize("text,template,reasoning", [
    (FULL, HYBRID, REASONING),
    (INSIDE, OPENS_THINK, "Two plus two: count up from two.\n"),
], ids=["think-block", "starts-inside"])
def test_tags_split_over_stream_chunks(serve, text, template, reasoning):
    tokenizer = plain_tokenizer(template)
    assert len(tokenizer("</think>", add_special_tokens=False)["input_ids"]) > 2  # several chunks
    client, _ = serve(text, tokenizer=tokenizer)
    reasoning_deltas, content_deltas, _, _ = streamed(ask(client, stream=True))
    assert len(reasoning_deltas) > 3 and len(content_deltas) > 1
    assert "".join(reasoning_deltas) == reasoning
    assert "".join(content_deltas) == ANSWER
    whole = ask(client)
    assert (reasoning_of(whole.message), whole.message.content) == (reasoning, ANSWER)


# ---------------------------------------------------------------------------- switches


def test_request_switches(serve):
    client, _ = serve(FULL)
    # separate_reasoning false (SGLang's request field): the reply as generated
    choice = ask(client, extra_body={"separate_reasoning": False})
    assert choice.message.content == FULL and reasoning_of(choice.message) is None
    _, content, _, _ = streamed(ask(client, stream=True, extra_body={"separate_reasoning": False}))
    assert "".join(content) == FULL
    # enable_thinking false: the prompt closes an empty block, a reply without tags is all answer
    client, engine = serve("The answer is 4.")
    choice = ask(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert engine.prompt_text.endswith("<think>\n\n</think>\n\n")
    assert choice.message.content == "The answer is 4." and reasoning_of(choice.message) is None


def test_server_switches(serve):
    # none: nothing is separated
    client, _ = serve(FULL, reasoning_parser="none")
    assert ask(client).message.content == FULL
    # deepseek-r1: the reply is reasoning until </think> even when neither the prompt nor the reply
    # opened it (DeepSeek-R1 writes no opening tag)
    client, _ = serve("I count.</think>Four.", reasoning_parser="deepseek-r1")
    choice = ask(client)
    assert (reasoning_of(choice.message), choice.message.content) == ("I count.", "Four.")
    # qwen3 on the same reply after a prompt that opened nothing: no reasoning, all answer
    client, _ = serve("I count.</think>Four.", reasoning_parser="qwen3")
    assert ask(client).message.content == "I count.</think>Four."
    # the server's default thinking setting goes into every prompt, unless a request sets it
    for options in ({"thinking": "off"}, {"template_kwargs": {"enable_thinking": False}}):
        client, engine = serve("Four.", **options)
        assert ask(client).message.content == "Four."
        assert engine.prompt_text.endswith("<think>\n\n</think>\n\n")
        ask(client, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        assert engine.prompt_text.endswith("<|im_start|>assistant\n")


def test_auto_parser_follows_the_chat_template():
    from test_serve import TOOLS_TEMPLATE

    from spade.agent.reasoning import resolve_parser

    assert resolve_parser("auto", HYBRID) == "qwen3"
    assert resolve_parser("auto", OPENS_THINK) == "qwen3"
    assert resolve_parser("auto", TOOLS_TEMPLATE) == "none"  # a template that knows no reasoning
    assert resolve_parser("deepseek-r1", TOOLS_TEMPLATE) == "deepseek-r1"
    with pytest.raises(ValueError, match="--reasoning-parser.*auto, qwen3, deepseek-r1, none"):
        resolve_parser("qwen", HYBRID)


def test_command_line_options(model_dir):  # noqa: F811 - test_serve's tiny model (no thinking switch)
    import subprocess
    import sys

    from test_serve import ROOT

    def serve_cli(*args):
        return subprocess.run([sys.executable, "-m", "spade", "serve", "--model", str(model_dir),
                               "--port", "0", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)

    refused = serve_cli("--thinking", "on")  # refused before the model loads
    assert refused.returncode == 2 and "--thinking" in refused.stderr and "enable_thinking" in refused.stderr
    unknown = serve_cli("--reasoning-parser", "qwen")
    assert unknown.returncode == 2 and "deepseek-r1" in unknown.stderr

    from spade.cli.serve import ServeOptions, build_service

    service = build_service(ServeOptions(model=str(model_dir), reasoning_parser="deepseek-r1"))
    try:
        assert service.reasoning_parser == "deepseek-r1"
    finally:
        service.engine.close()
    service = build_service(ServeOptions(model=str(model_dir)))
    try:
        assert service.reasoning_parser == "none"  # auto, and this template writes no <think>
    finally:
        service.engine.close()


@pytest.mark.parametrize("inside", [False, True])
def test_any_chunking_adds_up_to_the_whole_split(inside):
    import random

    from spade.agent.reasoning import ReasoningStream, split

    texts = [FULL, INSIDE, CALL_REPLY, "", "<think>", "<thi", "<think><think>x</think>y", "a</think>b",
             "no tags at all", "<think>cut while thinking </thi", "x<think>y</think>z", "</think>",
             "<think>\n\n</think>\n\n"]
    rng = random.Random(0)
    for text in texts:
        whole = split(text, inside=inside)
        for _ in range(30):
            cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
            pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
            stream = ReasoningStream(inside=inside)
            got = [stream.push(p, final=k == len(pieces) - 1) for k, p in enumerate(pieces)]
            assert "".join(d.reasoning for d in got) == (whole.reasoning or ""), (text, pieces)
            assert "".join(d.answer for d in got) == whole.answer, (text, pieces)
    # the hand-derived cases of SGLang's rules
    assert (split("<think><think>x</think>y", inside=False).reasoning, split("a</think>b", inside=False).answer,
            split("a</think>b", inside=True).reasoning, split("x<think>y</think>z", inside=False).reasoning,
            split("<think>cut </thi", inside=False).answer) == ("x", "a</think>b", "a", "x<think>y", "")


def test_the_benchmark_endpoint_passes_the_models_template_keywords_and_separates_reasoning():
    """tau2-bench and ACEBench reach the evaluated model through ``serve_chat_model``: the model's own
    chat-template keywords (``model.thinking`` off here) must shape every prompt the harness sends,
    and a thinking reply must reach the harness as its answer only."""
    import asyncio
    from types import SimpleNamespace

    from spade.eval.served_model import SERVED_NAME, serve_chat_model

    tokenizer = bpe_tokenizer(HYBRID)
    engine = ReplyEngine(tokenizer, FULL)
    model = SimpleNamespace(engine=engine, tokenizer=tokenizer, stop_token_ids=(), max_context_tokens=4096,
                            template_kwargs={"enable_thinking": False})

    async def ask() -> dict:
        async with serve_chat_model(model) as url:
            client = openai.AsyncOpenAI(base_url=url, api_key="none")
            reply = await client.chat.completions.create(
                model=SERVED_NAME, messages=[{"role": "user", "content": "2+2?"}], max_tokens=200)
            await client.close()
            return reply.choices[0].message.model_dump()

    message = asyncio.run(ask())
    assert engine.prompt_text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert message["content"] == ANSWER
    assert message["reasoning_content"] == REASONING
