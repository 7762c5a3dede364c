"""Rollout engine over one or more SGLang servers (native ``/generate`` over HTTP/1.1).

Transport. ``http_client.HTTPClient``: keep-alive HTTP/1.1 on asyncio streams, JSON bodies
(``protocol``, ``control_protocol``), server-sent events for streams.

Placement. Each request goes to the healthy server with the fewest requests in flight. A request
may carry an affinity key (``generate_with_affinity``; e.g. the episode id): the first request of
a key picks a server by load and later ones go to the same server, so the multi-turn prompt's
prefix is found in that server's radix cache. ``forget_affinity`` drops a finished episode's key.

Failures. A connection failure, a timeout (``request_timeout_s``) or an HTTP 5xx marks the server
unhealthy for ``unhealthy_cooldown_s`` and re-sends the request (from scratch, new rid), up to
``max_retries`` times; the affinity key moves with it. A timed-out request is aborted on its server
(best effort), so that it does not keep generating there. Without an ``on_server_failure`` hook the retry goes to
another server. With one (the trainer's: restart the server and re-send the weights), the failed
request awaits ``on_server_failure(index)`` and, if that returns, retries on the recovered server;
if it raises, the server is avoided for this request. HTTP 4xx and malformed responses are not
retried.

Stale weights. A server that holds other weights than the current version (restarted, not yet
sent the weights: ``hold``) takes no request until ``mark_healthy`` after its weight sync; while
every server is held, new requests wait.

Memory around a train step (colocated trainer and servers), in this order::

    release_memory():  drain in-flight requests -> /pause_generation
                       -> /release_memory_occupation {"tags": ["weights", "kv_cache"]}
    ... the trainer runs ...
    resume_and_update(named_tensors, version):
                       /resume_memory_occupation {"tags": ["weights"]}
                       -> update weights (weight_updater)
                       -> /resume_memory_occupation {"tags": ["kv_cache"]}
                       -> /continue_generation

The KV cache comes back last so the weight update's temporary buffers do not compete with it.
``resume_memory()`` does the same without the update. New ``generate`` calls wait while memory is
released; in-flight ones are drained first so each result is produced by a single weight version.
Paused and released servers are tracked apart: a server whose release failed after its pause is
still paused, and ``/continue_generation`` goes to every paused server. A server restarted while
the others generate takes the same order on its own, with admission left open: ``release_idle``
(it is held, so nothing runs on it), ``resume_weights_memory(indices)``, the update,
``resume_kv_cache(indices)``.

Streaming. ``generate_stream`` sends ``"stream": true`` and reads SGLang's server-sent events as
they arrive (``protocol.StreamProgress`` turns cumulative or incremental events into
chunks); the per-event wait is ``request_timeout_s``. Failures before the first token are retried
as above; after it, the error is raised (the tokens already yielded cannot be taken back). A
caller that stops iterating closes the connection and posts ``/abort_request`` for the rid, so
the server stops generating at once.

Weights. ``update_weights`` calls the ``weight_updater(engine, named_tensors, version)`` (sync or
async) the engine was given: ``weight_transport.IpcWeightUpdater`` (colocated servers, from this
one process; CPU tensors travel as shared-memory handles) or a ``BroadcastWeightSender``. Without
one it raises. A multi-rank trainer sends its weights through ``SGLangDeployment``.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Optional, Sequence, Union

from torch import Tensor

from ..engine import (EngineClosed, GenerationChunk, GenerationRequest, GenerationResult, GenerationStats,
                      RolloutEngine)
from ...rl.routing_record import RoutingShape
from . import control_protocol as control
from . import protocol as proto
from .http_client import HTTPClient, Peer, RequestTimeout, StreamEnd, TransportError, parse_url

WeightUpdater = Callable[["SGLangEngine", Iterable[tuple[str, Tensor]], int], Union[None, Awaitable[None]]]
FailureHook = Callable[[int], Awaitable[None]]


@dataclass
class ClientStats:
    """Counters of the client (metrics): completed requests, tokens, re-sends, and ``busy_s``, the
    wall time during which at least one request was in flight (a rollout-only clock)."""

    requests: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    retries: int = 0
    busy_s: float = 0.0


class NoHealthyServer(ConnectionError):
    """Every retry failed."""


@dataclass
class ServerState(Peer):
    """A server as placement sees it: its load, failures and health, beside its connections."""

    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    unhealthy_until: float = 0.0
    held: bool = False  # holds stale weights: no request until mark_healthy (after its weight sync)

    def healthy(self, now: float) -> bool:
        return now >= self.unhealthy_until and not self.held


class SGLangEngine(RolloutEngine):
    """``RolloutEngine`` over SGLang servers at ``base_urls`` (``http://host:port``)."""

    def __init__(
        self,
        base_urls: Union[str, Sequence[str]],
        *,
        max_retries: int = 2,
        request_timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        control_timeout_s: float = 300.0,
        unhealthy_cooldown_s: float = 5.0,
        max_idle_connections: int = 64,
        max_affinity_keys: int = 100_000,
        weight_updater: Optional[WeightUpdater] = None,
        initial_weight_version: int = 0,
        on_server_failure: Optional[FailureHook] = None,
        routing: Optional[RoutingShape] = None,
    ) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("at least one SGLang base URL is needed")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.servers: list[ServerState] = []
        for u in urls:
            host, port, prefix = parse_url(u)
            self.servers.append(ServerState(url=u.rstrip("/"), host=host, port=port, prefix=prefix))
        self.max_retries = max_retries
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.control_timeout_s = control_timeout_s
        self.unhealthy_cooldown_s = unhealthy_cooldown_s
        self.max_idle_connections = max_idle_connections
        self.max_affinity_keys = max_affinity_keys
        self.weight_updater = weight_updater
        self.on_server_failure = on_server_failure
        # routing replay: every request asks for its routed experts, decoded with this shape
        self.routing = routing
        self._weight_version = int(initial_weight_version)
        self.stats = ClientStats()
        self._busy_since = 0.0
        self._affinity: OrderedDict[str, int] = OrderedDict()
        self._rr = itertools.count()
        self._closed = False
        self._released: set[int] = set()  # servers whose memory is released
        self._paused: set[int] = set()  # servers paused by release_memory (a superset of the released)
        self._tasks: dict[str, tuple[asyncio.Task, int]] = {}  # rid -> (HTTP task, server index)
        self._background: set[asyncio.Task] = set()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._open: Optional[asyncio.Event] = None  # set while generation is admitted
        self._unheld: Optional[asyncio.Event] = None  # set when a held server is marked healthy
        self._drained: Optional[asyncio.Event] = None  # set while nothing is in flight
        self._control_lock: Optional[asyncio.Lock] = None
        self._client = HTTPClient(connect_timeout_s=connect_timeout_s, max_idle_connections=max_idle_connections,
                                  closed=lambda: self._closed)

    # ------------------------------------------------------------------ interface

    @property
    def weight_version(self) -> int:
        return self._weight_version

    def generation_stats(self) -> GenerationStats:
        stats = self.stats
        return GenerationStats(generated_tokens=stats.generated_tokens, busy_s=stats.busy_s, retries=stats.retries)

    def set_weight_version(self, version: int) -> None:
        """For a ``weight_updater`` or an out-of-band update: the version new results report."""
        self._weight_version = int(version)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return await self.generate_with_affinity(request, request.affinity)

    async def _admitted(self) -> None:
        """Wait while admission is closed (memory released); raise once the engine is closed."""
        self._attach()
        if self._closed:
            raise EngineClosed("SGLangEngine is closed")
        while not self._open.is_set():
            await self._open.wait()
            if self._closed:
                raise EngineClosed("SGLangEngine is closed")

    def _begin(self, server: ServerState) -> None:
        server.in_flight += 1
        server.requests += 1
        if not self._tasks:
            self._busy_since = time.perf_counter()
        self._drained.clear()

    def _end(self, server: ServerState, rid: str) -> None:
        self._tasks.pop(rid, None)
        server.in_flight -= 1
        if not self._tasks:
            self.stats.busy_s += time.perf_counter() - self._busy_since
            self._drained.set()

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        await self._admitted()
        last_error: Optional[BaseException] = None
        tried: set[int] = set()
        for _attempt in range(self.max_retries + 1):
            idx = await self._placement(request.affinity, tried)
            if idx is None:
                break
            rid = uuid.uuid4().hex
            version = self._weight_version
            server = self.servers[idx]
            events: asyncio.Queue = asyncio.Queue()
            self._begin(server)
            pump = asyncio.ensure_future(self._http_stream(
                server, "/generate", proto.generate_payload(request, rid, stream=True), events))
            self._tasks[rid] = (pump, idx)
            progress = proto.StreamProgress(request, default_weight_version=version)
            finished = False
            try:
                while True:
                    item = await events.get()
                    if isinstance(item, StreamEnd):
                        if item.cancelled or self._closed:  # close(): keep what was yielded
                            yield GenerationChunk(finish_reason="abort", weight_version=version)
                            return
                        if item.error is None:
                            raise proto.SGLangProtocolError(
                                "SGLang /generate stream ended without a finish reason")
                        raise item.error
                    chunk = progress.next_chunk(item)
                    if chunk.last:
                        finished = True
                        self.stats.requests += 1
                        self.stats.generated_tokens += progress.seen
                        self.stats.prompt_tokens += len(request.prompt_ids)
                    if chunk.token_ids or chunk.last:
                        yield chunk
                    if chunk.last:
                        return
            except TransportError as exc:
                if progress.seen:
                    self._mark_unhealthy(idx)
                    raise  # tokens are out already: a re-send could not continue them
                self._failed(idx)
                if self._closed:
                    yield GenerationChunk(finish_reason="abort", weight_version=version)
                    return
                last_error = await self._recover_or_avoid(idx, tried, exc)
                continue
            finally:
                if not pump.done():
                    pump.cancel()
                if not finished:
                    self._abort_in_background(idx, rid)
                self._end(server, rid)
        raise NoHealthyServer(
            f"/generate failed on {len(tried)} server(s) after {self.max_retries + 1} attempts: "
            f"{last_error}"
        ) from last_error

    def _routing_for(self, request: GenerationRequest) -> Optional[RoutingShape]:
        if self.routing is None and request.sampling.return_routed_experts:
            raise ValueError("return_routed_experts: build SGLangEngine(routing=RoutingShape...) to decode the answer")
        return self.routing

    async def generate_with_affinity(
        self, request: GenerationRequest, affinity: Optional[str]
    ) -> GenerationResult:
        """``generate`` pinned by ``affinity`` (e.g. an episode id) to one server while it is healthy."""
        routing = self._routing_for(request)
        await self._admitted()
        last_error: Optional[BaseException] = None
        tried: set[int] = set()
        for _attempt in range(self.max_retries + 1):
            idx = await self._placement(affinity, tried)
            if idx is None:
                break
            rid = uuid.uuid4().hex
            version = self._weight_version
            payload = proto.generate_payload(request, rid, return_routed_experts=self.routing is not None)
            server = self.servers[idx]
            self._begin(server)
            task = asyncio.ensure_future(
                self._http(server, "POST", "/generate", payload, self.request_timeout_s)
            )
            self._tasks[rid] = (task, idx)
            try:
                status, data = await asyncio.shield(task)
            except asyncio.CancelledError:
                if self._closed and task.cancelled():
                    return GenerationResult((), (), "abort", version)
                task.cancel()
                raise
            except TransportError as exc:
                self._failed(idx)
                if self._closed:
                    return GenerationResult((), (), "abort", version)
                if isinstance(exc, RequestTimeout):
                    self._abort_in_background(idx, rid)
                last_error = await self._recover_or_avoid(idx, tried, exc)
                continue
            finally:
                self._end(server, rid)
            if status >= 400 and not (isinstance(data, dict) and "error" in data):
                raise proto.SGLangServerError(f"SGLang /generate failed with HTTP {status}: {data!r}")
            result = proto.parse_generate_response(data, request, default_weight_version=version,
                                                   routing=routing)
            self.stats.requests += 1
            self.stats.generated_tokens += len(result.token_ids)
            self.stats.prompt_tokens += len(request.prompt_ids)
            return result
        raise NoHealthyServer(
            f"/generate failed on {len(tried)} server(s) after {self.max_retries + 1} attempts: "
            f"{last_error}"
        ) from last_error

    def _failed(self, idx: int) -> None:
        """A try on server ``idx`` failed in transport: one more re-send, the server unhealthy."""
        self.stats.retries += 1
        self._mark_unhealthy(idx)

    async def _recover_or_avoid(self, idx: int, tried: set[int], error: BaseException) -> BaseException:
        """After ``error`` on server ``idx``: when the failure hook brings the server back the next try
        may go there again; otherwise the request avoids it (``tried``). Returns the error to report
        should every try fail (the hook's own error, when it raised)."""
        recovered, recovery_error = await self._recovered(idx)
        if not recovered:
            tried.add(idx)
            return recovery_error or error
        return error

    async def _recovered(self, idx: int) -> tuple[bool, Optional[BaseException]]:
        """Await the failure hook for server ``idx``: (True, None) when it says the server is back,
        (False, the hook's error) when the recovery failed and the request must go elsewhere."""
        if self.on_server_failure is None:
            return False, None
        try:
            await self.on_server_failure(idx)
        except Exception as exc:
            return False, exc
        self.servers[idx].unhealthy_until = 0.0  # a held server stays held until its weights are sent
        return True, None

    def hold(self, idx: int) -> None:
        """Server ``idx`` holds stale weights (e.g. restarted): no request goes to it until
        ``mark_healthy(idx)``, which its weight sync calls once the weights are loaded."""
        self.servers[idx].held = True

    def mark_healthy(self, idx: int) -> None:
        """Server ``idx`` serves the current weights and takes requests again."""
        server = self.servers[idx]
        server.unhealthy_until = 0.0
        if server.held:
            server.held = False
            if self._unheld is not None:
                self._unheld.set()

    @property
    def held(self) -> frozenset[int]:
        """The servers waiting for their weights (``hold``)."""
        return frozenset(i for i, s in enumerate(self.servers) if s.held)

    def forget_affinity(self, affinity: str) -> None:
        self._affinity.pop(affinity, None)

    def server_for(self, affinity: str) -> Optional[str]:
        idx = self._affinity.get(affinity)
        return None if idx is None else self.servers[idx].url

    async def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        self._attach()
        if self._closed:
            raise EngineClosed("SGLangEngine is closed")
        if self.weight_updater is None:
            raise RuntimeError(
                "SGLangEngine.update_weights: this engine has no weight_updater; pass one, "
                "SGLangEngine(weight_updater=...): weight_transport.IpcWeightUpdater() for colocated servers, "
                "a BroadcastWeightSender for remote ones")
        out = self.weight_updater(self, named_tensors, int(version))
        if inspect.isawaitable(out):
            await out
        self._weight_version = int(version)

    async def close_admission(self) -> None:
        """Hold new ``generate`` calls and wait until nothing is in flight."""
        self._attach()
        self._open.clear()
        await self._drained.wait()

    @property
    def released(self) -> frozenset[int]:
        """The servers whose memory is released."""
        return frozenset(self._released)

    @property
    def paused(self) -> frozenset[int]:
        """The servers whose generation is paused (the released ones, and any whose release failed
        after the pause); ``resume_generation`` continues them all."""
        return frozenset(self._paused)

    async def release_memory(self, *, skip_unreachable: bool = False) -> list[int]:
        """Drain in flight, then on every server not released yet: pause generation, release weights
        and KV cache. Returns the servers released now. With ``skip_unreachable`` a server that does
        not answer or refuses is left unreleased (the trainer restarts it if it is dead) instead of
        failing the call; if it was paused, it stays among the paused."""
        self._attach()
        async with self._control_lock:
            await self.close_admission()
            todo = [i for i in range(len(self.servers)) if i not in self._released]
            results = await asyncio.gather(*(self._release_one(i) for i in todo), return_exceptions=True)
            done = []
            for idx, result in zip(todo, results):
                if isinstance(result, BaseException):
                    if skip_unreachable and isinstance(result, (TransportError, proto.SGLangServerError)):
                        continue
                    raise result
                self._released.add(idx)
                done.append(idx)
            return done

    async def _release_one(self, idx: int) -> None:
        await self.post_to([idx], "pause_generation", control.pause_generation_payload("abort"))
        self._paused.add(idx)
        await self.post_to([idx], "release_memory_occupation", control.release_memory_payload(control.MEMORY_TAGS))

    async def release_idle(self, indices: Iterable[int]) -> None:
        """Release weights and KV cache on the servers ``indices``, which take no requests (held:
        just restarted), while the others go on generating: no drain and no pause. The caller
        resumes them with ``resume_weights_memory(indices)`` and ``resume_kv_cache(indices)``."""
        indices = sorted(indices)
        await self.post_to(indices, "release_memory_occupation", control.release_memory_payload(control.MEMORY_TAGS))
        self._released.update(indices)

    def forget_released(self, indices: Iterable[int]) -> None:
        """Servers restarted since their release hold their memory again and are not paused."""
        self._released.difference_update(indices)
        self._paused.difference_update(indices)

    async def resume_memory(self) -> None:
        """Resume weights, then KV cache, then continue generation (no weight update).

        SGLang's memory saver keeps the weights' contents across a release only on servers started
        with ``--enable-weights-cpu-backup``; otherwise the resumed weights are garbage and
        ``resume_and_update`` (which loads weights in between) is the call to make."""
        await self._resume(None, None)

    async def resume_and_update(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Resume weights -> update weights -> resume KV cache -> continue generation."""
        await self._resume(named_tensors, version)

    async def _resume(self, named_tensors: Any, version: Optional[int]) -> None:
        self._attach()
        async with self._control_lock:
            await self.resume_weights_memory()
            if version is not None:
                await self.update_weights(named_tensors, version)
            await self.resume_generation()

    async def resume_weights_memory(self, indices: Optional[Iterable[int]] = None) -> None:
        """The first part of ``resume_and_update``, for a caller that sends the weights itself:
        the released servers (of ``indices``, default all) get their weights region back."""
        self._attach()
        todo = sorted(self._released if indices is None else self._released.intersection(indices))
        if todo:
            await self.post_to(todo, "resume_memory_occupation", control.resume_memory_payload(["weights"]))

    async def resume_kv_cache(self, indices: Iterable[int]) -> None:
        """The KV cache back on the servers ``indices`` released by ``release_idle`` (their weights
        resumed and sent); admission is left as it is."""
        todo = sorted(self._released.intersection(indices))
        await self.post_to(todo, "resume_memory_occupation", control.resume_memory_payload(["kv_cache"]))
        self._released.difference_update(todo)

    async def resume_generation(self) -> None:
        """The last part: KV cache back on the released servers, generation continued on every
        paused one (even where the KV cache failed to come back: a paused server would hold its
        requests forever), then new ``generate`` calls are admitted again. Raises the first
        failure once every server has been handled."""
        self._attach()
        released, paused = set(self._released), sorted(self._paused | self._released)

        async def one(idx: int) -> None:
            try:
                if idx in released:
                    await self.post_to([idx], "resume_memory_occupation", control.resume_memory_payload(["kv_cache"]))
            finally:
                await self.post_to([idx], "continue_generation", control.continue_generation_payload())

        results = await asyncio.gather(*(one(i) for i in paused), return_exceptions=True)
        self._released.clear()
        self._paused.clear()
        self._open.set()
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]

    def close(self) -> None:
        """In-flight requests end with ``finish_reason="abort"`` (no tokens: the non-streaming
        protocol returns nothing partial); servers are asked to abort them (best effort)."""
        if self._closed:
            return
        self._closed = True
        tasks = list(self._tasks.items())
        for rid, (task, idx) in tasks:
            task.cancel()
            self._abort_in_background(idx, rid)
        if self._open is not None:
            self._open.set()  # wake waiters so they raise EngineClosed
        if self._unheld is not None:
            self._unheld.set()
        for server in self.servers:
            for _r, w in server.idle:
                w.close()
            server.idle.clear()

    async def aclose(self) -> None:
        """``close()`` and wait for the best-effort abort calls."""
        self.close()
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    # ------------------------------------------------------------------ control calls

    async def health(self) -> list[bool]:
        """GET /health on every server; marks failures unhealthy, successes healthy."""
        out = []
        for i, s in enumerate(self.servers):
            try:
                status, _ = await self._http(s, "GET", "/health", None, self.connect_timeout_s)
                ok = status == 200
            except TransportError:
                ok = False
            if ok:
                s.unhealthy_until = 0.0
            else:
                self._mark_unhealthy(i)
            out.append(ok)
        return out

    async def server_info(self) -> list[Any]:
        return await self.post_all("get_server_info", None)

    async def flush_cache(self) -> list[Any]:
        return await self.post_all("flush_cache", None)

    async def post_all(self, endpoint: str, payload: Optional[dict]) -> list[Any]:
        """Call a control endpoint (name from ``protocol.ENDPOINTS``) on every server, in
        parallel; raises if any fails."""
        return await self.post_to(range(len(self.servers)), endpoint, payload)

    async def post_to(self, indices: Iterable[int], endpoint: str, payload: Any) -> list[Any]:
        """Call a control endpoint on the servers ``indices``, in parallel; raises if any fails.
        ``payload`` is one body for all, or a callable ``index -> body``."""
        method, path = proto.ENDPOINTS[endpoint]
        self._attach()

        async def one(idx: int) -> Any:
            body = payload(idx) if callable(payload) else payload
            status, data = await self._http(self.servers[idx], method, path, body, self.control_timeout_s)
            return control.check_control_response(path, status, data)

        return list(await asyncio.gather(*(one(i) for i in indices)))

    def _abort_in_background(self, idx: int, rid: str) -> None:
        if self._loop is not None and self._loop.is_running():
            bg = self._loop.create_task(self._abort_quietly(idx, rid))
            self._background.add(bg)
            bg.add_done_callback(self._background.discard)

    async def _abort_quietly(self, idx: int, rid: str) -> None:
        try:
            await self._http(
                self.servers[idx], "POST", "/abort_request", control.abort_request_payload(rid), 5.0
            )
        except Exception:
            pass

    # ------------------------------------------------------------------ placement

    def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        # a new event loop (e.g. successive asyncio.run calls): per-loop primitives afresh
        self._loop = loop
        self._open = asyncio.Event()
        if not self._released and not self._paused:
            self._open.set()
        self._unheld = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._control_lock = asyncio.Lock()
        for s in self.servers:
            s.idle.clear()  # streams belong to the old loop

    def _mark_unhealthy(self, idx: int) -> None:
        s = self.servers[idx]
        s.failures += 1
        s.unhealthy_until = time.monotonic() + self.unhealthy_cooldown_s
        for _r, w in s.idle:
            w.close()
        s.idle.clear()

    async def _placement(self, affinity: Optional[str], avoid: set[int]) -> Optional[int]:
        """``_pick``, waiting while every server is held; None when every held server already
        failed this request and could not be recovered (nothing will release it)."""
        while True:
            if self._closed:
                raise EngineClosed("SGLangEngine is closed")
            idx = self._pick(affinity, avoid)
            if idx is not None:
                return idx
            if all(i in avoid for i, s in enumerate(self.servers) if s.held):
                return None
            self._unheld.clear()
            await self._unheld.wait()

    def _pick(self, affinity: Optional[str], avoid: set[int]) -> Optional[int]:
        """A server for the next attempt: healthy and not tried yet if there is one, else not tried,
        else any; never a held one (None when every server is held)."""
        now = time.monotonic()
        if affinity is not None:
            idx = self._affinity.get(affinity)
            if idx is not None and idx not in avoid and self.servers[idx].healthy(now):
                self._affinity.move_to_end(affinity)
                return idx
        usable = [i for i, s in enumerate(self.servers) if not s.held]
        if not usable:
            return None
        candidates = ([i for i in usable if i not in avoid and self.servers[i].healthy(now)]
                      or [i for i in usable if i not in avoid] or usable)
        least = min(self.servers[i].in_flight for i in candidates)
        tied = [i for i in candidates if self.servers[i].in_flight == least]
        idx = tied[next(self._rr) % len(tied)]
        if affinity is not None:
            self._affinity[affinity] = idx
            self._affinity.move_to_end(affinity)
            while len(self._affinity) > self.max_affinity_keys:
                self._affinity.popitem(last=False)
        return idx

    # ------------------------------------------------------------------ HTTP (http_client)

    async def _http(
        self, s: ServerState, method: str, path: str, payload: Optional[dict], timeout: float
    ) -> tuple[int, Any]:
        """One JSON exchange with server ``s`` (the seam a recording test replaces)."""
        return await self._client.request(s, method, path, payload, timeout)

    async def _http_stream(self, s: ServerState, path: str, payload: dict, events: asyncio.Queue) -> None:
        await self._client.stream(s, path, payload, events, self.request_timeout_s)
