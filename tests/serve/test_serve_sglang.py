"""Streaming over SGLang: ``SGLangEngine.generate_stream`` against the SGLang stand-in
(tests/sglang_standin/server.py, a subprocess speaking SGLang's event-stream format over a real
model), in both of SGLang's streaming modes (cumulative events, the default, and
``--incremental-streaming-output`` deltas), and ``spade serve`` streaming in front of it.

Ordering is by events: the stand-in holds its worker thread inside a chosen forward
(``/spade_standin/hold``) while the test reads the first chunk and hangs up.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

import pytest

from sglang_standin import standin_argv
from spade.rollout.engine import GenerationRequest, SamplingParams, join_chunks
from spade.rollout.sglang.launcher import ServerLauncher, free_port, sglang_argv
from spade.rollout.sglang.engine import SGLangEngine
from support.models import tiny_hf_dir_fixture

pytestmark = pytest.mark.timeout(180)

REQUESTS = [
    GenerationRequest((3, 9, 4, 17), SamplingParams(temperature=0.0, max_new_tokens=12)),
    GenerationRequest((5, 6), SamplingParams(temperature=1.0, max_new_tokens=20, seed=5, ignore_eos=True)),
]


model_dir = tiny_hf_dir_fixture("qwen3")  # a module fixture: the tiny model saved once


@pytest.fixture(scope="module")
def standins(model_dir, tmp_path_factory):
    """Two stand-ins: cumulative events and incremental ones, started together."""
    logs = tmp_path_factory.mktemp("logs")
    launchers = {}
    for mode, extra in (("cumulative", []), ("incremental", ["--incremental-streaming-output"])):
        port = free_port()
        argv = standin_argv(sglang_argv(model_dir, tp=1, port=port)) + extra
        launchers[mode] = ServerLauncher(argv, port=port, log_path=logs / f"{mode}.log",
                                         start_timeout_s=90, poll_interval_s=0.1)
    async def each(method: str, **kwargs):
        await asyncio.gather(*(getattr(s, method)(**kwargs) for s in launchers.values()))

    loop = asyncio.new_event_loop()
    loop.run_until_complete(each("start"))
    yield {mode: s.url for mode, s in launchers.items()}
    loop.run_until_complete(each("stop", grace_s=2))
    loop.close()


def get(url: str, path: str) -> Any:
    with urllib.request.urlopen(url + path, timeout=10) as answer:
        return json.loads(answer.read())


def post(url: str, path: str, body: dict) -> None:
    request = urllib.request.Request(url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


async def collect(engine, request):
    return [chunk async for chunk in engine.generate_stream(request)]


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
def test_stream_adds_up_to_the_whole_completion(standins, mode):
    async def main():
        engine = SGLangEngine([standins[mode]])
        try:
            out = []
            for request in REQUESTS:
                whole = await engine.generate(request)
                out.append((whole, await collect(engine, request)))
            return out
        finally:
            await engine.aclose()

    for whole, chunks in asyncio.run(main()):
        assert len(chunks) > 2 and all(not c.last for c in chunks[:-1])
        assert join_chunks(chunks) == whole  # ids, log-probs, finish reason, weight version
        assert len(whole.token_ids) > 5


def test_hanging_up_mid_stream_stops_the_generation_on_the_server(standins):
    url = standins["cumulative"]
    before = get(url, "/get_server_info")["standin"]["engine"]
    post(url, "/spade_standin/hold", {"forward": 6})
    request = GenerationRequest((4, 4, 2), SamplingParams(temperature=0.0, max_new_tokens=100,
                                                          ignore_eos=True))

    async def main():
        engine = SGLangEngine([url])
        stream = engine.generate_stream(request)
        try:
            first = await stream.__anext__()
            assert (await asyncio.to_thread(get, url, "/spade_standin/held"))["held"]
            info = (await asyncio.to_thread(get, url, "/get_server_info"))["standin"]
            await stream.aclose()  # the caller goes away while the server's worker is held
            post(url, "/spade_standin/release", {})
            # the next request runs after the abandoned one's batch, so it returns once that ended
            await engine.generate(GenerationRequest((1, 2), SamplingParams(max_new_tokens=1)))
            return first, info
        finally:
            await engine.aclose()

    first, held = asyncio.run(main())
    assert first.token_ids and not first.last  # a token before the generation finished
    assert held["held"] and held["engine"]["running"] == 1
    after = get(url, "/get_server_info")["standin"]["engine"]
    assert after["running"] == 0 and after["aborted"] == before["aborted"] + 1
    assert after["generated_tokens"] - before["generated_tokens"] - 1 < 100
    aborts = [e for e in get(url, "/spade_standin/log") if e["endpoint"] == "/abort_request"]
    assert aborts and aborts[-1]["status"] == 200


def test_spade_serve_streams_over_sglang(standins, model_dir):
    import openai
    from transformers import AutoTokenizer

    from spade.serve.server import BackgroundServer
    from spade.serve.service import ModelService

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    service = ModelService(SGLangEngine([standins["incremental"]]), tokenizer, "tiny",
                           max_context_tokens=128, eos_token_ids=[])
    with BackgroundServer(service) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        args = dict(model="tiny", prompt=[5, 6, 7], max_tokens=16, temperature=0, logprobs=1)
        whole = client.completions.create(**args)
        chunks = list(client.completions.create(stream=True, **args))
    assert len(chunks) > 2
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    streamed = [lp for c in chunks if c.choices[0].logprobs for lp in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(whole.choices[0].logprobs.token_logprobs, abs=1e-6)
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "length"


def test_the_two_event_formats_on_the_wire(standins):
    body = {"input_ids": [5, 6], "sampling_params": {"temperature": 0.0, "max_new_tokens": 8,
                                                      "ignore_eos": True},
            "return_logprob": True, "stream": True}
    events = {}
    for mode, url in standins.items():
        request = urllib.request.Request(url + "/generate", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.headers["Content-Type"].startswith("text/event-stream")
            raw = answer.read().decode().split("\n\n")
        assert raw[-2:] == ["data: [DONE]", ""]
        events[mode] = [json.loads(e[len("data: "):]) for e in raw[:-2]]
    cumulative, incremental = events["cumulative"], events["incremental"]
    whole = cumulative[-1]["output_ids"]
    assert len(whole) == 8 and cumulative[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(whole[:len(e["output_ids"])] == e["output_ids"] for e in cumulative)
    assert [t for e in incremental for t in e["output_ids"]] == whole
    assert all(e["meta_info"]["completion_tokens"] == sum(len(x["output_ids"]) for x in incremental[:i + 1])
               for i, e in enumerate(incremental))


def test_stream_progress_reads_hand_written_events():
    from spade.rollout.sglang import protocol as proto

    request = GenerationRequest((1,), SamplingParams(max_new_tokens=5))

    def event(ids, triples, total, finish=None):
        return {"output_ids": ids, "meta_info": {"completion_tokens": total, "finish_reason": finish,
                                                 "weight_version": "3",
                                                 "output_token_logprobs": triples}}

    lp = {7: -0.5, 8: -1.0, 9: -1.5}
    cumulative = proto.StreamProgress(request)
    got = [cumulative.next_chunk(event([7], [[-0.5, 7, None]], 1)),
           # a slow reader: the event for [7, 8] was dropped, this one is the newest state
           cumulative.next_chunk(event([7, 8, 9], [[lp[t], t, None] for t in (7, 8, 9)], 3,
                                       {"type": "length", "length": 3}))]
    assert [c.token_ids for c in got] == [(7,), (8, 9)] and got[1].logprobs == (-1.0, -1.5)
    assert got[1].finish_reason == "length" and got[1].weight_version == 3 and not got[0].last

    incremental = proto.StreamProgress(request)
    got = [incremental.next_chunk(event([7, 8], [[-0.5, 7, None], [-1.0, 8, None]], 2)),
           incremental.next_chunk(event([9], [[-1.5, 9, None]], 3, {"type": "stop", "matched": 9}))]
    assert [c.token_ids for c in got] == [(7, 8), (9,)] and got[1].finish_reason == "stop"

    with pytest.raises(proto.SGLangProtocolError, match="completion_tokens"):
        proto.StreamProgress(request).next_chunk(event([7], [[-0.5, 7, None]], 4))
    with pytest.raises(proto.SGLangServerError, match="too long"):
        proto.StreamProgress(request).next_chunk({"error": {"message": "too long", "code": 400}})
    with pytest.raises(proto.SGLangServerError, match="HTTP 400"):
        proto.StreamProgress(request).next_chunk(event([], [], 0, {"type": "abort", "message": "bad",
                                                                   "status_code": 400}))
    assert proto.sse_data(b"data: {\"a\": 1}") == '{"a": 1}' and proto.sse_data(b": ping") is None
