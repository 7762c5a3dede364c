"""The order of memory moves with colocated SGLang servers: at start, around a weight publish, and
when a server is restarted in the middle of the rollouts.

At the usual RL ``mem_fraction`` (0.8-0.85) a server's KV cache only fits once the trainer's
parameters have left the GPU, so the order is the behaviour under test. Around a publish: release
(weights, KV cache) -> train -> optimizer state to host -> resume weights -> send the weights ->
parameters to host (and the allocator cache emptied) -> resume KV cache -> continue generation. At
start the servers load their weights and reserve their KV cache, and give both back before the
trainer's model is built; the first publish then runs the order above and sends the weights (the
memory saver does not keep them across a release). A server restarted mid-rollout goes through
the same order on its own (released at once, weights, sync, parameters out, KV cache) while the
others go on generating; one restarted at a step boundary is released and takes it with the others.

A real SGLang server needs a GPU and the SGLang package, neither of which this machine has; the
servers here are ``RecordingEngine`` (the real client with a recording transport,
tests/sglang_recording.py) or, where a server process must be launched, the stand-in server
(tests/sglang_standin/server.py, launched with production's command line: it refuses generation
while its memory is released and after a weights release until new weights arrive). The trainer's
memory is ``RecordingMemory``; it and the recording engine write one log, whose order is asserted.
The GPU-marked test checks, with a real offloader on CUDA, that the trainer process's reserved
memory has dropped by the parameters' bytes when the KV resume is sent.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest
import torch

import prewarmed
from support.hf_fixtures import save_tiny_hf, tiny_model
from sglang_recording import Call, RecordingEngine, RecordingMemory
from sglang_standin import SERVER_SCRIPT
from spade.rollout.engine import GenerationRequest, SamplingParams
from spade.rollout.hf.engine import HFEngine
from spade.rollout.manager import SGLangRolloutManager
from spade.rollout.sglang.deployment import ServerPlan, SGLangDeployment
from spade.rollout.sglang.launcher import free_port
from spade.rollout.sglang.settings import SGLangSection

WEIGHTS = {"embed.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4),
           "layer.weight": torch.linspace(-1, 1, 8).reshape(2, 4)}


def stream():
    return iter(WEIGHTS.items())


def backend_over(log: list, tmp_path: Path, servers: int = 2, engine=None, memory=None,
                 settings: SGLangSection = SGLangSection(bucket_mb=1)) -> SGLangRolloutManager:
    """A deployment of ``servers`` recorded servers in a world of one (colocated by default)."""
    deployment = SGLangDeployment(settings, model_dir=tmp_path, log_dir=tmp_path,
                                  device=torch.device("cpu"), local_rank=0)
    deployment.plans = [ServerPlan(index=i, url=f"http://127.0.0.1:{40000 + i}", owner_rank=0, port=40000 + i,
                                   ipc_ranks=(0,)) for i in range(servers)]
    deployment.engine = engine or RecordingEngine(servers, log)
    backend = SGLangRolloutManager(deployment, is_main=True, device=torch.device("cpu"))
    backend.engine = deployment.engine
    backend.use_training_memory(memory or RecordingMemory(log))
    return backend


def first(log: list, what: str, tags: tuple[str, ...] = ()) -> int:
    return next(i for i, call in enumerate(log) if call.what == what and call.tags == tags)


def last(log: list, what: str, tags: tuple[str, ...] = ()) -> int:
    return max(i for i, call in enumerate(log) if call.what == what and call.tags == tags)


async def one_step(backend: SGLangRolloutManager, version: int, *, changed: bool = True) -> list:
    samples = await backend.switch_to_training(["sample"])
    assert samples == ["sample"]
    await backend.publish(stream, version, changed=changed)
    return samples


@pytest.mark.parametrize("changed", [True, False])
def test_parameters_leave_before_the_kv_cache_comes_back(tmp_path, changed):
    log: list[Call] = []
    backend = backend_over(log, tmp_path)
    asyncio.run(one_step(backend, 1, changed=changed))

    kv = ("kv_cache",)
    weights = ("weights",)
    for server in (0, 1):
        mine = [c for c in log if c.server == server]
        assert [c.what for c in mine[:2]] == ["/pause_generation", "/release_memory_occupation"]
        assert mine[1].tags == ("weights", "kv_cache")
        assert [c.what for c in mine[-2:]] == ["/resume_memory_occupation", "/continue_generation"]
        assert mine[-2].tags == kv
    # trainer state out -> weights region back -> (weights sent) -> parameters out -> KV back
    assert first(log, "onload") < first(log, "offload_state") < first(log, "/resume_memory_occupation", weights)
    assert last(log, "/resume_memory_occupation", weights) < first(log, "offload_params")
    assert first(log, "offload_params") < first(log, "/resume_memory_occupation", kv)
    if changed:
        assert last(log, "/flush_cache") < first(log, "offload_params")
        assert first(log, "/update_weights_from_tensor") > first(log, "/resume_memory_occupation", weights)
        assert backend.engine.weight_version == 1
    else:
        assert not [c for c in log if c.what == "/update_weights_from_tensor"]
    assert backend.version == 1


def test_the_weights_the_servers_loaded_are_the_trainers(tmp_path):
    log: list[Call] = []
    backend = backend_over(log, tmp_path, servers=1)
    asyncio.run(one_step(backend, 3))
    loaded = dict(pair for body in backend.engine.received for entry in body for pair in entry)
    assert sorted(loaded) == sorted(WEIGHTS)
    for name, tensor in WEIGHTS.items():
        assert torch.equal(loaded[name], tensor)


@pytest.mark.gpu
def test_on_cuda_the_parameters_are_off_the_device_when_the_kv_cache_is_resumed(tmp_path):
    """Real ``StagedOffload`` of a CUDA model: when ``/resume_memory_occupation`` (KV cache) is
    sent, this process holds neither the parameters nor the weight-sync buckets (reserved memory
    back near where it was before the model existed)."""
    from spade.training.offload import StagedOffload

    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_reserved(device)
    model = torch.nn.Sequential(*(torch.nn.Linear(2048, 2048) for _ in range(16))).to(device)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 2048, device=device)).sum().backward()
    optimizer.step()
    memory = StagedOffload([model], optimizer)
    log: list[Call] = []
    reserved_at_kv: list[int] = []

    def on_call(call: Call) -> None:
        if call.what == "/resume_memory_occupation" and call.tags == ("kv_cache",):
            reserved_at_kv.append(torch.cuda.memory_reserved(device))

    def weights():
        memory.onload_params()
        return iter([(name, p.detach()) for name, p in model.named_parameters()])

    # CUDA opens an IPC handle only in another process: the payloads are decoded in a child
    engine = RecordingEngine(1, log, on_call=on_call, keep=False, decode_in_child=True)
    deployment_backend = backend_over(log, tmp_path, servers=1, engine=engine, memory=memory)
    deployment_backend.device = device
    deployment_backend.deployment.device = device

    async def step():
        await deployment_backend.switch_to_training(["sample"])
        await deployment_backend.publish(weights, 1)

    try:
        asyncio.run(step())
    finally:
        engine.close_decoder()
    assert {name for entry in engine.received_elsewhere for name, _, _ in entry["read"]} == \
        {name for name, _ in model.named_parameters()}
    assert reserved_at_kv, "the KV cache was never resumed"
    assert reserved_at_kv[0] - baseline < param_bytes // 4, (reserved_at_kv, baseline, param_bytes)


# ---------------------------------------------------------------------- at start


@pytest.mark.parametrize("settings, releases", [
    (SGLangSection(bucket_mb=1), True),
    (SGLangSection(bucket_mb=1, server_command=("python", "my_server.py")), True),  # launched by us all the same
    (SGLangSection(bucket_mb=1, urls=("http://10.0.0.1:30000", "http://10.0.0.2:30000")), False),  # not on our GPUs
    (SGLangSection(bucket_mb=1, release_memory=False), False),
], ids=["colocated", "server_command", "urls", "release_memory_off"])
def test_colocated_servers_give_their_memory_back_before_training_starts(tmp_path, settings, releases):
    log: list[Call] = []
    backend = backend_over(log, tmp_path, settings=settings)
    asyncio.run(backend.deployment.release_before_training())
    if releases:
        for server in (0, 1):
            mine = [c for c in log if c.server == server]
            assert [c.what for c in mine] == ["/pause_generation", "/release_memory_occupation"]
            assert mine[1].tags == ("weights", "kv_cache")
        assert backend.engine.released == {0, 1}
    else:
        assert log == []
        assert backend.engine.released == frozenset()


def get(url: str, path: str):
    with urllib.request.urlopen(url + path, timeout=10) as reply:
        return json.loads(reply.read())


GREEDY = GenerationRequest((3, 9, 4, 17), SamplingParams(temperature=0.0, max_new_tokens=6))


async def reference(model_dir: Path, weights: dict) -> object:
    """What the in-process engine generates for ``GREEDY`` with ``weights`` loaded."""
    engine = HFEngine(model_dir)
    try:
        await engine.update_weights(list(weights.items()), 1)
        return await engine.generate(GREEDY)
    finally:
        engine.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("version", [0, 3], ids=["new_run", "resumed_at_3"])
def test_started_servers_are_released_before_the_model_is_built_and_the_first_publish_sends_the_weights(
        tmp_path, version):
    """The manager's real ``start`` launches a stand-in server with production's command line: when
    it returns (where the trainer builds its model) the server holds neither weights nor KV cache.
    The first publish (version 0, or a resumed run's checkpoint step) resumes the weights, sends
    them, moves the parameters to host and only then resumes the KV cache; the server then answers
    with the trainer's weights, which it could not without the send."""
    model_dir = save_tiny_hf("qwen3", tmp_path / "model")
    settings = SGLangSection(server_command=(prewarmed.python(), str(SERVER_SCRIPT)), port=free_port(),
                             start_timeout_s=120, request_timeout_s=60, bucket_mb=1)
    deployment = SGLangDeployment(settings, model_dir=model_dir, log_dir=tmp_path / "logs",
                                  device=torch.device("cpu"), local_rank=0)
    backend = SGLangRolloutManager(deployment, is_main=True, device=torch.device("cpu"))
    weights = {k: v.detach().clone() for k, v in tiny_model("qwen3", seed=5).state_dict().items()}
    log: list = []  # the server's control calls and, in between, the trainer's steps

    def server_calls() -> None:
        calls = get(deployment.plans[0].url, "/spade_standin/log")[len([c for c in log if c.server == 0]):]
        log.extend(Call(0, c["endpoint"], tuple((c["body"] or {}).get("tags") or ())) for c in calls)

    def trainer(what: str) -> None:
        server_calls()
        log.append(Call(None, what))

    async def main():
        try:
            await backend.start()
            trainer("build the model")
            backend.use_training_memory(RecordingMemory(log, on_move=lambda _what: server_calls()))
            await backend.publish(lambda: iter(weights.items()), version)
            server_calls()
            return await backend.engine.generate(GREEDY)
        finally:
            await deployment.close()

    result = asyncio.run(main())
    assert [(c.what, c.tags) for c in log[:first(log, "build the model")]] == [
        ("/pause_generation", ()), ("/release_memory_occupation", ("weights", "kv_cache"))]
    built = first(log, "build the model")
    weights_back = first(log, "/resume_memory_occupation", ("weights",))
    sent = first(log, "/update_weights_from_tensor")
    kv_back = first(log, "/resume_memory_occupation", ("kv_cache",))
    assert built < first(log, "offload_state") < weights_back < sent < first(log, "offload_params") < kv_back
    assert log[-1].what == "/continue_generation"
    assert result.weight_version == version
    assert result.token_ids == asyncio.run(reference(model_dir, weights)).token_ids


# ---------------------------------------------------------------------- a server restarted mid-rollout


def kv_cache_resident_with_the_parameters(log: list, server: int) -> bool:
    """Whether, reading ``log`` from a restart of ``server`` taken during the rollouts (its KV cache
    reserved as it came up, the trainer's parameters on host), the server's KV cache was ever
    resident while the parameters were on the device."""
    kv, parameters = True, False
    for call in log:
        if call.server == server and "kv_cache" in call.tags:
            kv = call.what == "/resume_memory_occupation"
        elif call.what in ("onload", "onload_params"):
            parameters = True
        elif call.what == "offload_params":
            parameters = False
        if kv and parameters:
            return True
    return False


@pytest.mark.parametrize("release_memory", [True, False])
def test_a_server_restarted_mid_rollout_gets_its_kv_cache_back_after_the_parameters_left(tmp_path, release_memory):
    """Server 1 dies while server 0 generates: the recovery (every rank: restart it, send it the
    current weights) brings the trainer's parameters onto the GPUs for the sync. Its KV cache is
    released from the restart until the parameters are on host again, and it takes no request
    before that; server 0 is left alone. With ``release_memory: false`` nothing is released."""
    log: list[Call] = []
    memory = RecordingMemory(log)
    backend = backend_over(log, tmp_path, memory=memory, settings=SGLangSection(bucket_mb=1,
                                                                                release_memory=release_memory))
    held_at: list[tuple[Call, frozenset]] = []
    backend.engine.on_call = lambda call: held_at.append((call, backend.engine.held))

    def weights():  # as the learner's weight stream: the parameters come back to the device first
        memory.onload_params()
        return stream()

    async def rollout_then_failure():
        await backend.switch_to_training(["sample"])
        await backend.publish(weights, 4)
        del log[:], held_at[:]
        await backend._recover(1)  # the engine's failure hook on rank 0

    asyncio.run(rollout_then_failure())
    assert not [c for c in log if c.server == 0]
    assert first(log, "onload_params") < first(log, "/update_weights_from_tensor") < first(log, "offload_params")
    assert backend.engine.held == frozenset() and backend.engine.released == frozenset()
    assert backend.engine.weight_version == 4
    loaded = dict(pair for entry in backend.engine.received[-1] for pair in entry)
    assert all(torch.equal(loaded[name], tensor) for name, tensor in WEIGHTS.items())
    if not release_memory:
        assert not [c for c in log if "memory_occupation" in c.what]
        return
    assert not kv_cache_resident_with_the_parameters(log, server=1)
    released = first(log, "/release_memory_occupation", ("weights", "kv_cache"))
    assert released < first(log, "/resume_memory_occupation", ("weights",)) < first(log, "/update_weights_from_tensor")
    assert first(log, "offload_params") < first(log, "/resume_memory_occupation", ("kv_cache",))
    assert all(held == {1} for call, held in held_at)  # no request could reach it before its KV cache was back


def test_a_server_found_dead_at_the_step_boundary_takes_the_publish_order_with_the_others(tmp_path):
    """Server 1 stops answering (its ``/health`` fails) during the update: the publish restarts it
    and releases it with the others' memory already released, so its KV cache, like theirs, comes
    back only after the parameters have left."""
    from spade.rollout.sglang.http_client import TransportError

    log: list[Call] = []
    memory = RecordingMemory(log)
    backend = backend_over(log, tmp_path, memory=memory)

    def dead_on_health(call: Call) -> None:
        if call.server == 1 and call.what == "/health":
            raise TransportError("connection refused")

    def weights():
        memory.onload_params()
        return stream()

    async def step():
        await backend.switch_to_training(["sample"])
        backend.engine.on_call = dead_on_health
        await backend.publish(weights, 1)

    asyncio.run(step())
    assert backend.step_metrics()["engine/restarted_servers"] == 1.0
    restarted = [(c.what, c.tags) for c in log[last(log, "/health"):] if c.server == 1]
    assert restarted == [("/release_memory_occupation", ("weights", "kv_cache")),
                         ("/resume_memory_occupation", ("weights",)), ("/begin_weight_update", ()),
                         ("/update_weights_from_tensor", ()), ("/end_weight_update", ()), ("/flush_cache", ()),
                         ("/resume_memory_occupation", ("kv_cache",)), ("/continue_generation", ())]
    assert first(log, "offload_params") < first(log, "/resume_memory_occupation", ("kv_cache",))
