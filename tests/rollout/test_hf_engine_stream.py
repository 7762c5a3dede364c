"""``HFEngine.generate_stream``: tokens leave the engine as they are decoded, the stream adds up to
exactly what ``generate`` returns, and a caller that stops iterating frees its batch slot.

The worker thread is held at a chosen forward (``pause_at_forward`` from the engine tests), so
"before the generation finished" is an ordering of events, not of time.
"""

from __future__ import annotations

import asyncio

import pytest

from spade.rollout.engine import (GenerationChunk, GenerationRequest, GenerationResult, RolloutEngine,
                                  SamplingParams, join_chunks)
from test_rollout_engine import PROMPTS, make_engine, pause_at_forward, request, until_set

pytestmark = pytest.mark.timeout(120)


async def collect(engine, req) -> list[GenerationChunk]:
    return [chunk async for chunk in engine.generate_stream(req)]


def test_stream_adds_up_to_generate_and_leaves_companions_unchanged():
    engine = make_engine()
    batch = [request(PROMPTS[0], temperature=1.0, max_new_tokens=20, seed=7),
             request(PROMPTS[1], temperature=0.8, top_p=0.9, max_new_tokens=12, seed=8),
             request(PROMPTS[2], temperature=0.0, max_new_tokens=16)]

    async def plain():
        return await asyncio.gather(*(engine.generate(r) for r in batch))

    async def first_two_streamed():
        return await asyncio.gather(collect(engine, batch[0]), collect(engine, batch[1]),
                                    engine.generate(batch[2]))

    expected = asyncio.run(plain())
    streamed = asyncio.run(first_two_streamed())
    assert engine.stats.batch_sizes == [3, 3]  # the same batch both times
    for chunks in streamed[:2]:
        assert len(chunks) > 2  # really in pieces
        assert all(c.finish_reason is None for c in chunks[:-1]) and chunks[-1].last
    # same batch, same rows: bit for bit the same tokens, log-probs, finish and version
    assert [join_chunks(streamed[0]), join_chunks(streamed[1]), streamed[2]] == expected
    engine.close()


def test_first_chunk_arrives_while_the_worker_is_held():
    engine = make_engine()
    reached, go = pause_at_forward(engine.model, 4)  # prefill + 2 decode steps, then hold

    async def main():
        stream = engine.generate_stream(request(PROMPTS[0], temperature=0.0, max_new_tokens=30))
        first = await stream.__anext__()
        await until_set(reached)
        # the worker is held inside its 4th forward: 3 tokens exist, 27 are still to come
        got = list(first.token_ids)
        while len(got) < 3:
            got += (await stream.__anext__()).token_ids
        assert engine.stats.forward_calls == 4 and engine.stats.running == 1
        assert first.finish_reason is None and len(got) == 3
        go.set()
        rest = [c async for c in stream]
        return got, rest

    got, rest = asyncio.run(main())
    whole = asyncio.run(engine.generate(request(PROMPTS[0], temperature=0.0, max_new_tokens=30)))
    assert got + [t for c in rest for t in c.token_ids] == list(whole.token_ids)
    assert rest[-1].finish_reason == "length"
    engine.close()


def test_closing_the_stream_stops_its_row_and_the_batch_goes_on():
    engine = make_engine()
    reached, go = pause_at_forward(engine.model, 3)
    companion = request(PROMPTS[1], temperature=1.0, max_new_tokens=20, seed=3)

    async def main():
        stream = engine.generate_stream(request(PROMPTS[0], temperature=1.0, max_new_tokens=100, seed=1))
        other = asyncio.ensure_future(engine.generate(companion))
        await stream.__anext__()
        await until_set(reached)
        await stream.aclose()  # the client went away while the worker is held
        go.set()
        done = await other
        return done

    done = asyncio.run(main())
    assert engine.stats.batch_sizes == [2]
    assert engine.stats.aborted == 1 and engine.stats.running == 0
    # the streamed row left after its 3rd token; the companion ran its 20 tokens alone:
    # 1 prefill + 19 decode forwards, not the 100 the streamed row asked for
    assert engine.stats.forward_calls == 20
    assert engine.stats.generated_tokens == 3 + 20
    alone = asyncio.run(engine.generate(companion))
    assert done.token_ids == alone.token_ids and done.finish_reason == "length"
    engine.close()


def test_engine_close_ends_a_stream_with_abort_keeping_its_tokens():
    engine = make_engine()
    reached, go = pause_at_forward(engine.model, 3)

    async def main():
        stream = engine.generate_stream(request(PROMPTS[0], temperature=0.0, max_new_tokens=50))
        first = asyncio.ensure_future(stream.__anext__())  # a generator starts when iterated
        await until_set(reached)
        engine.close()
        go.set()
        return [await first] + [c async for c in stream]

    chunks = asyncio.run(main())
    result = join_chunks(chunks)
    assert result.finish_reason == "abort" and len(result.token_ids) == 3


class WholeOnly(RolloutEngine):
    """An engine without its own streaming: the interface's default applies."""

    weight_version = 4

    async def generate(self, req):
        return GenerationResult((1, 2, 3), (-0.1, -0.2, -0.3), "stop", 4)

    async def update_weights(self, named_tensors, version):
        raise NotImplementedError

    def close(self):
        pass


def test_default_stream_is_the_whole_completion_in_one_chunk():
    req = GenerationRequest((5,), SamplingParams())
    chunks = asyncio.run(collect(WholeOnly(), req))
    assert chunks == [GenerationChunk((1, 2, 3), (-0.1, -0.2, -0.3), "stop", 4)]
    with pytest.raises(ValueError, match="without a last chunk"):
        join_chunks([GenerationChunk((1,), (-0.1,))])
    with pytest.raises(ValueError, match="come together"):
        GenerationChunk((1,), (-0.1,), "stop")
