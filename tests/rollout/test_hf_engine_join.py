"""Requests that arrive while the hf engine decodes join the running batch at its next step.

The reference for every joined row is the same request generated alone (batch of one): tokens
exactly, log-probs to rounding (seeded sampling). The worker is held inside a chosen forward
(``pause_at_forward``) so that a request is known to arrive mid-batch. Tiny random models of
test_rollout_engine.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from spade.rollout import GenerationRequest, HFEngine, SamplingParams
from test_rollout_engine import PROMPTS, pause_at_forward, tiny_model, until_set

PREFIX = [(5 * i + 7) % 190 + 5 for i in range(30)]


def sampled(prompt, seed: int, max_new_tokens: int = 12) -> GenerationRequest:
    return GenerationRequest(tuple(prompt), SamplingParams(temperature=1.0, top_k=20, max_new_tokens=max_new_tokens,
                                                           seed=seed))


def alone(requests: list[GenerationRequest], name: str = "qwen3"):
    engine = HFEngine(tiny_model(name), max_batch_size=1, eos_token_ids=())
    try:
        async def go():
            return [await engine.generate(r) for r in requests]

        return asyncio.run(go())
    finally:
        engine.close()


def run_with_late_arrivals(engine: HFEngine, first: list[GenerationRequest], late: list[GenerationRequest],
                           hold_at: int = 3):
    """``first`` start a batch; ``late`` are submitted while the worker is held in forward ``hold_at``."""
    reached, go = pause_at_forward(engine.model, hold_at)

    async def main():
        early = [asyncio.ensure_future(engine.generate(r)) for r in first]
        await until_set(reached)
        later = [asyncio.ensure_future(engine.generate(r)) for r in late]
        await asyncio.sleep(0)  # let the late requests reach the queue before the worker goes on
        go.set()
        return await asyncio.gather(*early, *later)

    return asyncio.run(main())


def hold_at_forwards(model, calls: tuple[int, ...]) -> list[tuple[threading.Event, threading.Event]]:
    """Hold the worker inside each of these forward calls (1-based) until the test lets it go."""
    holds = {call: (threading.Event(), threading.Event()) for call in calls}
    count = [0]

    def hook(module, args, out):  # noqa: ARG001
        count[0] += 1
        if count[0] in holds:
            reached, go = holds[count[0]]
            reached.set()
            go.wait(60)

    model.register_forward_hook(hook)
    return [holds[call] for call in calls]


def assert_same(got, expected):
    for a, b in zip(got, expected):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


@pytest.mark.parametrize("name", ["qwen3", "llama-tied"])
def test_late_requests_join_the_running_batch_and_generate_what_they_would_alone(name):
    """Joiners with a longer and a shorter prompt than the batch's columns (both paddings)."""
    first = [sampled(PROMPTS[1], seed=1, max_new_tokens=16)]
    late = [sampled(PROMPTS[2], seed=2), sampled([9, 8, 7], seed=3, max_new_tokens=5)]
    engine = HFEngine(tiny_model(name), max_batch_size=8, eos_token_ids=())
    try:
        got = run_with_late_arrivals(engine, first, late)
        assert engine.stats.batch_sizes == [1] and engine.stats.join_sizes == [2]
        assert engine.stats.running == 0 and engine.stats.sequences == 3
    finally:
        engine.close()
    assert_same(got, alone(first + late, name))


def test_a_full_batch_takes_joiners_only_as_rows_leave():
    first = [sampled(PROMPTS[0], seed=1, max_new_tokens=4), sampled(PROMPTS[1], seed=2, max_new_tokens=10)]
    late = [sampled(PROMPTS[2], seed=3, max_new_tokens=6)]
    engine = HFEngine(tiny_model("qwen3"), max_batch_size=2, eos_token_ids=())
    calls = []
    engine.model.register_forward_hook(lambda module, args, kwargs, out: calls.append(kwargs["input_ids"].shape[0]),
                                       with_kwargs=True)
    try:
        got = run_with_late_arrivals(engine, first, late, hold_at=2)
    finally:
        engine.close()
    # the late request waited until the 4-token row left (after its 4th token), then joined
    assert engine.stats.batch_sizes == [2] and engine.stats.join_sizes == [1]
    assert max(calls) == 2 and calls[:5] == [2, 2, 2, 2, 1]  # prefill, 3 steps, then the joiner's prefill
    assert_same(got, alone(first + late))


def test_joiners_share_the_batch_prefix_as_far_as_their_prompts_allow():
    """The batch attends to a 30-token prefix apart; joiners sharing all of it, part of it
    (the prefix is cut back) and none of it (the prefix goes into every row) all match alone."""
    first = [sampled(PREFIX + [11, 12], seed=1, max_new_tokens=14), sampled(PREFIX + [150, 3, 4], seed=2,
                                                                            max_new_tokens=14)]
    whole = [sampled(PREFIX + [77], seed=3)]
    part = [sampled(PREFIX[:20] + [60, 61, 62], seed=4)]
    none = [sampled([101, 102, 103, 104], seed=5, max_new_tokens=6)]
    engine = HFEngine(tiny_model("qwen3"), max_batch_size=8, batch_wait_ms=200.0, eos_token_ids=())
    assert engine.prefix_attention
    holds = hold_at_forwards(engine.model, (3, 5, 7))

    async def main():
        early = [asyncio.ensure_future(engine.generate(r)) for r in first]
        joined = []
        for (reached, go), group in zip(holds, (whole, part, none)):  # one group joins at each hold
            await until_set(reached)
            joined += [asyncio.ensure_future(engine.generate(r)) for r in group]
            await asyncio.sleep(0)  # the group reaches the queue before the worker goes on
            go.set()
        return await asyncio.gather(*early, *joined)

    try:
        got = asyncio.run(main())
        assert engine.stats.batch_sizes == [2] and engine.stats.join_sizes == [1, 1, 1]
        # the batch's prefix once (30), the whole-prefix joiner (30), the part one after the cut (20)
        assert engine.stats.shared_prefix_tokens == 30 + 30 + 20
    finally:
        engine.close()
    assert_same(got, alone(first + whole + part + none))


def test_a_joiner_that_would_copy_too_much_prefix_into_the_rows_waits_until_they_leave():
    """prefill_chunk_tokens bounds the prefix tokens a join moves into the running rows' caches
    (moved x rows): the joiner sharing 25 of the 30 prefix tokens moves 5 x 3 = 15 <= 30 and joins
    at once; the one that shares nothing would move 25 per running row and joins only when every
    earlier row has left (no copy at all). Results still match alone."""
    first = [sampled(PREFIX + [11, 12], seed=1, max_new_tokens=14), sampled(PREFIX + [150, 3, 4], seed=2,
                                                                            max_new_tokens=14)]
    whole = [sampled(PREFIX + [77], seed=3)]
    part = [sampled(PREFIX[:25] + [60, 61, 62], seed=4)]
    none = [sampled([101, 102, 103, 104], seed=5, max_new_tokens=6)]
    engine = HFEngine(tiny_model("qwen3"), max_batch_size=8, batch_wait_ms=200.0, eos_token_ids=(),
                      prefill_chunk_tokens=30)
    holds = hold_at_forwards(engine.model, (3, 5, 7))
    rows_per_forward: list[tuple[int, list[int]]] = []
    engine.model.register_forward_pre_hook(
        lambda _m, args, kwargs: rows_per_forward.append((kwargs["input_ids"].shape[0], kwargs["input_ids"][0].tolist())),
        with_kwargs=True)

    async def main():
        early = [asyncio.ensure_future(engine.generate(r)) for r in first]
        joined = []
        for (reached, go), group in zip(holds, (whole, part, none)):
            await until_set(reached)
            joined += [asyncio.ensure_future(engine.generate(r)) for r in group]
            await asyncio.sleep(0)
            go.set()
        return await asyncio.gather(*early, *joined)

    try:
        got = asyncio.run(main())
        assert engine.stats.batch_sizes == [2] and engine.stats.join_sizes == [1, 1, 1]
        assert engine.stats.shared_prefix_tokens == 30 + 30 + 25
    finally:
        engine.close()
    joined_at = next(i for i, (_, ids) in enumerate(rows_per_forward) if ids == [101, 102, 103, 104])
    assert rows_per_forward[joined_at - 1][0] > 1  # the earlier rows ran on without it
    assert all(rows == 1 for rows, _ in rows_per_forward[joined_at:])  # it joined an empty batch
    assert_same(got, alone(first + whole + part + none))


def test_a_waiting_weight_update_stops_joins_and_every_result_has_one_version():
    engine = HFEngine(tiny_model("qwen3"), max_batch_size=8, eos_token_ids=())
    reached, go = pause_at_forward(engine.model, 3)
    new_weights = {name: tensor.clone() * 1.01 for name, tensor in tiny_model("qwen3", seed=1).state_dict().items()}

    async def main():
        early = asyncio.ensure_future(engine.generate(sampled(PROMPTS[0], seed=1)))
        await until_set(reached)
        update = asyncio.ensure_future(engine.update_weights(new_weights.items(), version=7))
        await asyncio.sleep(0)  # the update is waiting for the running batch
        late = asyncio.ensure_future(engine.generate(sampled(PROMPTS[1], seed=2)))
        await asyncio.sleep(0)
        go.set()
        return await asyncio.gather(early, late, update)

    try:
        first, second, _ = asyncio.run(main())
        assert engine.stats.batch_sizes == [1, 1] and engine.stats.join_sizes == []
        assert first.weight_version == 0 and second.weight_version == 7
    finally:
        engine.close()


def test_columns_only_finished_rows_used_are_cut_from_the_left():
    """A long-prompt row leaves early; the short row's later steps attend to its own columns only."""
    long_prompt = list(range(3, 43))
    first = [sampled(long_prompt, seed=1, max_new_tokens=2), sampled([5, 6, 7], seed=2, max_new_tokens=10)]
    engine = HFEngine(tiny_model("qwen3"), max_batch_size=8, batch_wait_ms=200.0, eos_token_ids=())
    widths = []
    engine.model.register_forward_hook(
        lambda module, args, kwargs, out: widths.append(kwargs["attention_mask"].shape[-1]), with_kwargs=True)
    try:
        async def go():
            return await asyncio.gather(*(engine.generate(r) for r in first))

        got = asyncio.run(go())
    finally:
        engine.close()
    assert widths[0] == 40 and widths[1] == 41  # prefill, first step: both rows, left-padded to 40
    assert widths[2] == 3 + 2  # the short row's prompt and the two tokens fed to it so far
    assert_same(got, alone(first))
