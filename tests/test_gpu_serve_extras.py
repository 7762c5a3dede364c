"""The GPU half of ``spade serve``'s top log-probs and constrained decoding (the CPU suite runs them
against the hf engine on CPU and the SGLang stand-in: tests/serve/test_serve_top_logprobs.py,
tests/rollout/test_sglang_top_logprobs.py, tests/serve/test_constrained_decoding.py,
tests/rollout/test_sglang_constrained.py).

* Real SGLang (test_gpu_sglang's server and scorer): ``top_logprobs_num`` comes back as
  ``meta_info.output_top_logprobs`` and every alternative's log-prob equals transformers' at the
  request's temperature within bf16 noise, most likely first, the sampled token first under greedy.
* The hf engine on CUDA: constrained rows (the grammar's bitmask is filled on the CPU and the
  masked logits go back to the GPU) always parse and validate, with top log-probs on.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from test_gpu_sglang import MAX_ABS, PROMPT, qwen3_dir, scorer, server, sglang_installed  # noqa: F401

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]


def test_real_sglang_top_logprobs(server, scorer):  # noqa: F811
    from spade.rollout.engine import GenerationRequest, SamplingParams
    from spade.rollout.sglang.engine import SGLangEngine

    loop, launcher = server
    cases = [(0.0, GenerationRequest(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=16,
                                                             ignore_eos=True, top_logprobs=5))),
             (0.7, GenerationRequest(PROMPT, SamplingParams(temperature=0.7, max_new_tokens=16,
                                                             ignore_eos=True, seed=3, top_logprobs=5)))]

    async def run():
        engine = SGLangEngine([launcher.url])
        try:
            return [await engine.generate(request) for _, request in cases]
        finally:
            await engine.aclose()

    for (temperature, request), result in zip(cases, loop.run_until_complete(run())):
        assert len(result.top_logprobs) == len(result.token_ids) == 16
        scorer.model.load_state_dict(scorer.original)
        ids = torch.tensor([list(PROMPT) + list(result.token_ids)], device="cuda")
        with torch.no_grad():
            logits = scorer.model(ids).logits[0, len(PROMPT) - 1:-1].float()
        logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1).cpu()
        for position, (token, top) in enumerate(zip(result.token_ids, result.top_logprobs)):
            assert len(top) == 5
            values = [v for _, v in top]
            assert values == sorted(values, reverse=True)
            for alternative, value in top:
                assert abs(logp[position, alternative].item() - value) <= MAX_ABS
            if temperature == 0.0:
                assert top[0][0] == token


def test_hf_engine_constrained_on_cuda():
    import jsonschema
    from chat_templates import bpe_tokenizer
    from spade.rollout.engine import Constraint, GenerationRequest, SamplingParams
    from spade.rollout.hf.engine import HFEngine
    from support.models import tiny_qwen3

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "k": {"enum": ["a", "b"]}},
              "required": ["n", "k"], "additionalProperties": False}
    tokenizer = bpe_tokenizer()
    engine = HFEngine((tiny_qwen3(tokenizer, max_position_embeddings=1024, randomize=True), tokenizer), device="cuda",
                      eos_token_ids=[tokenizer.eos_token_id])
    prompt = tuple(tokenizer("hello there", add_special_tokens=False)["input_ids"])
    requests = [GenerationRequest(prompt, SamplingParams(temperature=1.0, seed=seed, max_new_tokens=600,
                                                         top_logprobs=3,
                                                         constraint=Constraint("json_schema", json.dumps(schema))))
                for seed in range(4)]

    async def run():
        return await asyncio.gather(*(engine.generate(r) for r in requests))

    try:
        results = asyncio.run(run())
    finally:
        engine.close()
    for result in results:
        assert result.finish_reason == "stop"
        jsonschema.validate(json.loads(tokenizer.decode(result.token_ids, skip_special_tokens=True)), schema)
        for token, logprob, top in zip(result.token_ids, result.logprobs, result.top_logprobs):
            assert 1 <= len(top) <= 3 and all(v > float("-inf") for _, v in top)  # masked tokens left out
            assert token in [t for t, _ in top] or logprob <= top[-1][1] + 1e-5
