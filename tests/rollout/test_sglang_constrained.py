"""Constrained decoding over SGLang: ``spade serve`` in front of ``SGLangEngine`` sends the
request's grammar in ``sampling_params`` (``json_schema`` / ``structural_tag``, the fields SGLang
0.5.23's ``serving_chat`` fills), and the SGLang stand-in (tests/sglang_standin, over a real tiny
byte-level BPE Qwen3) decodes with it through xgrammar, as SGLang's xgrammar backend does. The real
openai client checks that every output parses and validates against its schema.

A real SGLang server needs a GPU, which this machine lacks; the stand-in speaks its format.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from sglang_standin import standin_argv
from spade.rollout.engine import Constraint, GenerationRequest, SamplingParams
from spade.rollout.sglang.launcher import ServerLauncher, free_port, sglang_argv
from spade.rollout.sglang.protocol import generate_payload
from test_constrained_decoding import PERSON, STRICT_WEATHER, TIME
from test_serve import HELLO, WEATHER, model_dir  # noqa: F401

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def standin(model_dir, tmp_path_factory):  # noqa: F811 - the fixture imported above
    port = free_port()
    launcher = ServerLauncher(standin_argv(sglang_argv(model_dir, tp=1, port=port)), port=port,
                              log_path=tmp_path_factory.mktemp("logs") / "standin.log",
                              start_timeout_s=90, poll_interval_s=0.1)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(launcher.start())
    yield launcher.url
    loop.run_until_complete(launcher.stop(grace_s=2))
    loop.close()


def test_the_constraint_goes_in_sampling_params():
    constraint = Constraint("json_schema", json.dumps(PERSON))
    payload = generate_payload(GenerationRequest((1, 2), SamplingParams(constraint=constraint)), "r")
    assert payload["sampling_params"]["json_schema"] == constraint.spec
    assert "json_schema" not in generate_payload(GenerationRequest((1, 2)), "r")["sampling_params"]


def test_spade_serve_constrains_over_sglang(standin, model_dir):  # noqa: F811
    import openai
    from transformers import AutoTokenizer

    from spade.rollout.sglang.engine import SGLangEngine
    from spade.serve.server import BackgroundServer
    from spade.serve.service import ModelService

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    service = ModelService(SGLangEngine([standin]), tokenizer, "tiny", max_context_tokens=1024,
                           eos_token_ids=[tokenizer.eos_token_id])
    format_ = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    with BackgroundServer(service) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)

        def ask(seed, **extra):
            return client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=900,
                                                  temperature=1.0, seed=seed, **extra).choices[0]

        for seed in (0, 1):
            choice = ask(seed, response_format=format_)
            assert choice.finish_reason == "stop"
            jsonschema.validate(json.loads(choice.message.content), PERSON)
        named = ask(2, tools=[STRICT_WEATHER, TIME], parallel_tool_calls=False,
                    tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.finish_reason == "tool_calls"
    for call in named.message.tool_calls:
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
