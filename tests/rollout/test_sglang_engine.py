"""SGLangEngine against a stdlib HTTP test double of SGLang's native API.

SGLang cannot run without a GPU, so each "server" here is a ThreadingHTTPServer on 127.0.0.1
answering /generate with responses of the shape tokenizer_manager.py builds (see
tests/rollout/test_sglang_protocol.py) and recording every control call. A test that needs a request to be
in flight holds it at the server (``hold``) and waits for its arrival (``arrived``): events, not
sleeps, order what the engine sees.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from spade.rollout.engine import EngineClosed, GenerationRequest, SamplingParams
from spade.rollout.sglang.engine import NoHealthyServer, SGLangEngine
from support.http import JsonHandler, LocalServer


class FakeSGLang:
    def __init__(self, name: str, log: list, delay: float = 0.02):
        self.name, self.log, self.delay = name, log, delay
        self.generate_count = 0
        self.fail_next = 0  # close the connection without replying this many times
        self.all_failed = threading.Event()  # set once the last of those has failed
        self.hold: threading.Event | None = None  # when given, /generate answers only once it is set
        self.arrived = threading.Event()  # a /generate request reached the server
        self.lock = threading.Lock()
        fake = self

        class Handler(JsonHandler):
            protocol_version = "HTTP/1.1"

            def _reply(self, code, obj):
                try:
                    self.send_json(code, obj)
                except OSError:  # the client went away (engine closed)
                    pass

            def do_GET(self):
                self._reply(200, None)

            def do_POST(self):
                payload = self.read_json()
                with fake.lock:
                    fake.log.append((fake.name, self.path, payload))
                    fail = fake.fail_next > 0
                    if fail:
                        fake.fail_next -= 1
                        if fake.fail_next == 0:
                            fake.all_failed.set()
                if self.path != "/generate":
                    return self._reply(200, {"success": True, "message": ""} if "weights" in self.path else None)
                with fake.lock:
                    fake.generate_count += 1
                fake.arrived.set()
                if fail:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fake.hold is not None:
                    fake.hold.wait(60)
                else:
                    time.sleep(fake.delay)
                with fake.lock:
                    fake.log.append((fake.name, "/generate answered", payload))
                sp = payload["sampling_params"]
                last = payload["input_ids"][-1]
                k = min(3, sp["max_new_tokens"])
                ids = [last + i + 1 for i in range(k)]
                self._reply(200, {
                    "text": "",
                    "output_ids": ids,
                    "meta_info": {
                        "id": payload["rid"],
                        "finish_reason": {"type": "length", "length": k},
                        "prompt_tokens": len(payload["input_ids"]),
                        "weight_version": "default",
                        "completion_tokens": k,
                        "cached_tokens": 0,
                        "output_token_logprobs": [[-0.5 * (i + 1), t, None] for i, t in enumerate(ids)],
                    },
                })

        self.server = LocalServer(Handler)
        self.url = self.server.url

    def stop(self):
        if self.hold is not None:
            self.hold.set()
        self.server.close()


@pytest.fixture
def servers():
    log: list = []
    fakes = [FakeSGLang("a", log), FakeSGLang("b", log)]
    yield fakes, log
    for f in fakes:
        f.stop()


async def arrival(fake: FakeSGLang) -> None:
    """Until a /generate request has reached ``fake`` (a generous deadline, not an ordering sleep)."""
    assert await asyncio.to_thread(fake.arrived.wait, 30), "no request reached the server"


def dead_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def req(last: int = 10) -> GenerationRequest:
    return GenerationRequest(prompt_ids=(1, last), sampling=SamplingParams(max_new_tokens=8, seed=1))


def test_generate_result(servers):
    (a, b), _ = servers
    eng = SGLangEngine([a.url])
    r = asyncio.run(eng.generate(req(10)))
    assert r.token_ids == (11, 12, 13) and r.logprobs == (-0.5, -1.0, -1.5)
    assert r.finish_reason == "length" and r.weight_version == 0


def test_load_balanced_and_concurrent(servers):
    (a, b), _ = servers
    eng = SGLangEngine([a.url, b.url])

    async def main():
        return await asyncio.gather(*(eng.generate(req(i * 10)) for i in range(40)))

    results = asyncio.run(main())
    assert [r.token_ids[0] for r in results] == [i * 10 + 1 for i in range(40)]
    assert a.generate_count + b.generate_count == 40
    assert abs(a.generate_count - b.generate_count) <= 2
    assert all(s.in_flight == 0 for s in eng.servers)


def test_affinity_sticky(servers):
    (a, b), _ = servers
    eng = SGLangEngine([a.url, b.url])

    async def main():
        # episode-1 and episode-2 start together (spread by load), then each keeps its server
        await asyncio.gather(eng.generate_with_affinity(req(), "ep1"), eng.generate_with_affinity(req(), "ep2"))
        first = (eng.server_for("ep1"), eng.server_for("ep2"))
        for _ in range(3):
            await asyncio.gather(
                *(eng.generate_with_affinity(req(), "ep1") for _ in range(3)),
                eng.generate_with_affinity(req(), "ep2"),
            )
        return first

    s1, s2 = asyncio.run(main())
    assert s1 != s2
    assert (eng.server_for("ep1"), eng.server_for("ep2")) == (s1, s2)
    counts = {a.url: a.generate_count, b.url: b.generate_count}
    assert counts[s1] == 10 and counts[s2] == 4
    eng.forget_affinity("ep1")
    assert eng.server_for("ep1") is None


def test_retry_on_dead_server(servers):
    (a, b), _ = servers
    eng = SGLangEngine([dead_url(), b.url], max_retries=1)

    async def main():
        return await asyncio.gather(*(eng.generate_with_affinity(req(), f"ep{i}") for i in range(6)))

    results = asyncio.run(main())
    assert len(results) == 6 and b.generate_count == 6
    assert eng.servers[0].failures >= 1
    assert all(eng.server_for(f"ep{i}") == b.url for i in range(6))  # affinity moved


def test_retry_when_request_fails_midway(servers):
    (a, b), _ = servers
    a.fail_next = 1
    eng = SGLangEngine([a.url, b.url])
    r = asyncio.run(eng.generate_with_affinity(req(), "ep"))
    assert r.token_ids == (11, 12, 13)
    assert (a.generate_count, b.generate_count) == (1, 1)


def test_all_dead_raises():
    eng = SGLangEngine([dead_url(), dead_url()], max_retries=2)
    with pytest.raises(NoHealthyServer):
        asyncio.run(eng.generate(req()))


def test_release_resume_order(servers):
    (a, b), log = servers
    updates = []

    async def updater(engine, named, version):
        await engine.post_all("update_weights_from_tensor", {"serialized_named_tensors": [], "weight_version": str(version)})
        updates.append(version)

    eng = SGLangEngine([a.url, b.url], weight_updater=updater)

    async def main():
        await eng.generate(req())
        await eng.release_memory()
        await eng.resume_and_update([], 5)
        r = await eng.generate(req())
        await eng.release_memory()
        await eng.resume_memory()
        return r

    r = asyncio.run(main())
    assert updates == [5] and eng.weight_version == 5 and r.weight_version == 5
    for name in ("a", "b"):
        calls = [(p, body) for n, p, body in log if n == name and not p.startswith("/generate")]
        assert calls == [
            ("/pause_generation", {"mode": "abort"}),
            ("/release_memory_occupation", {"tags": ["weights", "kv_cache"]}),
            ("/resume_memory_occupation", {"tags": ["weights"]}),
            ("/update_weights_from_tensor", {"serialized_named_tensors": [], "weight_version": "5"}),
            ("/resume_memory_occupation", {"tags": ["kv_cache"]}),
            ("/continue_generation", {}),
            ("/pause_generation", {"mode": "abort"}),
            ("/release_memory_occupation", {"tags": ["weights", "kv_cache"]}),
            ("/resume_memory_occupation", {"tags": ["weights"]}),
            ("/resume_memory_occupation", {"tags": ["kv_cache"]}),
            ("/continue_generation", {}),
        ]


def test_release_drains_and_blocks_new_requests(servers):
    (a, b), log = servers
    a.hold = threading.Event()
    eng = SGLangEngine([a.url])

    async def main():
        inflight = asyncio.ensure_future(eng.generate(req()))
        await arrival(a)
        releasing = asyncio.ensure_future(eng.release_memory())
        # the request is held at the server: release must wait for it (a wait that only a broken
        # release could cut short; a slow machine cannot make this fail)
        done, _ = await asyncio.wait({releasing}, timeout=0.2)
        assert not done and not any(p == "/pause_generation" for _n, p, _b in log)
        a.hold.set()
        await asyncio.wait_for(releasing, 30)  # waits for the in-flight request
        assert inflight.done()
        a.arrived.clear()
        later = asyncio.ensure_future(eng.generate(req()))
        done, _ = await asyncio.wait({later}, timeout=0.2)
        assert not done and not a.arrived.is_set()  # held by the engine while memory is released
        await eng.resume_memory()
        return await asyncio.wait_for(later, 30)

    asyncio.run(main())
    paths = [p for _n, p, _b in log]
    assert paths.index("/pause_generation") > paths.index("/generate answered")
    assert paths[-2:] == ["/generate", "/generate answered"] and paths[-3] == "/continue_generation"


def test_close_aborts_in_flight(servers):
    (a, b), log = servers
    a.hold = threading.Event()  # never answers within the test: only the abort can end the request
    eng = SGLangEngine([a.url])

    async def main():
        t = asyncio.ensure_future(eng.generate(req()))
        await arrival(a)
        await eng.aclose()
        return await asyncio.wait_for(t, 30)

    r = asyncio.run(main())
    assert r.finish_reason == "abort" and r.token_ids == ()
    assert any(p == "/abort_request" for _n, p, _b in log)
    assert not any(p == "/generate answered" for _n, p, _b in log)
    with pytest.raises(EngineClosed):
        asyncio.run(eng.generate(req()))


def test_request_affinity_field_pins_episode(servers):
    (a, b), _ = servers
    eng = SGLangEngine([a.url, b.url])

    async def main():
        await asyncio.gather(*(eng.generate(GenerationRequest((1, 5), SamplingParams(max_new_tokens=4),
                                                              affinity="episode")) for _ in range(6)))

    asyncio.run(main())
    assert sorted([a.generate_count, b.generate_count]) == [0, 6]


def test_failure_hook_recovers_and_retries_on_same_server(servers):
    """The hook stands for the trainer's restart: the failed request waits for it, then is re-sent
    to the recovered server (not elsewhere); concurrent failures share one hook call per server."""
    (a, b), _ = servers
    a.fail_next = 3
    calls = []

    async def recover(index):  # the restart completes once all three requests have failed
        calls.append(index)
        assert await asyncio.to_thread(a.all_failed.wait, 30)

    eng = SGLangEngine([a.url, b.url], on_server_failure=recover, max_retries=3)

    async def main():
        return await asyncio.gather(*(eng.generate_with_affinity(req(), "ep") for _ in range(3)))

    results = asyncio.run(main())
    assert all(r.token_ids == (11, 12, 13) for r in results)
    assert b.generate_count == 0 and a.generate_count == 6  # 3 failed + 3 retried on a
    assert calls and set(calls) == {0}
    assert eng.servers[0].healthy(time.monotonic())


def test_failing_hook_sends_request_elsewhere(servers):
    (a, b), _ = servers
    a.fail_next = 1

    async def recover(index):
        raise RuntimeError("cannot restart")

    eng = SGLangEngine([a.url, b.url], on_server_failure=recover)
    r = asyncio.run(eng.generate_with_affinity(req(), "ep"))
    assert r.token_ids == (11, 12, 13) and (a.generate_count, b.generate_count) == (1, 1)


def test_post_to_selected_servers(servers):
    (a, b), log = servers
    eng = SGLangEngine([a.url, b.url])
    asyncio.run(eng.post_to([1], "flush_cache", None))
    asyncio.run(eng.post_to([0, 1], "update_weights_from_tensor",
                            lambda i: {"serialized_named_tensors": [str(i)]}))
    assert log[0][:2] == ("b", "/flush_cache") and len(log) == 3
    bodies = {name: body for name, path, body in log if path == "/update_weights_from_tensor"}
    assert bodies == {"a": {"serialized_named_tensors": ["0"]}, "b": {"serialized_named_tensors": ["1"]}}


def test_update_weights_without_an_updater_is_refused(servers):
    """The engine does not reach for a transport of its own: without a ``weight_updater`` the update
    is refused with the way out, and no server is called."""
    (a, b), log = servers
    eng = SGLangEngine([a.url, b.url])
    with pytest.raises(RuntimeError, match="no weight_updater.*IpcWeightUpdater"):
        asyncio.run(eng.update_weights([], 3))
    assert log == [] and eng.weight_version == 0
