"""The hf engine prefills a batch's prompts in groups of rows (``prefill_chunk_tokens``).

Reference: the same engine and batch with every row in one prefill forward (``prefill_chunk_tokens=0``).
The chunked batch must give the same tokens and, to float rounding, the same log-probs (only the
number of rows in a matrix product differs), with and without a shared prefix, for joiners too,
and no prefill forward may hold more padded tokens than the setting allows. Tiny random models
of test_rollout_engine.
"""

from __future__ import annotations

import asyncio

import pytest

from spade.rollout import GenerationRequest, HFEngine, SamplingParams
from spade.rollout.settings import EngineSection
from spade.config import ConfigError
from test_hf_engine_prefix import PREFIX, run_batch
from test_rollout_engine import tiny_model

OWN = [[(5 * i + 3 * j) % 180 + 7 for j in range(3 + 4 * i)] for i in range(6)]


def sampling(i: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, top_k=20, max_new_tokens=10, seed=40 + i)


def prefill_shapes(engine: HFEngine) -> list[tuple[int, int]]:
    """Record ``[rows, tokens]`` of every forward that computes more than one token per row."""
    shapes: list[tuple[int, int]] = []

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] > 1:
            shapes.append(tuple(ids.shape))

    engine.model.register_forward_pre_hook(hook, with_kwargs=True)
    return shapes


def assert_same_generations(got, expected) -> None:
    """Equal tokens; log-probs equal to float rounding (only the rows per matrix product differ)."""
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


@pytest.mark.parametrize("model_name", ["qwen3", "llama-tied"])
@pytest.mark.parametrize("shared", [False, True])
def test_rows_prefilled_in_chunks_equal_one_pass(model_name, shared):
    prompts = [(PREFIX if shared else []) + own for own in OWN]
    width = max(len(own) for own in OWN)
    one_pass = HFEngine(tiny_model(model_name), max_batch_size=8, batch_wait_ms=200.0, eos_token_ids=(),
                        prefill_chunk_tokens=0)
    chunked = HFEngine(tiny_model(model_name), max_batch_size=8, batch_wait_ms=200.0, eos_token_ids=(),
                       prefill_chunk_tokens=2 * width)
    shapes = prefill_shapes(chunked)
    try:
        expected = run_batch(one_pass, prompts, sampling)
        got = run_batch(chunked, prompts, sampling)
        assert one_pass.stats.batch_sizes == chunked.stats.batch_sizes == [len(prompts)]
        assert chunked.stats.shared_prefix_tokens == (len(PREFIX) * (len(prompts) - 1) if shared else 0)
        row_shapes = [s for s in shapes if s[1] == width]
        assert [rows for rows, _ in row_shapes] == [2, 2, 2]  # the rows' part in three forwards
        assert_same_generations(got, expected)
    finally:
        one_pass.close()
        chunked.close()


def test_joiners_are_prefilled_in_chunks_too():
    """Requests that arrive while a batch decodes join it; their prompts are chunked the same way."""
    first, later = OWN[:1], OWN[1:]

    def run(engine: HFEngine):
        async def go():
            running = asyncio.ensure_future(engine.generate(GenerationRequest(
                tuple(first[0]), SamplingParams(temperature=0.0, max_new_tokens=30))))
            while engine.stats.running == 0:  # the first batch is decoding
                await asyncio.sleep(0)
            joined = await asyncio.gather(*(engine.generate(GenerationRequest(tuple(p), sampling(i)))
                                            for i, p in enumerate(later)))
            return [await running, *joined]

        return asyncio.run(go())

    one_pass = HFEngine(tiny_model("qwen3"), max_batch_size=8, eos_token_ids=(), prefill_chunk_tokens=0)
    chunked = HFEngine(tiny_model("qwen3"), max_batch_size=8, eos_token_ids=(), prefill_chunk_tokens=1)
    shapes = prefill_shapes(chunked)
    try:
        expected, got = run(one_pass), run(chunked)
        assert sum(chunked.stats.join_sizes) == len(later)
        assert all(rows == 1 for rows, _ in shapes)  # one row per forward
        assert_same_generations(got, expected)
    finally:
        one_pass.close()
        chunked.close()


def test_a_negative_chunk_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="engine.prefill_chunk_tokens"):
        EngineSection(prefill_chunk_tokens=-1)
    with pytest.raises(ValueError, match="prefill_chunk_tokens"):
        HFEngine(tiny_model("qwen3"), prefill_chunk_tokens=-5)
