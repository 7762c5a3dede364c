"""The SGLang servers of one training job: placement, launch, restart, memory and weight sync.

Roles under ``torchrun`` (one process per GPU; ARCHITECTURE "Process model"):

* local rank 0 of every node launches that node's servers (``ServerLauncher`` + ``sglang_argv``)
  and is the only process that restarts them;
* global rank 0 holds the ``SGLangEngine`` over every node's servers (the orchestrator's engine)
  and makes every control call (pause, release, resume, weight updates);
* every rank takes part in a weight sync: the model's tensors are gathered across TP and EP on
  every rank, and, colocated, each rank hands over CUDA-IPC handles of its own GPU's copy for the
  server worker that runs on the same GPU.

Placement (colocated, ``engine.sglang.urls`` empty): node ``n`` runs ``servers_per_node`` servers;
server ``i`` of a node uses ``tp * dp`` GPUs from GPU ``i * tp * dp`` (``--base-gpu-id``) and
listens on ``port + i``. Its tensor-parallel worker ``t`` is fed by the training process with
local rank ``base + t`` (same GPU, so the IPC copy stays on the device; data-parallel replicas
inside one server read the same handles across GPUs). The IPC update is
``weight_transport.update_weights_by_ipc``, the same function ``spade engine check``, the benchmark
and the GPU tests run from one process. Disaggregated (``urls`` given): the servers
are someone else's; weights go by an NCCL broadcast from global rank 0
(``weight_transport.BroadcastWeightSender``) and a dead server is avoided, not restarted.

A restarted server serves the model it was launched with, not the current weights: the engine
holds it (no request goes to it) from the restart until the weight sync to it has completed.

All methods are called by every rank at the same point unless they say "rank 0"; blocking
collectives run in a worker thread so that global rank 0's event loop keeps serving rollouts
while, for example, another node restarts a server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch
from torch import Tensor

from ...collectives import all_gather_object, barrier, broadcast_object, gather_object_to_0, in_thread, world
from ...rl.routing_record import RoutingShape
from .launcher import ServerLauncher, ServerStartError, sglang_argv
from .engine import SGLangEngine
from .settings import SGLangSection
from .weight_transport import Collectives, IpcFeed, IpcWeightUpdater, update_weights_by_ipc

log = logging.getLogger("spade.sglang")

# The interpreter that runs ``-m sglang.launch_server`` (the Docker image keeps SGLang, which pins
# its own torch, in a separate environment); default: this one.
PYTHON_VARIABLE = "SPADE_SGLANG_PYTHON"
# Defaults of the servers' environment (``engine.sglang.server_env`` wins): ``/health`` as a plain
# liveness check, not a one-token generation (which times out while generation is paused).
# SGLANG_RETURN_ORIGINAL_LOGPROB off whatever the trainer's environment says: the log-probs must
# be those of the sampled, tempered distribution (spade.rollout.engine; settings.py refuses it in server_env).
SERVER_ENV_DEFAULTS = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0", "SGLANG_RETURN_ORIGINAL_LOGPROB": "0"}
# What torchrun sets for its workers: a server launched from a training rank must not take itself
# for rank RANK of the trainer's world (SGLang builds its own process groups).
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                      "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                      "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING")


def server_environment(settings: SGLangSection, base: Optional[dict] = None) -> dict[str, str]:
    """The whole environment of a launched server: this process's, without torchrun's worker
    variables, plus ``SERVER_ENV_DEFAULTS``, plus ``engine.sglang.server_env``."""
    base = dict(os.environ if base is None else base)
    env = {k: v for k, v in base.items() if k not in TORCHRUN_VARIABLES}
    return {**env, **SERVER_ENV_DEFAULTS, **{k: str(v) for k, v in settings.server_env.items()}}

WeightStream = Callable[[], Iterator[tuple[str, Tensor]]]
# The trainer's world: every rank feeds the server worker on its GPU.
WORLD = Collectives(gather_to_0=gather_object_to_0, barrier=barrier, broadcast_from_0=broadcast_object)


class DeploymentError(RuntimeError):
    """The servers cannot be placed, started or kept alive."""


@dataclass(frozen=True)
class RankInfo:
    """Where one training process runs."""

    rank: int
    local_rank: int
    node: str  # a name shared by the processes of one node


@dataclass(frozen=True)
class ServerPlan:
    """One server: where it runs, who owns it, which ranks feed its tensor-parallel workers."""

    index: int  # position in the engine's server list
    url: str
    owner_rank: Optional[int] = None  # None: an external server (not ours to start)
    port: int = 0
    base_gpu: int = 0
    ipc_ranks: tuple[int, ...] = ()  # global rank feeding TP worker t (colocated)


def _node_name() -> str:
    return os.environ.get("GROUP_RANK") or socket.gethostname()


def advertised_host(settings: SGLangSection) -> str:
    """The address other processes use to reach this node's servers."""
    if settings.advertise_host:
        return settings.advertise_host
    if settings.host in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return settings.host


def plan_servers(ranks: Sequence[RankInfo], settings: SGLangSection, hosts: dict[str, str]) -> list[ServerPlan]:
    """Colocated servers for the processes ``ranks`` (all of the world), in node order.

    ``hosts`` maps a node name to the address its servers are reached at. Raises
    ``DeploymentError`` when a node has fewer processes (GPUs) than its servers need.
    """
    per_server = settings.tp * settings.dp
    needed = settings.servers_per_node * per_server
    nodes: dict[str, list[RankInfo]] = {}
    for info in sorted(ranks, key=lambda r: r.rank):
        nodes.setdefault(info.node, []).append(info)
    plans: list[ServerPlan] = []
    for node, members in nodes.items():
        by_local = {m.local_rank: m.rank for m in members}
        if len(members) < needed or sorted(by_local) != list(range(len(members))):
            raise DeploymentError(
                f"engine.sglang: node {node} has {len(members)} training processes (local ranks "
                f"{sorted(by_local)}) but servers_per_node * tp * dp = {settings.servers_per_node} * "
                f"{settings.tp} * {settings.dp} = {needed} GPUs are needed; colocated servers use the "
                "training processes' GPUs, one process per GPU")
        for slot in range(settings.servers_per_node):
            base = slot * per_server
            port = settings.port + slot
            plans.append(ServerPlan(
                index=len(plans), url=f"http://{hosts[node]}:{port}", owner_rank=by_local[0], port=port,
                base_gpu=base, ipc_ranks=tuple(by_local[base + t] for t in range(settings.tp))))
    return plans


# ---------------------------------------------------------------------------- the deployment


class SGLangDeployment:
    """The job's SGLang servers as seen from one training process (see the module docstring)."""

    def __init__(self, settings: SGLangSection, *, model_dir: Path, log_dir: Path, device: torch.device,
                 local_rank: int, python: Optional[str] = None, routing: Optional[RoutingShape] = None):
        self.settings = settings
        self.routing = routing  # routing replay: servers return every request's routed experts
        self.model_dir = Path(model_dir)
        self.log_dir = Path(log_dir)
        self.device = device
        self.local_rank = local_rank
        self.python = python or os.environ.get(PYTHON_VARIABLE) or sys.executable
        self.rank, self.world = world()
        self.plans: list[ServerPlan] = []
        self.launchers: dict[int, ServerLauncher] = {}
        self.restarts: dict[int, int] = {}
        self.engine: Optional[SGLangEngine] = None
        self.sender: Any = None  # BroadcastWeightSender on rank 0 (disaggregated)
        self.recover_hook: Optional[Callable[[int], Any]] = None  # rank 0: set by the trainer
        self._recoveries: dict[int, asyncio.Task] = {}

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def method(self) -> str:
        return self.settings.sync_method

    @property
    def releases_memory(self) -> bool:
        """The servers share their GPUs with the trainer and give their memory back while it trains."""
        return self.settings.release_memory and self.settings.colocated

    # ------------------------------------------------------------------ start and stop

    def server_argv(self, plan: ServerPlan) -> list[str]:
        s = self.settings
        return sglang_argv(self.model_dir, tp=s.tp, ep=s.ep, dp=s.dp, mem_fraction=s.mem_fraction, port=plan.port,
                           host=s.host, extra_args={"base_gpu_id": plan.base_gpu, **s.server_args},
                           python=self.python, command=s.server_command or None,
                           return_routed_experts=self.routing is not None)

    async def start(self) -> None:
        """Every rank: place the servers, launch this node's, and (rank 0) open the engine."""
        s = self.settings
        me = (RankInfo(self.rank, self.local_rank, _node_name()), advertised_host(s))
        infos = await in_thread(self.device, all_gather_object, me)
        if s.colocated:
            hosts = {info.node: host for info, host in infos}
            self.plans = plan_servers([info for info, _ in infos], s, hosts)
        else:
            self.plans = [ServerPlan(index=i, url=url.rstrip("/")) for i, url in enumerate(s.urls)]
        await self._launch()

    async def _launch(self) -> None:
        """Every rank, once ``plans`` are set: the owners launch their servers; rank 0 opens the engine."""
        s = self.settings
        mine = [p for p in self.plans if p.owner_rank == self.rank]
        error = None
        if mine:
            for plan in mine:
                self.launchers[plan.index] = ServerLauncher(
                    self.server_argv(plan), host=s.host, port=plan.port, start_timeout_s=s.start_timeout_s,
                    log_path=self.log_dir / f"sglang-server-{plan.index}.log",
                    env=server_environment(s), inherit_env=False)
            results = await asyncio.gather(*(self.launchers[p.index].start() for p in mine), return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            if failures:
                error = f"rank {self.rank}: {failures[0]}"
        errors = [e for e in await in_thread(self.device, all_gather_object, error) if e]
        if errors:
            await self.close()
            raise DeploymentError("SGLang servers failed to start:\n" + "\n".join(errors))
        if self.is_main:
            self.engine = SGLangEngine([p.url for p in self.plans], max_retries=s.max_retries,
                                       request_timeout_s=s.request_timeout_s, on_server_failure=self._on_failure,
                                       weight_updater=IpcWeightUpdater(max_bucket_bytes=s.bucket_mb << 20),
                                       routing=self.routing)
            if self.method == "broadcast":
                await self._connect_broadcast()

    def shard_engine(self, shard: int, shards: int) -> SGLangEngine:
        """A generation client over rollout shard ``shard``'s servers (``selfplay.rollout_shards``):
        the ``shard``-th of ``shards`` contiguous blocks of the servers, in node order, so with one
        shard per node a shard reaches its own node's. It sends no weights and restarts nothing:
        rank 0's engine does both for every server, at the step boundaries, when no shard plays."""
        if not self.plans or len(self.plans) % shards:
            raise DeploymentError(f"selfplay.rollout_shards: {len(self.plans)} SGLang servers do not split into "
                                  f"{shards} equal blocks; allowed: a divisor of the server count")
        size = len(self.plans) // shards
        s = self.settings
        return SGLangEngine([p.url for p in self.plans[shard * size:(shard + 1) * size]], max_retries=s.max_retries,
                            request_timeout_s=s.request_timeout_s, routing=self.routing)

    async def _connect_broadcast(self) -> None:
        from .weight_transport import BroadcastWeightSender

        infos = await self.engine.server_info()
        tp_sizes = [int(info.get("tp_size", 1)) if isinstance(info, dict) else 1 for info in infos]
        port = self.settings.broadcast_port or _free_port()
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.sender = BroadcastWeightSender(self.engine, server_tp_sizes=tp_sizes,
                                            master_address=_reachable_address(), master_port=port, backend=backend,
                                            max_bucket_bytes=self.settings.bucket_mb << 20)
        await self.sender.connect()

    async def close(self) -> None:
        """Every rank: stop the engine (rank 0) and this node's servers."""
        for task in self._recoveries.values():
            task.cancel()
        if self.sender is not None:
            await self.sender.close()
            self.sender = None
        if self.engine is not None:
            await self.engine.aclose()
            self.engine = None
        await asyncio.gather(*(launcher.close() for launcher in self.launchers.values()), return_exceptions=True)

    # ------------------------------------------------------------------ memory around a train step

    async def release_before_training(self) -> None:
        """Every rank, once the servers are up and before the trainer's model is built: colocated,
        the servers give back the weights and KV cache they took at start, so the model, its
        optimizer and the first weight sync find the GPUs free. The first ``resume_and_sync``
        brings the memory back in its usual order, and must send the weights: the memory saver
        does not keep them across a release."""
        if not self.releases_memory:
            return
        if self.is_main:
            await self.release()
        await in_thread(self.device, barrier)  # every node's servers, before any rank builds its model

    async def release(self) -> None:
        """Rank 0: drain, pause generation and release weights and KV cache on live servers.

        A server that does not answer is left for ``resume_and_sync`` to restart."""
        if not self.releases_memory:
            await self.engine.close_admission()
            return
        await self.engine.release_memory(skip_unreachable=True)
        for index in sorted(set(range(len(self.plans))) - self.engine.released):
            state = "is paused but" if index in self.engine.paused else "is not paused and"
            log.warning("server %d %s did not release its memory; it is checked before the weight sync", index, state)

    async def resume_and_sync(self, weights: WeightStream, version: int, *, changed: bool = True,
                              make_room: Optional[Callable[[], Any]] = None) -> list[int]:
        """Every rank, after the train step: restart dead servers (released as they come up),
        resume weight memory, send the weights (version ``version``; to every server when they
        ``changed``, else only to restarted ones and to any still held from a failed sync), call
        ``make_room`` (the trainer's parameters leave the GPU) and wait until every rank has, then
        resume the KV cache and continue generation. Returns the servers that were restarted."""
        dead: list[int] = []
        held: list[int] = []
        if self.is_main:
            dead = await self._dead_servers()
            held = sorted(self.engine.held)
        dead, held = await in_thread(self.device, broadcast_object, (dead, held))
        await self.restart(dead)
        if self.is_main:
            if dead and self.releases_memory:  # it came up holding its memory: the order below is for all
                await self.engine.release_idle(dead)
            await self.engine.resume_weights_memory()
        stale = sorted(set(dead) | set(held))
        if changed or stale:
            await self.sync_weights(weights, version, None if changed else stale)
        if make_room is not None:
            make_room()
            await in_thread(self.device, barrier)  # a server's KV cache lands on other ranks' GPUs too
        if self.is_main:
            await self.engine.resume_generation()
        return dead

    async def _dead_servers(self) -> list[int]:
        healthy = await self.engine.health()
        return [p.index for p, ok in zip(self.plans, healthy) if not ok and p.owner_rank is not None]

    # ------------------------------------------------------------------ restart

    async def restart(self, indices: Sequence[int]) -> None:
        """Every rank: the owners restart the servers ``indices`` (all ranks learn the outcome).
        Rank 0's engine holds them until ``sync_weights`` has sent them the weights."""
        if not indices:
            return
        if self.is_main:
            for index in indices:
                if self.plans[index].owner_rank is not None:
                    self.engine.hold(index)
        error = None
        for index in indices:
            launcher = self.launchers.get(index)
            if launcher is None:
                continue
            self.restarts[index] = self.restarts.get(index, 0) + 1
            if self.restarts[index] > self.settings.max_restarts:
                error = (f"server {index} died more than engine.sglang.max_restarts = "
                         f"{self.settings.max_restarts} times; last log lines:\n{launcher.log_tail()}")
                break
            log.warning("restarting SGLang server %d (%s); log %s", index, self.plans[index].url, launcher.log_path)
            try:
                await launcher.restart(grace_s=5.0)
            except ServerStartError as exc:
                error = f"server {index} did not come back: {exc}"
                break
        errors = [e for e in await in_thread(self.device, all_gather_object, error) if e]
        if errors:
            raise DeploymentError("\n".join(errors))
        if self.is_main:
            self.engine.forget_released(indices)

    async def recover(self, indices: Sequence[int], weights: WeightStream, version: int, *,
                      make_room: Optional[Callable[[], Any]] = None) -> None:
        """Every rank, while the other servers generate: restart the servers ``indices`` and send
        them the current weights (version ``version``). Colocated, a restarted server comes up
        holding its weights and KV cache, and the sync brings the trainer's parameters back onto
        the GPUs, so it goes through the publish order first: its memory released at once (it
        takes no request while held), weights resumed, the weights sent, ``make_room`` (the
        parameters leave) on every rank, then its KV cache resumed; only then does it take requests."""
        await self.restart(indices)
        if self.is_main and self.releases_memory:
            await self.engine.release_idle(indices)
            await self.engine.resume_weights_memory(indices)
        await self._send_weights(weights, version, indices)
        if make_room is not None:
            make_room()
            await in_thread(self.device, barrier)
        if self.is_main:
            if self.releases_memory:
                await self.engine.resume_kv_cache(indices)
            self._serve(indices, version)

    async def _on_failure(self, index: int) -> None:
        """Rank 0, the engine's hook: one recovery per failed server at a time."""
        if self.plans[index].owner_rank is None or self.recover_hook is None:
            raise DeploymentError(f"server {index} ({self.plans[index].url}) failed and is not ours to restart")
        task = self._recoveries.get(index)
        if task is None or task.done():  # registered before any await: concurrent failures share it
            task = asyncio.ensure_future(self._recover_if_dead(index))
            self._recoveries[index] = task
        await asyncio.shield(task)

    async def _recover_if_dead(self, index: int) -> None:
        if await self._alive(index):
            return  # a transient failure, or already restarted: retry as is
        await self.recover_hook(index)

    async def _alive(self, index: int) -> bool:
        from .launcher import http_get_status

        plan = self.plans[index]
        host, _, port = plan.url.removeprefix("http://").rpartition(":")
        return await http_get_status(host, int(port), "/health", timeout_s=5.0) == 200

    # ------------------------------------------------------------------ weights

    async def sync_weights(self, weights: WeightStream, version: int,
                           servers: Optional[Sequence[int]] = None) -> None:
        """Every rank: send the model (``weights()`` streams it on every rank) to ``servers``
        (default all), set the engine's weight version, and let the engine place requests on
        those servers again (a restarted one is held until here)."""
        indices = [p.index for p in self.plans if servers is None or p.index in servers]
        await self._send_weights(weights, version, indices)
        if self.is_main:
            self._serve(indices, version)

    async def _send_weights(self, weights: WeightStream, version: int, indices: Sequence[int]) -> None:
        if self.method == "ipc":
            feed = IpcFeed({index: self.plans[index].ipc_ranks for index in indices})
            await update_weights_by_ipc(self.engine if self.is_main else None, weights(), version, feed=feed,
                                        rank=self.rank, max_bucket_bytes=self.settings.bucket_mb << 20,
                                        device=self.device, collectives=WORLD)
        elif self.is_main:
            await self.sender.send(weights(), version)  # every server is in the group; it opens the session
            if indices:
                await self.engine.post_to(indices, "flush_cache", None)
        else:
            await in_thread(self.device, _drain, weights())

    def _serve(self, indices: Sequence[int], version: int) -> None:
        """Rank 0: the servers ``indices`` hold version ``version`` and take requests again."""
        self.engine.set_weight_version(version)
        for index in indices:
            self.engine.mark_healthy(index)


def _drain(iterator: Iterable[Any]) -> None:
    for _ in iterator:
        pass


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _reachable_address() -> str:
    return os.environ.get("MASTER_ADDR") or socket.gethostname()
