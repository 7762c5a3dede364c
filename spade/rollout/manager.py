"""One rollout manager per engine kind: the engine's lifecycle around a train step.

The trainer's step reads the same for every engine::

    out = await orchestrator.run_step(step)                    # rank 0 generates
    samples = await rollout.switch_to_training(out.samples)    # see below
    metrics = learner.update(samples)
    await rollout.publish(learner.weight_stream, version)      # the engine serves the new weights

``switch_to_training`` is three stages, named as slime's loop names them: :meth:`~RolloutManager.
offload_engine` (rank 0: the engine gives up its device memory), :meth:`~RolloutManager.share_samples`
(rank 0's samples reach every rank) and :meth:`~RolloutManager.onload_training` (every rank: the
training state back onto the device). A step without samples trains nothing, so it moves no memory.
While rank 0 runs rollouts the other ranks wait inside ``share_samples`` for rank 0's commands: the
samples (then it returns), or, with SGLang, "a server died: restart it and send it the current
weights" (every rank takes part in the weight sync). The commands go over the control group
(``collectives``: gloo, long timeout), so the wait may last as long as the rollouts and evaluation
take.

* :class:`HFRolloutManager` (``engine.kind: hf``): an in-process engine on rank 0; ``publish`` copies
  the weights into it (every rank takes part in the gathers of the weight stream).
* :class:`SGLangRolloutManager` (``engine.kind: sglang``): owns the ``SGLangDeployment``. ``start``
  launches the servers and, colocated, has them release their weights and KV cache before the
  trainer's model is built. Before the update it releases them again (``offload_engine``) and
  brings the training state back to the device (``onload_training``); ``publish`` moves the
  optimizer state and gradients to host, restarts dead servers, resumes their weights' memory,
  sends the weights (CUDA IPC colocated, NCCL broadcast otherwise), moves the parameters to host
  and empties the CUDA cache on every rank, and only then resumes the servers' KV cache and
  continues generation. A server that dies mid-rollout is restarted and re-sent the current
  weights in the same order (its memory released at once, its KV cache back only once the
  parameters are on host again), and takes requests only afterwards (``_recover``).

The training state's offloader reaches the SGLang manager as a :class:`TrainingMemory`; this layer
never imports the trainer.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Optional, Protocol, Sequence

import torch
from torch import Tensor

from ..collectives import broadcast_object, in_thread
from .engine import RolloutEngine

log = logging.getLogger("spade.rollout")

WeightStream = Callable[[], Iterator[tuple[str, Tensor]]]


class MoveReport(Protocol):
    seconds: float

    @property
    def total_bytes(self) -> int: ...


class TrainingMemory(Protocol):
    """The trainer's device memory, moved to host while the engine generates (training.offload)."""

    def onload(self) -> Sequence[MoveReport]: ...

    def onload_params(self) -> MoveReport: ...

    def offload_state(self) -> MoveReport: ...

    def offload_params(self) -> MoveReport: ...


@dataclass(frozen=True)
class _Command:
    """What rank 0 tells the other ranks while it runs the rollouts."""

    kind: Literal["samples", "recover"]
    samples: Optional[list] = None
    servers: tuple[int, ...] = ()


class RolloutManager:
    """The lifecycle of one engine kind around a train step (see the module docstring)."""

    def __init__(self, *, is_main: bool, device: Any):
        self.is_main = is_main
        self.device = device
        self.engine: Optional[RolloutEngine] = None  # rank 0 only
        # selfplay.rollout_shards: the engine this rank plays its shard's block with (rank 0 and the
        # other shards; None: the plays use ``engine``)
        self.play_engine: Optional[RolloutEngine] = None
        self.version = 0  # the weight version the engine serves
        self._lock = asyncio.Lock()  # rank 0: one collective command at a time
        self._metrics: dict[str, float] = {}

    async def start(self) -> None:
        """Every rank, before the trainer's model is built: the engine is up and holds none of the
        device memory the model will need."""

    async def switch_to_training(self, samples: Optional[list], *, keep_serving: bool = False) -> list:
        """Every rank, between the rollouts and the update: rank 0 passes the step's samples and
        every rank gets them back, with the device's memory handed from the engine to training.
        ``keep_serving`` (``run.overlap: 1``, the engine on other devices than training): the engine
        goes on taking requests through the update (the next step's rollout)."""
        if self.is_main and samples and not keep_serving:
            await self.offload_engine()
        samples = await self.share_samples(samples)
        if samples:
            self.onload_training()
        return samples

    async def open_shard(self, shard: int, shards: int) -> None:
        """A rollout shard's rank (``selfplay.rollout_shards``), after ``start``: what it plays with,
        when that is not ``engine`` (set ``play_engine``)."""

    async def offload_engine(self) -> None:
        """Rank 0, before the samples are shared: the engine releases its device memory."""

    def onload_training(self) -> None:
        """Every rank, once the samples are shared: the training state back onto the device."""

    async def publish(self, weights: WeightStream, version: int, *, changed: bool = True) -> None:
        """Every rank: the engine serves the trainer's weights as ``version`` from now on
        (``changed=False``: the weights are those of the current version)."""
        raise NotImplementedError

    def step_metrics(self) -> dict[str, float]:
        """``engine/*`` and ``time/*`` figures since the last call."""
        out, self._metrics = self._metrics, {}
        return out

    async def close(self) -> None:
        """Every rank."""

    async def share_samples(self, samples: Optional[list]) -> list:
        """Every rank: rank 0 passes the step's samples and every rank gets them back (the other
        ranks serve rank 0's commands meanwhile)."""
        if self.is_main:
            async with self._lock:
                await in_thread(self.device, broadcast_object, _Command("samples", samples=list(samples or [])))
            return list(samples or [])
        while True:
            command = await in_thread(self.device, broadcast_object, None)
            if command.kind == "samples":
                return command.samples
            await self._serve(command)

    async def _serve(self, command: _Command) -> None:
        raise RuntimeError(f"rollout command {command.kind!r} is not served by {type(self).__name__}")


class HFRolloutManager(RolloutManager):
    """The in-process transformers engine on rank 0 (CPU, or one GPU), and on every rollout shard
    (``selfplay.rollout_shards``): each takes the weights from the stream every rank reads."""

    def __init__(self, engine: Optional[RolloutEngine], *, is_main: bool, device: Any):
        super().__init__(is_main=is_main, device=device)
        self.engine = engine

    async def publish(self, weights: WeightStream, version: int, *, changed: bool = True) -> None:
        if changed:
            stream = weights()
            if self.engine is not None:
                await self.engine.update_weights(stream, version=version)
            else:
                for _ in stream:  # take part in the gathers
                    pass
        self.version = version

    async def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


class SGLangRolloutManager(RolloutManager):
    """SGLang servers launched on (or reached from) the training nodes."""

    def __init__(self, deployment: Any, *, is_main: bool, device: Any):
        super().__init__(is_main=is_main, device=device)
        self.deployment = deployment
        self.memory: Optional[TrainingMemory] = None
        self._weights: Optional[WeightStream] = None
        deployment.recover_hook = self._recover

    def use_training_memory(self, memory: Optional[TrainingMemory]) -> None:
        """The training state to move to host while the servers generate (colocated runs)."""
        self.memory = memory

    async def start(self) -> None:
        deployment = self.deployment
        settings = deployment.settings
        if settings.colocated and not settings.server_command and deployment.local_rank == 0:
            # one torch and one NCCL on both sides, or the weight hand-over cannot work: refuse early
            from .sglang.runtime_versions import check_sglang_runtime
            from .sglang.deployment import server_environment

            await asyncio.to_thread(check_sglang_runtime, deployment.python, env=server_environment(settings))
        await deployment.start()
        self.engine = deployment.engine
        await deployment.release_before_training()

    async def open_shard(self, shard: int, shards: int) -> None:
        """A shard rank, after ``start``: a client over its block of the servers (``play_engine``)."""
        self.play_engine = self.deployment.shard_engine(shard, shards)
        self.play_engine.set_weight_version(self.version)

    async def offload_engine(self) -> None:
        # the servers' weights and KV cache; only when something trains, because SGLang's memory
        # saver does not keep the weights across a release
        await self.deployment.release()

    def onload_training(self) -> None:
        if self.memory is not None:
            self._metrics["time/onload_s"] = sum(report.seconds for report in self.memory.onload())

    async def publish(self, weights: WeightStream, version: int, *, changed: bool = True) -> None:
        self._weights = weights
        away = []
        if self.memory is not None:
            away.append(self.memory.offload_state())  # room for the engine's weights
        restarted = await self.deployment.resume_and_sync(weights, version, changed=changed,
                                                          make_room=lambda: self._make_room(away))
        self.version = version
        if self.play_engine is not None:  # the servers were synced by rank 0's engine
            self.play_engine.set_weight_version(version)
        if self.memory is not None:
            self._metrics["time/offload_s"] = sum(report.seconds for report in away)
            self._metrics["engine/offloaded_gib"] = sum(report.total_bytes for report in away) / 2**30
        self._metrics["engine/restarted_servers"] = float(len(restarted))
        self._metrics["engine/restarts_total"] = float(sum(self.deployment.restarts.values()))

    def _make_room(self, away: list) -> None:
        """After the weights are sent and before a KV cache comes back: at an RL mem_fraction
        (0.8-0.85) the cache only fits once the parameters and the sync's buckets are gone."""
        if self.memory is not None:
            away.append(self.memory.offload_params())
        if torch.device(self.device).type == "cuda":
            torch.cuda.empty_cache()

    async def close(self) -> None:
        if self.play_engine is not None:
            await self.play_engine.aclose()
            self.play_engine = None
        await self.deployment.close()
        self.engine = None

    async def _recover(self, index: int) -> None:
        """Rank 0 (the engine's failure hook, during rollouts): with every rank, restart server
        ``index`` and send it the current weights."""
        async with self._lock:
            await in_thread(self.device, broadcast_object, _Command("recover", servers=(index,)))
            await self._recover_servers((index,))

    async def _serve(self, command: _Command) -> None:
        if command.kind != "recover":
            await super()._serve(command)
        await self._recover_servers(command.servers)

    async def _recover_servers(self, servers: tuple[int, ...]) -> None:
        if self._weights is None:
            raise RuntimeError("a server died before the first weights were published")
        await self.deployment.recover(servers, self._weights, self.version, make_room=lambda: self._make_room([]))
