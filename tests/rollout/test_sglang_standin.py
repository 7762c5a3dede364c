"""SGLangEngine + ServerLauncher against the SGLang stand-in (tests/sglang_standin/server.py): a
real server subprocess, launched with production's SGLang command line, serving a real model.

SGLang needs a GPU; the stand-in speaks its protocol over a transformers model on CPU, so these
tests check what the client and launcher do against a live process: generation parity with the
in-process HFEngine, weight updates with serialized tensors for two TP ranks, the release/resume
order, and a crash, its detection, restart and retry.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any, Awaitable, TypeVar

import pytest
import torch

from support.hf_fixtures import tiny_model
from sglang_standin import standin_argv, standin_launcher
from spade.rollout.sglang import control_protocol as control
from spade.rollout.sglang import protocol as proto
from spade.rollout.engine import GenerationRequest, SamplingParams
from spade.rollout.hf.engine import HFEngine
from spade.rollout.sglang.launcher import sglang_argv
from spade.rollout.sglang.engine import SGLangEngine
from spade.rollout.sglang.weight_transport import serialize_named_tensors
from support.models import tiny_hf_dir_fixture

pytestmark = pytest.mark.timeout(120)
T = TypeVar("T")

GREEDY = GenerationRequest((3, 9, 4, 17), SamplingParams(temperature=0.0, max_new_tokens=12))
REQUESTS = [
    GREEDY,
    GenerationRequest((5, 6), SamplingParams(temperature=0.9, top_p=0.9, top_k=40, max_new_tokens=10, seed=123)),
    GenerationRequest((5, 6), SamplingParams(temperature=1.3, max_new_tokens=10, seed=7,
                                             stop_token_ids=tuple(range(120, 200)))),
    GenerationRequest((8, 1, 1), SamplingParams(temperature=1.0, max_new_tokens=9, seed=2**40 + 5)),
    GenerationRequest((2, 2), SamplingParams(temperature=1.0, max_new_tokens=6, seed=11, ignore_eos=True)),
]


class Harness:
    """One event loop for the module, so that the server launched by the fixture outlives tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = None

    def run(self, awaitable: Awaitable[T], timeout: float = 60) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(awaitable, timeout))

    def get(self, path: str, url: str | None = None) -> Any:
        with urllib.request.urlopen((url or self.server.url) + path, timeout=10) as r:
            return json.loads(r.read())


model_dir = tiny_hf_dir_fixture("qwen3")  # a module fixture: the tiny model saved once


@pytest.fixture(scope="module")
def h(model_dir, tmp_path_factory):
    harness = Harness()
    harness.server = standin_launcher(model_dir, tp=2, log_path=tmp_path_factory.mktemp("logs") / "tp2.log")
    harness.run(harness.server.start())
    yield harness
    harness.run(harness.server.stop(grace_s=2))
    harness.loop.close()


def new_weights(seed: int) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tiny_model("qwen3", seed=seed).state_dict().items()}


async def reference(model_dir: Path, requests, weights=None):
    """The same requests, one at a time, on an in-process HFEngine over the same directory."""
    engine = HFEngine(model_dir)
    try:
        if weights is not None:
            await engine.update_weights(list(weights.items()), 1)
        return [await engine.generate(r) for r in requests]
    finally:
        engine.close()


async def tensor_updater(engine: SGLangEngine, named, version: int) -> None:
    """A colocated update: one serialized entry per TP rank (the stand-in runs tp 2), inside the
    begin/end session SGLang 0.5.23 requires."""
    named = list(named)
    entries = [serialize_named_tensors(named) for _ in range(2)]
    await engine.post_all("begin_weight_update", control.begin_weight_update_payload())
    try:
        await engine.post_all("update_weights_from_tensor",
                              control.update_weights_from_tensor_payload(entries, weight_version=version))
    finally:
        await engine.post_all("end_weight_update", control.end_weight_update_payload())


def assert_same(results, expected) -> None:
    for got, want in zip(results, expected, strict=True):
        assert got.token_ids == want.token_ids
        assert got.finish_reason == want.finish_reason
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5, rel=0)


def test_launched_with_production_argv(h, model_dir):
    argv = standin_argv(sglang_argv(model_dir, tp=2, port=1234))
    assert argv[1].endswith("tests/sglang_standin/server.py") and "--enable-memory-saver" in argv
    info = h.get("/get_server_info")
    assert info["tp_size"] == 2 and info["weight_version"] == "default"
    assert info["standin"]["ignored_args"] == []  # every production flag is a known SGLang flag
    assert h.get("/get_model_info")["is_generation"] is True


def test_generation_matches_hfengine(h, model_dir):
    async def main():
        engine = SGLangEngine([h.server.url])
        got = [await engine.generate(r) for r in REQUESTS]
        await engine.aclose()
        return got, await reference(model_dir, REQUESTS)

    got, expected = h.run(main())
    assert_same(got, expected)
    assert {r.finish_reason for r in got} == {"stop", "length"}
    assert got[1].token_ids != got[3].token_ids  # the seeds matter
    assert all(r.weight_version == 0 for r in got)  # "default" -> the engine's initial version


def test_update_weights_from_tensor_two_tp_ranks(h, model_dir):
    weights = new_weights(seed=1)

    async def main():
        engine = SGLangEngine([h.server.url], weight_updater=tensor_updater)
        before = await engine.generate(GREEDY)
        await engine.update_weights(weights.items(), 5)
        after = [await engine.generate(r) for r in REQUESTS]
        info = (await engine.server_info())[0]
        digests = h.get("/spade_standin/weights")

        named = list(weights.items())
        one_entry = control.update_weights_from_tensor_payload([serialize_named_tensors(named)], weight_version=99)
        outside = control.update_weights_from_tensor_payload([serialize_named_tensors(named)] * 2, weight_version=99)
        with pytest.raises(proto.SGLangServerError, match="between begin_weight_update"):
            await engine.post_all("update_weights_from_tensor", outside)  # no session open
        await engine.post_all("begin_weight_update", control.begin_weight_update_payload())
        with pytest.raises(proto.SGLangServerError, match="tp_size=2"):
            await engine.post_all("update_weights_from_tensor", one_entry)
        tampered = [(n, t + 1 if n == "lm_head.weight" else t) for n, t in named]
        mismatched = control.update_weights_from_tensor_payload(
            [serialize_named_tensors(named), serialize_named_tensors(tampered)], weight_version=99)
        with pytest.raises(proto.SGLangServerError, match="rank 1 got other values for lm_head.weight"):
            await engine.post_all("update_weights_from_tensor", mismatched)
        await engine.post_all("end_weight_update", control.end_weight_update_payload())
        assert h.get("/spade_standin/weights") == digests  # refused updates changed nothing
        await engine.aclose()
        return before, after, info, await reference(model_dir, REQUESTS, weights)

    before, after, info, expected = h.run(main())
    assert_same(after, expected)
    assert after[0].token_ids != before.token_ids
    assert all(r.weight_version == 5 for r in after) and info["weight_version"] == "5"


def test_release_resume_update_order(h, model_dir):
    weights = new_weights(seed=2)
    start = len(h.get("/spade_standin/log"))

    async def main():
        engine = SGLangEngine([h.server.url], weight_updater=tensor_updater)
        probe = SGLangEngine([h.server.url])  # another client that does not know about the release
        await engine.release_memory()
        with pytest.raises(proto.SGLangServerError, match="released"):
            await probe.generate(GREEDY)
        with pytest.raises(proto.SGLangServerError, match="weights are released"):
            await tensor_updater(engine, weights.items(), 77)  # an update before resuming weights
        await engine.resume_and_update(weights.items(), 6)
        updated = await engine.generate(GREEDY)

        # without --enable-weights-cpu-backup the weights do not survive a release: resuming
        # without an update leaves the server refusing to generate until one arrives
        await engine.release_memory()
        await engine.resume_memory()
        with pytest.raises(proto.SGLangServerError, match="cpu-backup"):
            await probe.generate(GREEDY)
        await engine.update_weights(weights.items(), 7)
        again = await engine.generate(GREEDY)
        for e in (engine, probe):
            await e.aclose()
        return updated, again, await reference(model_dir, [GREEDY], weights)

    updated, again, expected = h.run(main())
    assert updated.weight_version == 6 and again.weight_version == 7
    assert_same([updated, again], expected * 2)
    calls = [(c["endpoint"], c["body"], c["status"]) for c in h.get("/spade_standin/log")[start:]]
    update = {"serialized_named_tensors": "<2 entries>", "load_format": None, "flush_cache": True}
    begin, end = ("/begin_weight_update", {"selector": "all"}, 200), ("/end_weight_update", {}, 200)
    assert calls == [
        ("/pause_generation", {"mode": "abort"}, 200),
        ("/release_memory_occupation", {"tags": ["weights", "kv_cache"]}, 200),
        begin, ("/update_weights_from_tensor", {**update, "weight_version": "77"}, 400), end,
        ("/resume_memory_occupation", {"tags": ["weights"]}, 200),
        begin, ("/update_weights_from_tensor", {**update, "weight_version": "6"}, 200), end,
        ("/resume_memory_occupation", {"tags": ["kv_cache"]}, 200),
        ("/continue_generation", {}, 200),
        ("/pause_generation", {"mode": "abort"}, 200),
        ("/release_memory_occupation", {"tags": ["weights", "kv_cache"]}, 200),
        ("/resume_memory_occupation", {"tags": ["weights"]}, 200),
        ("/resume_memory_occupation", {"tags": ["kv_cache"]}, 200),
        ("/continue_generation", {}, 200),
        begin, ("/update_weights_from_tensor", {**update, "weight_version": "7"}, 200), end,
    ]


def test_crash_is_detected_restarted_and_the_request_retried(h, model_dir, tmp_path):
    marker = tmp_path / "died-once"
    fault = standin_launcher(model_dir, tp=1, log_path=tmp_path / "fault.log", env={
        "SPADE_STANDIN_DIE_AFTER_GENERATES": "1", "SPADE_STANDIN_DIE_ONCE_FILE": str(marker)})

    async def main():
        deaths: list[tuple[int, str]] = []
        restarted = asyncio.Event()

        async def on_death(returncode: int, tail: str) -> None:
            deaths.append((returncode, tail))
            await fault.restart(grace_s=1)
            restarted.set()

        await fault.start()
        first_pid = fault.pid
        watcher = fault.watch(on_death)
        try:
            engine = SGLangEngine([fault.url, h.server.url], max_retries=1)
            # two at once: least-in-flight placement sends one to each server; the one on the
            # faulty server kills it and is retried on the other
            results = await asyncio.gather(engine.generate(GREEDY), engine.generate(GREEDY))
            failures = engine.servers[0].failures
            await engine.aclose()
            await asyncio.wait_for(restarted.wait(), 30)
            single = SGLangEngine([fault.url])
            after_restart = await single.generate(GREEDY)
            await single.aclose()
        finally:
            await fault.close(grace_s=2)
            await asyncio.wait_for(watcher, 10)
        return results, failures, deaths, first_pid, after_restart

    results, failures, deaths, first_pid, after_restart = h.run(main(), timeout=90)
    assert marker.exists() and failures == 1
    assert results[0].token_ids == results[1].token_ids and len(results[0].token_ids) == 12
    assert len(deaths) == 1 and deaths[0][0] == 1 and "fault injection" in deaths[0][1]
    assert fault.pid != first_pid
    [expected] = h.run(reference(model_dir, [GREEDY]))
    assert_same([after_restart], [expected])  # the restarted server serves the original weights
