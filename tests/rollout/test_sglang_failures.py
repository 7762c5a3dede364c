"""SGLangEngine's declared failure modes and its own weight update, against two stand-in servers
(real subprocesses serving a real model over HTTP; tests/sglang_standin/server.py) with injected
faults: a request that hangs past ``request_timeout_s``, an HTTP 5xx reply, an HTTP 4xx reply, and
the colocated IPC update (one serialization per TP worker) given as the engine's ``weight_updater``."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any, Awaitable, TypeVar

import pytest
import torch

from support.hf_fixtures import tiny_model
from sglang_standin import standin_launcher
from spade.rollout.sglang import protocol as proto
from spade.rollout.sglang import weight_transport
from spade.rollout.engine import GenerationRequest, SamplingParams
from spade.rollout.hf.engine import HFEngine
from spade.rollout.sglang.engine import NoHealthyServer, SGLangEngine
from support.models import tiny_hf_dir_fixture

pytestmark = pytest.mark.timeout(180)
T = TypeVar("T")

GREEDY = GenerationRequest((3, 9, 4, 17), SamplingParams(temperature=0.0, max_new_tokens=4))
# Where no request hangs, the timeout is never meant to fire: far above any healthy answer.
REQUEST_TIMEOUT_S = 60.0
# Where requests hang, the timeout must fire on each hung one (the test then waits for it) and
# never on a healthy one. It is the larger of 3 s and 20x the slowest healthy answer measured
# just before on the same servers (a cold first request, so an overestimate): a loaded CI machine
# that answers slowly gets a proportionally longer timeout instead of a spurious third retry,
# and a hung request still takes the whole timeout, so "exactly two retries" keeps its meaning.
HANG_TIMEOUT_FLOOR_S = 3.0
HEALTHY_MARGIN = 20.0


class Servers:
    """Server A (tp 2) and server B (tp 1) on one event loop for the module."""

    def __init__(self, model_dir: Path, log_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.launchers = [standin_launcher(model_dir, tp=2, log_path=log_dir / "a.log"),
                          standin_launcher(model_dir, tp=1, log_path=log_dir / "b.log")]
        self.run(self.each(lambda launcher: launcher.start()))

    async def each(self, call) -> None:
        await asyncio.gather(*(call(launcher) for launcher in self.launchers))

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.launchers]

    def run(self, awaitable: Awaitable[T], timeout: float = 120) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(awaitable, timeout))

    def request(self, index: int, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.urls[index] + path, data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def fault(self, index: int, endpoint: str, **fault: Any) -> None:
        self.request(index, "/spade_standin/fault", {"endpoint": endpoint, **fault})

    def standin(self, index: int) -> dict:
        return self.request(index, "/get_server_info")["standin"]

    def log(self, index: int) -> list[dict]:
        return self.request(index, "/spade_standin/log")


model_dir = tiny_hf_dir_fixture("qwen3")  # a module fixture: the tiny model saved once


@pytest.fixture(scope="module")
def servers(model_dir, tmp_path_factory):
    s = Servers(model_dir, tmp_path_factory.mktemp("logs"))
    yield s
    s.run(s.each(lambda launcher: launcher.stop(grace_s=2)))
    s.loop.close()


@pytest.fixture
def clean(servers):
    """No fault left pending for the next test, whatever this one did."""
    yield servers
    for index in range(2):
        for endpoint in ("/generate", "/release_memory_occupation"):
            servers.fault(index, endpoint, clear=True)


@pytest.fixture(scope="module")
def expected(model_dir):
    async def main():
        engine = HFEngine(model_dir)
        try:
            return await engine.generate(GREEDY)
        finally:
            engine.close()

    return asyncio.run(main())


def assert_same(result, want) -> None:
    assert result.token_ids == want.token_ids and result.finish_reason == want.finish_reason
    assert result.logprobs == pytest.approx(want.logprobs, abs=1e-5, rel=0)


def test_a_hung_request_times_out_is_aborted_and_re_sent_to_the_other_server(clean, expected):
    servers = clean

    async def main():
        engine = SGLangEngine(servers.urls, max_retries=2, request_timeout_s=REQUEST_TIMEOUT_S)
        began = time.monotonic()
        await asyncio.gather(engine.generate(GREEDY), engine.generate(GREEDY))  # both servers warm
        engine.request_timeout_s = max(HANG_TIMEOUT_FLOOR_S, HEALTHY_MARGIN * (time.monotonic() - began))
        for index in range(2):
            servers.fault(index, "/generate", hang=True)
        # attempt 1 hangs on one server, attempt 2 goes to the other (not tried yet) and hangs
        # too, attempt 3 finds both tried and takes one whose fault is spent
        result = await engine.generate(GREEDY)
        await engine.aclose()  # waits for the background aborts
        return result, engine.stats.retries, [s.failures for s in engine.servers]

    result, retries, failures = servers.run(main())
    assert_same(result, expected)
    assert retries == 2 and failures == [1, 1]
    for index in range(2):
        [hung] = servers.standin(index)["hung_rids"][-1:]
        aborts = [c["body"]["rid"] for c in servers.log(index) if c["endpoint"] == "/abort_request"]
        assert hung in aborts  # the timed-out request does not keep running on the server


def test_a_5xx_reply_is_re_sent_to_another_server(clean, expected):
    servers = clean

    async def main():
        engine = SGLangEngine(servers.urls, max_retries=1, request_timeout_s=REQUEST_TIMEOUT_S)
        servers.fault(0, "/generate", status=503)
        servers.fault(1, "/generate", status=503)
        with pytest.raises(NoHealthyServer, match="HTTP 503"):  # two attempts, two servers
            await engine.generate(GREEDY)
        first = [s.failures for s in engine.servers]
        servers.fault(0, "/generate", status=500)
        servers.fault(1, "/generate", status=502)
        engine.max_retries = 2
        result = await engine.generate(GREEDY)
        await engine.aclose()
        return first, result, engine.stats.retries

    first, result, retries = servers.run(main())
    assert first == [1, 1]  # the re-send went to the other server, not the failed one again
    assert_same(result, expected)
    assert retries == 4
    assert servers.standin(0)["faults_pending"] == servers.standin(1)["faults_pending"] == 0


def test_a_5xx_reply_with_a_failure_hook_waits_for_recovery_and_retries_on_the_same_server(clean, expected):
    servers = clean
    recovered: list[int] = []

    async def recover(index: int) -> None:
        recovered.append(index)

    async def main():
        engine = SGLangEngine(servers.urls[1:], max_retries=1, request_timeout_s=REQUEST_TIMEOUT_S,
                              on_server_failure=recover)
        servers.fault(1, "/generate", status=503)
        result = await engine.generate(GREEDY)
        await engine.aclose()
        return result, engine.servers[0].healthy(time.monotonic())

    result, healthy = servers.run(main())
    assert_same(result, expected)
    assert recovered == [0] and healthy


def test_a_4xx_reply_is_not_retried(clean):
    servers = clean

    async def main():
        engine = SGLangEngine(servers.urls, max_retries=2, request_timeout_s=REQUEST_TIMEOUT_S)
        for index in range(2):
            servers.fault(index, "/generate", status=400)
        with pytest.raises(proto.SGLangServerError, match="fault injection"):
            await engine.generate(GREEDY)
        await engine.aclose()
        return engine.stats.retries, [s.failures for s in engine.servers]

    retries, failures = servers.run(main())
    assert retries == 0 and failures == [0, 0]
    assert servers.standin(0)["faults_pending"] + servers.standin(1)["faults_pending"] == 1


def new_weights(seed: int) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tiny_model("qwen3", seed=seed).state_dict().items()}


def digests_of(servers: Servers, index: int) -> dict:
    return servers.request(index, "/spade_standin/weights")


def test_push_weights_by_ipc_serializes_once_per_tp_worker(servers, model_dir, monkeypatch):
    """torch's CUDA-IPC reference counting expects one receiver per share: each TP worker of each
    server must get a serialization of its own (A has two workers, B one)."""
    weights = new_weights(seed=3)
    calls: list[list[str]] = []
    serialize = weight_transport.serialize_named_tensors

    def counting(named):
        calls.append([name for name, _ in named])
        return serialize(named)

    monkeypatch.setattr(weight_transport, "serialize_named_tensors", counting)

    async def main():
        one = SGLangEngine(servers.urls[:1])
        buckets = await weight_transport.push_weights_by_ipc(one, weights.items(), 10, tp=2, max_bucket_bytes=48 << 10)
        await one.aclose()
        first = len(calls)
        calls.clear()
        both = SGLangEngine(servers.urls)  # TP sizes asked from the servers
        assert await weight_transport.push_weights_by_ipc(both, weights.items(), 11, max_bucket_bytes=48 << 10) == buckets
        await both.aclose()
        return buckets, first

    buckets, first = servers.run(main())
    assert buckets >= 3, "the small bucket bound must split the model"
    assert first == 2 * buckets  # A's two workers, per bucket
    assert len(calls) == 3 * buckets  # 2 workers of A + 1 of B, per bucket
    per_bucket = [calls[i:i + 3] for i in range(0, len(calls), 3)]
    assert all(a == b == c for a, b, c in per_bucket)
    assert [n for a, _, _ in per_bucket for n in a] == list(weights)
    for index in range(2):
        assert servers.request(index, "/get_server_info")["weight_version"] == "11"


def test_an_ipc_updater_sends_the_weights_from_one_process(servers, model_dir):
    """``weight_updater=IpcWeightUpdater(...)``: the engine's update is the colocated IPC path, asking
    each server its TP size; the served model becomes exactly the new weights."""
    weights = new_weights(seed=4)

    async def main():
        engine = SGLangEngine(servers.urls,
                              weight_updater=weight_transport.IpcWeightUpdater(max_bucket_bytes=64 << 10))
        await engine.update_weights(weights.items(), 12)
        probes = [SGLangEngine([url]) for url in servers.urls]  # one result from each server
        after = await asyncio.gather(*(probe.generate(GREEDY) for probe in probes))
        for probe in probes:
            await probe.aclose()
        await engine.release_memory()
        await engine.resume_and_update(weights.items(), 13)
        resumed = await engine.generate(GREEDY)
        await engine.aclose()
        reference = HFEngine(model_dir)
        await reference.update_weights(list(weights.items()), 1)
        want = await reference.generate(GREEDY)
        reference.close()
        return after, resumed, want

    after, resumed, want = servers.run(main())
    for result in after:
        assert_same(result, want)
        assert result.weight_version == 12
    assert_same(resumed, want)
    assert resumed.weight_version == 13
    expected_digests = {k: weight_transport_sha(v) for k, v in weights.items()}
    assert digests_of(servers, 0) == digests_of(servers, 1) == expected_digests


def weight_transport_sha(t: torch.Tensor) -> str:
    import hashlib

    flat = t.detach().contiguous().reshape(-1)
    return hashlib.sha256(b"" if flat.numel() == 0 else flat.view(torch.uint8).numpy().tobytes()).hexdigest()
