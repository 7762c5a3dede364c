"""The hf engine's shared prompt prefix: a batch whose prompts start alike computes that prefix once.

The reference is the same engine without sharing: each prompt generated alone (batch of one), whose
tokens and log-probs the shared batch must reproduce (log-probs to rounding, tokens exactly under
greedy decoding and under seeded sampling). Tiny random models of test_rollout_engine.
"""

from __future__ import annotations

import asyncio

import pytest

from spade.rollout import GenerationRequest, HFEngine, SamplingParams
from spade.rollout.hf.scheduler import MIN_SHARED_PREFIX, shared_prefix_length
from test_rollout_engine import tiny_model

PREFIX = [(7 * i + 3) % 190 + 5 for i in range(40)]
PROMPTS = [PREFIX + [11, 12], PREFIX + [190, 2, 64, 64, 8], PREFIX + [150]]


def test_shared_prefix_length():
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 7]]) == 2
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # each row keeps a token of its own
    assert shared_prefix_length([[4, 5], [1, 2]]) == 0


def run_batch(engine: HFEngine, prompts, sampling_for):
    async def go():
        return await asyncio.gather(*(engine.generate(GenerationRequest(tuple(p), sampling_for(i)))
                                      for i, p in enumerate(prompts)))

    return asyncio.run(go())


def model_with_attention(name: str, attention: str):
    model = tiny_model(name)
    model.config._attn_implementation = attention
    return model


@pytest.mark.parametrize("model_name,attention", [("qwen3", "sdpa"), ("qwen3-moe", "sdpa"), ("llama-tied", "sdpa"),
                                                  ("qwen3", "eager")])
@pytest.mark.parametrize("greedy", [True, False])
def test_a_shared_prefix_batch_equals_each_prompt_alone(model_name, attention, greedy):
    """SDPA models attend to the prefix once (prefix_attention); others copy its cache to each row."""
    def sampling(i):
        if greedy:
            return SamplingParams(temperature=0.0, max_new_tokens=12)
        return SamplingParams(temperature=1.0, top_k=20, max_new_tokens=12, seed=100 + i)

    batched = HFEngine(model_with_attention(model_name, attention), max_batch_size=8, batch_wait_ms=200.0,
                       eos_token_ids=())
    alone = HFEngine(model_with_attention(model_name, attention), max_batch_size=1, eos_token_ids=())
    assert batched.prefix_attention == (attention == "sdpa")
    try:
        together = run_batch(batched, PROMPTS, sampling)
        assert batched.stats.batch_sizes == [3]  # one batch: the prefix was shared
        assert batched.stats.shared_prefix_tokens == len(PREFIX) * 2
        single = run_batch(alone, PROMPTS, sampling)
        assert alone.stats.shared_prefix_tokens == 0
        for a, b in zip(together, single):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    finally:
        batched.close()
        alone.close()


def test_prompts_that_share_too_little_are_not_split():
    short = [[3, 4, 5, 6] + [9] * i for i in range(1, 4)]  # 4 shared tokens < MIN_SHARED_PREFIX
    assert shared_prefix_length(short) < MIN_SHARED_PREFIX
    engine = HFEngine(tiny_model("qwen3"), max_batch_size=8, batch_wait_ms=200.0, eos_token_ids=())
    try:
        run_batch(engine, short, lambda i: SamplingParams(temperature=0.0, max_new_tokens=4))
        assert engine.stats.batch_sizes == [3] and engine.stats.shared_prefix_tokens == 0
    finally:
        engine.close()
