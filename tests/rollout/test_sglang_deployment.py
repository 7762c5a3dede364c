"""Placement of colocated SGLang servers and the command line each one is launched with (pure
logic), then the deployment's restart, memory and weight-sync steps against stand-in servers
(tests/sglang_standin/server.py: real subprocesses over HTTP serving a real model) launched by the
deployment itself with production's command line."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import urllib.request
from pathlib import Path
from typing import Any, Awaitable, TypeVar

import prewarmed
import pytest
import torch

from support.hf_fixtures import tiny_model
from sglang_standin import SERVER_SCRIPT
from spade.rollout.engine import GenerationRequest, SamplingParams
from spade.rollout.hf.engine import HFEngine
from spade.rollout.sglang.launcher import free_port
from spade.rollout.sglang.deployment import (
    DeploymentError,
    RankInfo,
    ServerPlan,
    SGLangDeployment,
    advertised_host,
    plan_servers,
    server_environment,
)
from spade.rollout.sglang.engine import SGLangEngine
from spade.rollout.sglang.settings import SGLangSection
from spade.rollout.sglang.weight_transport import push_weights_by_ipc
from support.models import tiny_hf_dir_fixture

T = TypeVar("T")


def world(nodes: int, per_node: int) -> list[RankInfo]:
    return [RankInfo(rank=n * per_node + i, local_rank=i, node=f"node{n}") for n in range(nodes) for i in range(per_node)]


HOSTS = {"node0": "10.0.0.1", "node1": "10.0.0.2"}


def test_one_server_per_gpu_on_one_node():
    plans = plan_servers(world(1, 8), SGLangSection(servers_per_node=8, tp=1), HOSTS)
    assert [p.url for p in plans] == [f"http://10.0.0.1:{30000 + i}" for i in range(8)]
    assert [p.base_gpu for p in plans] == list(range(8))
    assert [p.ipc_ranks for p in plans] == [(i,) for i in range(8)]
    assert {p.owner_rank for p in plans} == {0}


def test_one_tp8_server_per_node_over_two_nodes():
    plans = plan_servers(world(2, 8), SGLangSection(tp=8, ep=8), HOSTS)
    assert [(p.index, p.url, p.owner_rank, p.base_gpu) for p in plans] == [
        (0, "http://10.0.0.1:30000", 0, 0), (1, "http://10.0.0.2:30000", 8, 0)]
    assert plans[0].ipc_ranks == tuple(range(8)) and plans[1].ipc_ranks == tuple(range(8, 16))


def test_tp2_servers_take_consecutive_gpus_fed_by_the_same_gpus_ranks():
    # ranks listed out of order: placement follows (node, local rank), not list order
    ranks = list(reversed(world(1, 8)))
    plans = plan_servers(ranks, SGLangSection(servers_per_node=4, tp=2, port=31000), HOSTS)
    assert [p.port for p in plans] == [31000, 31001, 31002, 31003]
    assert [p.base_gpu for p in plans] == [0, 2, 4, 6]
    assert [p.ipc_ranks for p in plans] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_not_enough_gpus_is_a_clear_error():
    with pytest.raises(DeploymentError, match=r"servers_per_node \* tp \* dp = 2 \* 4 \* 1 = 8"):
        plan_servers(world(1, 4), SGLangSection(servers_per_node=2, tp=4), HOSTS)


def test_advertised_host():
    assert advertised_host(SGLangSection()) == "127.0.0.1"
    assert advertised_host(SGLangSection(host="0.0.0.0", advertise_host="gpu-17")) == "gpu-17"
    assert advertised_host(SGLangSection(host="0.0.0.0")) not in ("0.0.0.0", "")


def test_server_command_line(tmp_path: Path):
    settings = SGLangSection(tp=2, ep=2, mem_fraction=0.55, port=32000, server_args={"chunked_prefill_size": 4096,
                                                                                    "enable_metrics": True})
    deployment = SGLangDeployment(settings, model_dir=tmp_path, log_dir=tmp_path, device=torch.device("cpu"),
                                  local_rank=0, python="/usr/bin/python3")
    plan = plan_servers(world(1, 4), dataclasses.replace(settings, servers_per_node=2), HOSTS)[1]
    argv = deployment.server_argv(plan)
    assert argv[:3] == ["/usr/bin/python3", "-m", "sglang.launch_server"]

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert value("--model-path") == str(tmp_path) and value("--tp-size") == "2" and value("--ep-size") == "2"
    assert value("--port") == "32001" and value("--base-gpu-id") == "2" and value("--mem-fraction-static") == "0.55"
    assert "--enable-memory-saver" in argv and "--skip-tokenizer-init" in argv and "--enable-metrics" in argv
    assert value("--chunked-prefill-size") == "4096"

    wrapped = SGLangDeployment(dataclasses.replace(settings, server_command=("python", "my_server.py")),
                               model_dir=tmp_path, log_dir=tmp_path, device=torch.device("cpu"), local_rank=0)
    assert wrapped.server_argv(plan)[:3] == ["python", "my_server.py", "--model-path"]


def test_servers_do_not_inherit_torchrun_worker_variables():
    trainer_env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "MASTER_ADDR": "10.0.0.1",
                   "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x", "PATH": "/usr/bin", "HF_HOME": "/hf",
                   "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "1"}
    env = server_environment(SGLangSection(server_env={"NCCL_DEBUG": "INFO"}), base=trainer_env)
    assert not set(env) & {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"}
    assert env["PATH"] == "/usr/bin" and env["HF_HOME"] == "/hf" and env["NCCL_DEBUG"] == "INFO"
    assert env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "0"  # /health: liveness, not a generation


# ---------------------------------------------------------------------------- against stand-in servers

GREEDY = GenerationRequest((3, 9, 4, 17), SamplingParams(temperature=0.0, max_new_tokens=6))


def standin_deployment(model_dir: Path, log_dir: Path, servers: int = 2, **settings: Any) -> SGLangDeployment:
    """A deployment of ``servers`` stand-ins owned by this one process, each fed by it (what
    ``start()`` places for a node with that many GPUs; a world of one has a single GPU's worth)."""
    section = SGLangSection(server_command=(prewarmed.python(), str(SERVER_SCRIPT)), start_timeout_s=120,
                            request_timeout_s=60, bucket_mb=1, **settings)
    deployment = SGLangDeployment(section, model_dir=model_dir, log_dir=log_dir, device=torch.device("cpu"),
                                  local_rank=0)
    ports: list[int] = []
    while len(ports) < servers:
        port = free_port()
        if port not in ports:
            ports.append(port)
    deployment.plans = [ServerPlan(index=i, url=f"http://127.0.0.1:{port}", owner_rank=0, port=port, ipc_ranks=(0,))
                        for i, port in enumerate(ports)]
    return deployment


def get(url: str, path: str) -> Any:
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return json.loads(r.read())


def post(url: str, path: str, body: dict) -> None:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).close()


def new_weights(seed: int) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tiny_model("qwen3", seed=seed).state_dict().items()}


def stream(weights: dict[str, torch.Tensor]):
    return lambda: iter(weights.items())


async def reference(model_dir: Path, weights=None):
    engine = HFEngine(model_dir)
    try:
        if weights is not None:
            await engine.update_weights(list(weights.items()), 1)
        return await engine.generate(GREEDY)
    finally:
        engine.close()


def assert_same(result, want) -> None:
    assert result.token_ids == want.token_ids
    assert result.logprobs == pytest.approx(want.logprobs, abs=1e-5, rel=0)


class Harness:
    def __init__(self, deployment: SGLangDeployment) -> None:
        self.loop = asyncio.new_event_loop()
        self.deployment = deployment

    def run(self, awaitable: Awaitable[T], timeout: float = 120) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(awaitable, timeout))

    def url(self, index: int) -> str:
        return self.deployment.plans[index].url

    def generates(self, index: int) -> int:
        return get(self.url(index), "/get_server_info")["standin"]["generates"]


model_dir = tiny_hf_dir_fixture("qwen3")  # a module fixture: the tiny model saved once


@pytest.fixture(scope="module")
def h(model_dir, tmp_path_factory):
    harness = Harness(standin_deployment(model_dir, tmp_path_factory.mktemp("logs")))
    harness.run(harness.deployment._launch())
    yield harness
    harness.run(harness.deployment.close())
    harness.loop.close()


@pytest.mark.timeout(300)
def test_a_restarted_server_takes_no_request_until_the_weights_are_sent_to_it(h, model_dir):
    deployment = h.deployment
    weights = new_weights(seed=1)
    want = asyncio.run(reference(model_dir, weights))
    stale = asyncio.run(reference(model_dir))
    assert want.token_ids != stale.token_ids

    async def spread():  # least-in-flight placement: concurrent requests use every placeable server
        return await asyncio.gather(*(deployment.engine.generate(GREEDY) for _ in range(4)))

    h.run(deployment.sync_weights(stream(weights), 1))
    h.run(deployment.restart([1]))  # it comes back serving the model directory's weights
    during = h.run(spread())
    assert h.generates(1) == 0  # the restarted process never saw a request before its sync
    assert deployment.engine.held == {1} and deployment.restarts == {1: 1}
    h.run(deployment.sync_weights(stream(weights), 1, [1]))
    assert deployment.engine.held == frozenset()
    after = h.run(spread())
    assert h.generates(1) > 0
    for result in during + after:
        assert_same(result, want)
        assert result.weight_version == 1


@pytest.mark.timeout(300)
def test_a_server_whose_release_fails_after_the_pause_is_continued(h, model_dir):
    deployment = h.deployment
    weights = new_weights(seed=2)
    post(h.url(1), "/spade_standin/fault", {"endpoint": "/release_memory_occupation", "status": 500})
    h.run(deployment.release())
    assert deployment.engine.released == {0}
    assert get(h.url(1), "/get_server_info")["standin"]["paused"] is True
    restarted = h.run(deployment.resume_and_sync(stream(weights), 2))
    assert restarted == []
    assert get(h.url(1), "/get_server_info")["standin"]["paused"] is False
    assert deployment.engine.paused == frozenset() and deployment.engine.released == frozenset()
    calls = [c["endpoint"] for c in get(h.url(1), "/spade_standin/log")]
    tail = calls[len(calls) - calls[::-1].index("/pause_generation") - 1:]
    assert tail[:2] == ["/pause_generation", "/release_memory_occupation"]
    assert tail[-1] == "/continue_generation" and "/resume_memory_occupation" not in tail
    want = asyncio.run(reference(model_dir, weights))
    probe = SGLangEngine([h.url(1)])
    result = h.run(probe.generate(GREEDY), timeout=60)  # paused for good, this would hang
    h.run(probe.aclose())
    assert_same(result, want)
    assert result.weight_version == 2


@pytest.mark.timeout(300)
def test_training_and_the_one_process_tools_send_weights_the_same_way(h, model_dir):
    """``sync_weights`` and ``push_weights_by_ipc`` (engine check, benchmark, GPU tests) both run
    ``update_weights_by_ipc``: the same control calls, the same bodies, the same loaded weights."""
    deployment = h.deployment
    weights = new_weights(seed=3)

    def calls(index: int) -> list:
        return [(c["endpoint"], c["body"], c["status"]) for c in get(h.url(index), "/spade_standin/log")]

    before = [len(calls(i)) for i in range(2)]
    h.run(deployment.sync_weights(stream(weights), 3, [0]))
    training = calls(0)[before[0]:]
    assert calls(1)[before[1]:] == []  # only the servers asked for
    digests = get(h.url(0), "/spade_standin/weights")

    async def tool():
        engine = SGLangEngine([h.url(1)])
        await push_weights_by_ipc(engine, weights.items(), 3, max_bucket_bytes=deployment.settings.bucket_mb << 20)
        await engine.aclose()

    h.run(tool())
    assert calls(1)[before[1]:] == training
    assert [c[0] for c in training] == ["/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update",
                                        "/flush_cache"]
    assert get(h.url(1), "/spade_standin/weights") == digests


@pytest.mark.timeout(300)
def test_a_server_that_dies_mid_rollout_is_restarted_resynced_and_the_requests_retried(model_dir, tmp_path):
    """The trainer's recovery (``recover_hook``: restart, then re-send the current weights): the
    failed requests wait for it and every result comes from the current weights."""
    marker = tmp_path / "died-once"
    deployment = standin_deployment(model_dir, tmp_path, server_env={
        "SPADE_STANDIN_DIE_AFTER_GENERATES": "1", "SPADE_STANDIN_DIE_ONCE_FILE": str(marker)})
    harness = Harness(deployment)
    weights = new_weights(seed=4)
    want = asyncio.run(reference(model_dir, weights))

    async def recover(index: int) -> None:
        await deployment.restart([index])
        await deployment.sync_weights(stream(weights), 1, [index])

    async def main():
        await deployment._launch()
        try:
            await deployment.sync_weights(stream(weights), 1)
            deployment.recover_hook = recover
            results = await asyncio.gather(*(deployment.engine.generate_with_affinity(GREEDY, f"episode{i}")
                                             for i in range(4)))
            return results, dict(deployment.restarts), deployment.engine.held
        finally:
            await deployment.close()

    try:
        results, restarts, held = harness.run(main(), timeout=240)
    finally:
        harness.loop.close()
    assert marker.exists() and sum(restarts.values()) == 1 and held == frozenset()
    for result in results:
        assert_same(result, want)
        assert result.weight_version == 1
