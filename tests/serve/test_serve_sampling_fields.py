"""``spade serve`` honours every field that changes the result, or refuses it (issue 45): the
penalties (``frequency_penalty``, ``presence_penalty``, ``repetition_penalty``), ``min_p``, the
grammars ``regex`` and ``ebnf``, and ``stop_regex``, on both engines: the in-process hf engine
and SGLang (the stand-in server, tests/sglang_standin, which receives them in ``sampling_params``).
The real ``openai`` client against a real ``spade serve`` HTTP server. Also: a streamed ``n > 1``
gives every choice its own role chunk, chunks without tokens carry ``null`` log-probs, and tool
``parameters`` that are no JSON schema are a 400.
"""

from __future__ import annotations

import asyncio
import re

import openai
import pytest

from sglang_standin import standin_argv
from test_serve import HELLO, MODEL_NAME, WEATHER, model_dir  # noqa: F401

pytestmark = pytest.mark.timeout(300)

PROMPT = [5, 6, 7, 8]  # token ids: the same prompt on both engines
LONG = dict(max_tokens=32, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def standin_url(model_dir):  # noqa: F811 - the fixture imported above
    from spade.rollout.sglang.launcher import ServerLauncher, free_port, sglang_argv

    port = free_port()
    launcher = ServerLauncher(standin_argv(sglang_argv(model_dir, tp=1, port=port)), port=port,
                              log_path=model_dir.parent / "standin.log", start_timeout_s=90,
                              poll_interval_s=0.1)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(launcher.start())
    yield launcher.url
    loop.run_until_complete(launcher.stop(grace_s=2))
    loop.close()


@pytest.fixture(scope="module", params=["hf", "sglang"])
def client(request, model_dir):  # noqa: F811
    from spade.cli.serve import ServeOptions, build_service
    from spade.serve.server import BackgroundServer

    if request.param == "hf":
        service = build_service(ServeOptions(model=str(model_dir), served_model_name=MODEL_NAME,
                                             max_batch_size=4))
    else:
        from transformers import AutoTokenizer

        from spade.rollout.sglang.engine import SGLangEngine
        from spade.serve.service import ModelService

        url = request.getfixturevalue("standin_url")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        service = ModelService(SGLangEngine([url]), tokenizer, MODEL_NAME, max_context_tokens=512,
                               eos_token_ids=[tokenizer.eos_token_id])
    with BackgroundServer(service) as server:
        yield openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def complete(client, **fields):
    args = {"model": MODEL_NAME, "prompt": PROMPT, "temperature": 0, **LONG}
    extra = {**args.pop("extra_body"), **fields.pop("extra_body", {})}
    return client.completions.create(**{**args, **fields}, extra_body=extra)


def reference(model_dir, ids, steps, *, frequency=0.0, presence=0.0, repetition=1.0):  # noqa: F811
    """Greedy decoding with the penalties written out (SamplingParams' docstring), on the model
    itself: the tokens generated so far count, the prompt does not."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    ids, generated = list(ids), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[0, -1].clone()
            for token in set(generated):
                count = generated.count(token)
                logits[token] -= frequency * count + presence
                logits[token] = logits[token] / repetition if logits[token] > 0 else logits[token] * repetition
            token = int(torch.argmax(logits))
            generated.append(token)
            ids.append(token)
    return generated


def test_penalties_follow_their_definition(client, model_dir):  # noqa: F811
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    plain = complete(client).choices[0].text
    assert plain == tokenizer.decode(reference(model_dir, PROMPT, 32), skip_special_tokens=True)
    cases = [dict(frequency_penalty=1.5), dict(presence_penalty=2.0),
             dict(extra_body={"repetition_penalty": 1.8}), dict(frequency_penalty=-1.0, presence_penalty=0.5)]
    for fields in cases:
        text = complete(client, **fields).choices[0].text
        expected = tokenizer.decode(reference(
            model_dir, PROMPT, 32, frequency=fields.get("frequency_penalty", 0.0),
            presence=fields.get("presence_penalty", 0.0),
            repetition=fields.get("extra_body", {}).get("repetition_penalty", 1.0)), skip_special_tokens=True)
        assert text == expected, fields
        # the tiny model repeats one token: a penalty changes that, a negative one only reinforces it
        assert (text != plain) == (fields.get("frequency_penalty", 0) >= 0), fields


def test_min_p_one_is_greedy(client):
    greedy = complete(client).choices[0].text
    for seed in (1, 2, 3):
        sampled = complete(client, temperature=1.0, seed=seed, extra_body={"min_p": 1.0}).choices[0].text
        assert sampled == greedy
    loose = {complete(client, temperature=1.0, seed=s).choices[0].text for s in (1, 2, 3)}
    assert loose != {greedy}  # without min_p the same seeds sample something else


def test_stop_regex_ends_the_reply_at_its_first_match(client):
    whole = complete(client, max_tokens=64)
    text = whole.choices[0].text
    piece = text[6:9]
    pattern = re.escape(piece)
    end = text.find(piece) + len(piece)
    cut = complete(client, max_tokens=64, extra_body={"stop_regex": [pattern, "zzzz"]})
    assert cut.choices[0].text == text[:end] and cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < whole.usage.completion_tokens == 64  # the generation stopped
    streamed = list(complete(client, max_tokens=64, stream=True, extra_body={"stop_regex": pattern}))
    assert "".join(c.choices[0].text for c in streamed) == text[:end]
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_regex_and_ebnf_constrain_the_reply(client):
    for seed in range(4):
        reply = complete(client, temperature=1.0, seed=seed, max_tokens=40,
                         extra_body={"regex": "[0-9]{2,4}-(ab|cd)", "ignore_eos": False})
        assert re.fullmatch("[0-9]{2,4}-(ab|cd)", reply.choices[0].text), reply.choices[0].text
        chat = client.chat.completions.create(
            model=MODEL_NAME, messages=HELLO, temperature=1.0, seed=seed, max_tokens=20,
            extra_body={"ebnf": 'root ::= "yes" | "no" | "maybe"'})
        assert chat.choices[0].message.content in ("yes", "no", "maybe")


@pytest.mark.parametrize("fields, param", [
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
    ({"extra_body": {"min_p": 1.5}}, "min_p"),
    ({"extra_body": {"stop_regex": "(unclosed"}}, "stop_regex"),
    ({"extra_body": {"stop_regex": ["a"] * 33}}, "stop_regex"),
    ({"extra_body": {"regex": "[a-"}}, "regex"),
    ({"extra_body": {"ebnf": "root ::= "}}, "ebnf"),
    ({"extra_body": {"regex": "a", "ebnf": 'root ::= "a"'}}, "ebnf"),
    ({"extra_body": {"regex": "a", "response_format": {"type": "json_object"}}}, "response_format"),
])
def test_values_that_cannot_be_honoured_are_a_400_naming_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        complete(client, **fields)
    assert caught.value.body["param"] == param


def test_every_streamed_choice_opens_with_its_role(client):
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=6, n=3,
                                                 seed=4, stream=True, logprobs=True))
    assert all(len(c.choices) == 1 for c in chunks if c.choices)
    for index in range(3):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert mine[0].delta.role == "assistant"
        assert mine[-1].finish_reason and mine[-1].logprobs is None  # the finish chunk has no tokens
        assert any(choice.logprobs and choice.logprobs.content for choice in mine)


def test_streamed_completion_chunks_without_tokens_carry_null_logprobs(client):
    chunks = list(complete(client, max_tokens=8, logprobs=1, stream=True))
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices[0].logprobs is None
    for chunk in chunks[:-1]:
        assert chunk.choices[0].logprobs is not None and chunk.choices[0].logprobs.tokens


def test_tool_parameters_that_are_no_json_schema_are_a_400(client):
    bad = {"type": "function", "function": {**WEATHER["function"], "parameters": {
        "type": "object", "properties": {"city": {"type": 5}}}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_NAME, messages=HELLO, tools=[WEATHER, bad], max_tokens=4)
    assert caught.value.body["param"] == "tools[1].function.parameters"
    # a DB-style type name, which SGLang maps to a JSON Schema type, is taken
    aliased = {"type": "function", "function": {**WEATHER["function"], "parameters": {
        "type": "object", "properties": {"city": {"type": "varchar"}}}}}
    client.chat.completions.create(model=MODEL_NAME, messages=HELLO, tools=[aliased], max_tokens=4)
