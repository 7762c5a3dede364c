"""Between the rollouts and the update, the rollout manager's three named stages, in slime's order.

``switch_to_training`` = ``offload_engine`` (rank 0: the SGLang servers release weights and KV
cache) -> ``share_samples`` (every rank gets rank 0's samples) -> ``onload_training`` (the
trainer's state back onto the device). A step without samples trains nothing and moves no memory.
The servers are ``RecordingEngine`` (the real client over a recording transport) and the trainer's
memory ``RecordingMemory``; both append to one log, whose order is the reference.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from sglang_recording import Call, RecordingEngine, RecordingMemory
from spade.rollout.manager import HFRolloutManager, SGLangRolloutManager
from spade.rollout.sglang.deployment import ServerPlan, SGLangDeployment
from spade.rollout.sglang.settings import SGLangSection


class StageLog(SGLangRolloutManager):
    """The real SGLang manager, its stages also written to the log as they start."""

    async def offload_engine(self) -> None:
        self.deployment.engine.calls.append(Call(None, "stage:offload_engine"))
        await super().offload_engine()

    async def share_samples(self, samples):
        self.deployment.engine.calls.append(Call(None, "stage:share_samples"))
        return await super().share_samples(samples)

    def onload_training(self) -> None:
        self.deployment.engine.calls.append(Call(None, "stage:onload_training"))
        super().onload_training()


def backend_over(log: list, tmp_path: Path, servers: int = 2) -> StageLog:
    deployment = SGLangDeployment(SGLangSection(bucket_mb=1), model_dir=tmp_path, log_dir=tmp_path,
                                  device=torch.device("cpu"), local_rank=0)
    deployment.plans = [ServerPlan(index=i, url=f"http://127.0.0.1:{40000 + i}", owner_rank=0, port=40000 + i,
                                   ipc_ranks=(0,)) for i in range(servers)]
    deployment.engine = RecordingEngine(servers, log)
    backend = StageLog(deployment, is_main=True, device=torch.device("cpu"))
    backend.engine = deployment.engine
    backend.use_training_memory(RecordingMemory(log))
    return backend


def test_the_engine_offloads_then_the_samples_are_shared_then_training_onloads(tmp_path):
    log: list[Call] = []
    backend = backend_over(log, tmp_path)
    assert asyncio.run(backend.switch_to_training(["a", "b"])) == ["a", "b"]
    what = [call.what for call in log]
    stages = [w for w in what if w.startswith("stage:")]
    assert stages == ["stage:offload_engine", "stage:share_samples", "stage:onload_training"]
    releases = [i for i, call in enumerate(log) if call.what == "/release_memory_occupation"]
    assert len(releases) == 2 and {log[i].tags for i in releases} == {("weights", "kv_cache")}
    assert max(releases) < what.index("stage:share_samples") < what.index("onload")
    assert "time/onload_s" in backend.step_metrics()


def test_a_step_without_samples_moves_no_memory(tmp_path):
    log: list[Call] = []
    backend = backend_over(log, tmp_path)
    assert asyncio.run(backend.switch_to_training([])) == []
    assert [call.what for call in log] == ["stage:share_samples"]
    assert asyncio.run(backend.switch_to_training(None)) == []


def test_the_in_process_engine_only_shares():
    backend = HFRolloutManager(None, is_main=True, device=torch.device("cpu"))
    assert asyncio.run(backend.switch_to_training(["x"])) == ["x"]
    assert backend.step_metrics() == {}
