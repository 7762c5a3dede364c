"""Top log-probs over SGLang: the engine asks with ``top_logprobs_num`` and reads
``meta_info.output_top_logprobs``, whole and streamed (both event formats), against the SGLang
stand-in (tests/sglang_standin: SGLang's shape over a real tiny model), checked against
transformers' own logits; and the parse of a response body written in SGLang 0.5.23's shape
(``TokenizerManager.detokenize_top_logprobs_tokens``: per token ``[logprob, token_id, text]``
lists, most likely first, ``null`` for a position without any).

A real SGLang server needs a GPU, which this machine lacks; the stand-in speaks its format.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from test_serve_sglang import collect, model_dir, standins  # noqa: F401
from spade.rollout.engine import GenerationRequest, SamplingParams, join_chunks
from spade.rollout.sglang.engine import SGLangEngine
from spade.rollout.sglang.protocol import SGLangProtocolError, generate_payload, parse_generate_response

pytestmark = pytest.mark.timeout(180)

PROMPT = (3, 9, 4, 17)


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
def test_top_logprobs_through_the_standin(standins, model_dir, mode):  # noqa: F811
    from transformers import AutoModelForCausalLM

    request = GenerationRequest(PROMPT, SamplingParams(temperature=0.8, top_k=1, max_new_tokens=8,
                                                       ignore_eos=True, top_logprobs=4))
    assert generate_payload(request, "r1")["top_logprobs_num"] == 4

    async def main():
        engine = SGLangEngine([standins[mode]])
        try:
            return await engine.generate(request), await collect(engine, request)
        finally:
            await engine.aclose()

    whole, chunks = asyncio.run(main())
    assert join_chunks(chunks).top_logprobs == whole.top_logprobs
    assert len(whole.top_logprobs) == len(whole.token_ids) == 8
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([list(PROMPT) + list(whole.token_ids)])).logits[0]
    logp = torch.log_softmax(logits[len(PROMPT) - 1:-1] / 0.8, dim=-1)
    values, ids = torch.topk(logp, 4, dim=-1)
    for token, top, want_ids, want_values in zip(whole.token_ids, whole.top_logprobs, ids, values):
        assert [t for t, _ in top] == want_ids.tolist()
        assert [v for _, v in top] == pytest.approx(want_values.tolist(), abs=1e-4)
        assert top[0][0] == token  # top_k=1: the most likely token is the one sampled


def test_sglang_response_shape():
    request = GenerationRequest((1, 2), SamplingParams(max_new_tokens=4, top_logprobs=2))
    body = {"output_ids": [7, 8, 2], "meta_info": {
        "id": "r", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 2,
        "completion_tokens": 3, "cached_tokens": 0, "weight_version": "default",
        "output_token_logprobs": [[-0.1, 7, "a"], [-0.5, 8, "b"], [-0.2, 2, "</s>"]],
        "output_top_logprobs": [[[-0.1, 7, "a"], [-2.5, 9, "c"]], None,
                                [[-0.2, 2, "</s>"], [-1.9, 7, "a"]]]}}
    result = parse_generate_response(body, request)
    assert result.top_logprobs == (((7, -0.1), (9, -2.5)), (), ((2, -0.2), (7, -1.9)))
    assert parse_generate_response(body, GenerationRequest((1, 2), SamplingParams(max_new_tokens=4))
                                   ).top_logprobs == ()
    body["meta_info"]["output_top_logprobs"][2][1][0] = None  # a masked token (-inf) written as null
    assert parse_generate_response(body, request).top_logprobs[2] == ((2, -0.2),)
    body["meta_info"]["output_top_logprobs"] = body["meta_info"]["output_top_logprobs"][:2]
    with pytest.raises(SGLangProtocolError, match="output_top_logprobs"):
        parse_generate_response(body, request)
