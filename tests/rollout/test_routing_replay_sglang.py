"""Routing replay over SGLang: the launcher adds ``--enable-return-routed-experts``, every request
of an engine built with a ``RoutingShape`` sends ``"return_routed_experts": true`` and the answer's
``meta_info.routed_experts`` (SGLang 0.5.23: base64 of int32 ``[prompt + output - 1, layers,
top_k]``) becomes the compact record. Against the SGLang stand-in (tests/sglang_standin, SGLang's
shape over a real tiny Qwen3-MoE; a real server needs a GPU) and checked against transformers' own
router logits; a server started without the flag answers without the key, which is refused.
"""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest

from sglang_standin import standin_argv
from spade.rl.routing_record import RoutingShape
from spade.rollout.engine import GenerationRequest, SamplingParams
from spade.rollout.sglang.engine import SGLangEngine
from spade.rollout.sglang.launcher import ServerLauncher, free_port, sglang_argv
from spade.rollout.sglang.protocol import SGLangProtocolError, generate_payload, parse_generate_response
from support.models import tiny_hf_dir_fixture
from test_routing_replay_capture import reference_routing

pytestmark = pytest.mark.timeout(180)

PROMPT = (3, 9, 4, 17, 25)


model_dir = tiny_hf_dir_fixture("qwen3-moe")  # a module fixture: the tiny model saved once


@pytest.fixture(scope="module")
def servers(model_dir, tmp_path_factory):
    """Two stand-ins of the MoE model: with and without --enable-return-routed-experts."""
    logs = tmp_path_factory.mktemp("logs")
    launchers = {}
    for name, flag in (("with", True), ("without", False)):
        port = free_port()
        argv = standin_argv(sglang_argv(model_dir, port=port, return_routed_experts=flag))
        assert ("--enable-return-routed-experts" in argv) == flag
        launchers[name] = ServerLauncher(argv, port=port, log_path=logs / f"{name}.log", start_timeout_s=90,
                                         poll_interval_s=0.1)
    async def each(method: str, **kwargs):
        await asyncio.gather(*(getattr(s, method)(**kwargs) for s in launchers.values()))

    loop = asyncio.new_event_loop()
    loop.run_until_complete(each("start"))
    yield {name: s.url for name, s in launchers.items()}
    loop.run_until_complete(each("stop", grace_s=2))
    loop.close()


def shape_of(model_dir) -> RoutingShape:
    return RoutingShape.of_hf_config(json.loads((model_dir / "config.json").read_text()))


def generate(url, shape, request):
    async def main():
        engine = SGLangEngine([url], routing=shape)
        try:
            return await engine.generate(request)
        finally:
            await engine.aclose()
    return asyncio.run(main())


def test_routing_of_every_prompt_and_output_token_through_the_standin(servers, model_dir):
    from transformers import AutoModelForCausalLM

    shape = shape_of(model_dir)
    assert shape == RoutingShape(num_layers=2, top_k=2, num_experts=4)
    request = GenerationRequest(PROMPT, SamplingParams(temperature=1.0, max_new_tokens=6, seed=3, ignore_eos=True))
    assert "return_routed_experts" not in generate_payload(request, "r")
    assert generate_payload(request, "r", return_routed_experts=True)["return_routed_experts"] is True
    result = generate(servers["with"], shape, request)
    sequence = [*PROMPT, *result.token_ids]
    assert result.routed_experts.array.shape == (len(sequence) - 1, 2, 2)
    assert result.routed_experts.array.dtype == np.uint8
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    got = result.routed_experts.to_tensor().sort(dim=-1).values
    assert (got == reference_routing(model, sequence)).all()


def test_a_server_without_the_flag_is_refused_by_name(servers, model_dir):
    request = GenerationRequest(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=3, ignore_eos=True))
    with pytest.raises(SGLangProtocolError, match="--enable-return-routed-experts"):
        generate(servers["without"], shape_of(model_dir), request)


def test_sglang_encoding_is_decoded_and_checked():
    """A body in SGLang 0.5.23's shape: int32 little-endian ids, base64 (pybase64.b64encode)."""
    shape = RoutingShape(num_layers=48, top_k=8, num_experts=128)
    request = GenerationRequest((1, 2, 3), SamplingParams(max_new_tokens=4))
    ids = np.random.default_rng(1).integers(0, 128, size=(3 + 2 - 1, 48, 8)).astype("<i4")
    body = {"output_ids": [7, 2], "meta_info": {
        "id": "r", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 3, "completion_tokens": 2,
        "cached_tokens": 0, "weight_version": "default",
        "output_token_logprobs": [[-0.1, 7, None], [-0.2, 2, None]],
        "routed_experts": base64.b64encode(ids.tobytes()).decode("utf-8")}}
    result = parse_generate_response(body, request, routing=shape)
    assert np.array_equal(result.routed_experts.array, ids) and result.routed_experts.nbytes == 4 * 384
    assert parse_generate_response(body, request).routed_experts is None  # not asked for: not read
    body["meta_info"]["routed_experts"] = base64.b64encode(ids[:-1].tobytes()).decode("utf-8")
    with pytest.raises(SGLangProtocolError, match="expected prompt \\+ output - 1 = 4"):
        parse_generate_response(body, request, routing=shape)
