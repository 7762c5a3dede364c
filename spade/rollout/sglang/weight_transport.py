"""Getting trainer weights into SGLang servers: the two transports SGLang accepts.

1. **Serialized tensors** (``/update_weights_from_tensor``, colocated servers).
   ``serialize_named_tensors`` produces what SGLang's ``MultiprocessingSerializer.deserialize``
   reads: the base64 text of a ``multiprocessing.reduction.ForkingPickler`` dump of a list of
   ``(name, tensor)``. ``import torch.multiprocessing`` registers torch's reducers with that
   pickler, so a tensor is not copied into the pickle: a CUDA tensor travels as a CUDA-IPC handle
   (zero copy; the server maps the trainer's memory), a CPU tensor as the name of a shared-memory
   segment. The request body holds one such string per tensor-parallel rank of the server (each
   TP worker decodes its own entry), see ``control_protocol.update_weights_from_tensor_payload``.
   Every receiver needs a dump of its own: each dump takes one reference on the shared memory
   (CUDA IPC reference counter, shared-memory segment) and each decode gives one back, so one dump
   decoded by two workers lets the memory go while one of them may still use it.
   ``update_weights_by_ipc`` (below) is the one colocated update path and serializes per worker.

   CPU tensors are shared with torch's ``file_system`` strategy for the duration of the dump. The
   default ``file_descriptor`` strategy hands the receiver a file descriptor through
   ``multiprocessing``'s resource sharer, which only answers processes holding the sender's
   authkey, i.e. its own multiprocessing children; a server started separately could never
   decode it. With ``file_system`` the pickle carries a shared-memory file name that any process
   on the host can open. Sharing moves the tensor's whole storage into shared memory (once);
   views into one bucket buffer share one storage, so the bucket is shared once and every view
   arrives as a view of the same segment.

   CUDA device numbering: torch's CUDA-IPC handle names the sender's device by *index*. SGLang's
   own serializer (``sglang/srt/utils/patch_torch.py``) swaps that index for the device UUID;
   its receiving side accepts either, but reads a plain index in the server's numbering. So the
   trainer process and the server must see the GPUs in the same order (same
   ``CUDA_VISIBLE_DEVICES``), which holds for colocated servers launched by the trainer.

   Lifetime rule: the sender must keep every serialized tensor (and its process) alive until the
   receiver has loaded it, i.e. until the HTTP call that carried the payload has returned. A
   CUDA-IPC handle points at the sender's memory: freeing or overwriting it earlier makes the
   server load garbage. (CPU segments are reference-counted by torch's shared-memory manager and
   survive an early drop, but do not rely on it.) After the update, ``torch.cuda.ipc_collect()``
   on the sender releases the CUDA blocks the receivers have let go of. Each dump takes one
   reference on a CPU segment that only a decode gives back, so a payload that is never decoded
   (a refused request, a dead server) keeps its segment in ``/dev/shm`` until the sender process
   exits (torch's ``torch_shm_manager`` then removes what its clients left behind).

2. **Broadcast over a process group** (``/init_weights_update_group`` +
   ``/update_weights_from_distributed``, disaggregated servers). The trainer's global rank 0 and
   every TP worker of every server form a new process group, outside the trainer's own
   ``torch.distributed`` world (``open_update_group``). For each bucket of tensors the trainer
   posts the names/dtypes/shapes to every server and broadcasts each tensor from rank 0 in that
   order; each server worker allocates the tensors, receives them and loads them
   (``BroadcastWeightSender``). NCCL on GPUs, gloo on CPUs (tests).

Trust: deserializing runs pickle. ``deserialize_named_tensors`` only resolves torch's own
classes and functions (plus a few plain builtins), which limits accidents; the payloads must
still come from a trusted sender.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import inspect
import io
import logging
import pickle
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import (TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Iterator, Mapping, Optional, Protocol,
                    Sequence, TypeVar, Union)

import torch
from torch import Tensor

from ...collectives import in_thread
from ..weight_buckets import WatchedStream, pack_buckets, unpack_bucket
from . import control_protocol as control

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_GROUP_NAME = "spade_weight_sync"
DEFAULT_BUCKET_BYTES = 512 << 20
# SGLang http_server.py: POST /destroy_weights_update_group {"group_name"} -> {"success", "message"}
# (newer SGLang; older releases answer 404, which close() tolerates).


class Server(Protocol):
    url: str


class ServerGroup(Protocol):
    """What the transports need of the SGLang client (``SGLangEngine`` is one): its servers, a
    control call posted to some or all of them (``post_to`` / ``post_all``, endpoint names from
    ``protocol.ENDPOINTS``, the answers checked), and the weight version it reports."""

    @property
    def servers(self) -> Sequence[Server]: ...

    async def post_to(self, indices: Iterable[int], endpoint: str, payload: Any) -> list[Any]: ...

    async def post_all(self, endpoint: str, payload: Optional[dict]) -> list[Any]: ...

    def set_weight_version(self, version: int) -> None: ...


# ----------------------------------------------------------------- serialized tensors

# The sharing strategy is process-global: serialize one dump at a time so that two threads do not
# restore each other's strategy in the wrong order.
_STRATEGY_LOCK = threading.Lock()


def serialize_named_tensors(named: Sequence[tuple[str, Tensor]]) -> str:
    """One ``serialized_named_tensors`` entry: base64 of a ``ForkingPickler`` dump of
    ``[(name, tensor), ...]`` (CUDA tensors as IPC handles, CPU tensors as shared-memory files).

    Tensors are detached (the pickler refuses non-leaf tensors that require grad). Keep them alive
    until the receiver has loaded them (module docstring). The process-wide sharing strategy is
    ``file_system`` only while dumping and is restored afterwards, even on error.
    """
    import torch.multiprocessing as torch_mp  # registers torch's ForkingPickler reducers
    from multiprocessing.reduction import ForkingPickler

    items: list[tuple[str, Tensor]] = []
    for pair in named:
        name, tensor = pair
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name}: expected a tensor, got {type(tensor).__name__}")
        items.append((str(name), tensor.detach()))
    buffer = io.BytesIO()
    with _STRATEGY_LOCK:
        previous = torch_mp.get_sharing_strategy()
        torch_mp.set_sharing_strategy("file_system")
        try:
            ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(items)
        finally:
            torch_mp.set_sharing_strategy(previous)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


_SAFE_BUILTINS = frozenset({
    "list", "tuple", "dict", "set", "frozenset", "int", "float", "complex", "bool", "str",
    "bytes", "bytearray", "slice", "range",
})


class _TensorUnpickler(pickle.Unpickler):
    """Resolves only torch's own globals (rebuild functions, storage classes, dtypes) and plain
    builtin containers: enough for any ``ForkingPickler`` dump of named tensors."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" or module.startswith("torch."):
            return super().find_class(module, name)
        if module == "builtins" and name in _SAFE_BUILTINS:
            return super().find_class(module, name)
        if module == "collections" and name == "OrderedDict":
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name} from a tensor payload (only torch globals are allowed)"
        )


def deserialize_named_tensors(payload: Union[str, bytes]) -> list[tuple[str, Tensor]]:
    """Inverse of ``serialize_named_tensors`` (SGLang's convention: ``str`` is base64 text,
    ``bytes`` the raw pickle). CUDA tensors map the sender's memory; CPU tensors map its
    shared-memory files; views of one storage come back as views of one storage."""
    import torch.multiprocessing  # noqa: F401  (the rebuild functions live there)

    if isinstance(payload, str):
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"serialized tensors: not valid base64 ({exc})") from None
    elif isinstance(payload, (bytes, bytearray, memoryview)):
        data = bytes(payload)
    else:
        raise TypeError(f"serialized tensors must be str or bytes, got {type(payload).__name__}")
    obj = _TensorUnpickler(io.BytesIO(data)).load()
    if not isinstance(obj, (list, tuple)):
        raise ValueError(f"serialized tensors: expected a list of (name, tensor), got {type(obj).__name__}")
    out: list[tuple[str, Tensor]] = []
    for i, item in enumerate(obj):
        if (not isinstance(item, (list, tuple)) or len(item) != 2 or not isinstance(item[0], str)
                or not isinstance(item[1], Tensor)):
            raise ValueError(f"serialized tensors: entry {i} is not a (name, tensor) pair")
        out.append((item[0], item[1]))
    return out


# ----------------------------------------------------------------- update process group


@contextlib.contextmanager
def _default_group_unbound() -> Iterator[None]:
    """Hide the default group's bound device while creating the update group.

    ``_new_process_group_helper`` creates an NCCL communicator by *splitting* the default group's
    when that group is bound to a device (``init_process_group(device_id=...)``). The update group's
    other members (SGLang workers) are not in the trainer's world, so a split would hang.
    """
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_group

    group = _get_default_group() if dist.is_initialized() else None
    bound = getattr(group, "bound_device_id", None)
    if bound is None:
        yield
        return
    group.bound_device_id = None
    try:
        yield
    finally:
        group.bound_device_id = bound


def _tcp_url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"tcp://{host}:{int(port)}"


def open_update_group(
    *,
    backend: str,
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    timeout_s: float = 600,
) -> "ProcessGroup":
    """Join a weight-update process group outside the default ``torch.distributed`` world.

    Built the way SGLang builds its side (``init_custom_process_group`` in
    ``sglang/srt/utils``, called by the model runner's ``init_weights_update_group``), so that
    both sides meet on the same store keys: a ``tcp://master_address:master_port`` rendezvous
    whose TCP store is hosted by rank 0, a ``PrefixStore(group_name, store)``, then torch's
    ``_new_process_group_helper`` with no global ranks (a group of its own, not a subgroup of
    the default world), registered with identity rank mapping so that ``broadcast(src=0)``
    means group rank 0. Blocks until all ``world_size`` members have joined (or ``timeout_s``).
    Works whether or not this process has a default group. ``group_name`` must be unique in the
    process until ``close_update_group``.
    """
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside a group of {world_size}")
    if group_name in _world.pg_names.values():
        raise ValueError(f"a process group named {group_name!r} already exists in this process; "
                         f"close it first (close_update_group)")
    timeout = timedelta(seconds=float(timeout_s))
    store, rank, world_size = next(
        rendezvous(_tcp_url(master_address, master_port), rank, world_size, timeout=timeout)
    )
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    # torch renamed pg_options to backend_options (2.6); pass whichever this torch has.
    params = inspect.signature(_new_process_group_helper).parameters
    options_kw = "backend_options" if "backend_options" in params else "pg_options"
    with _default_group_unbound():
        group, _ = _new_process_group_helper(
            world_size, rank, [], Backend(backend), store,
            group_name=group_name, timeout=timeout, **{options_kw: None},
        )
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def close_update_group(group: Optional["ProcessGroup"]) -> None:
    """Destroy a group from ``open_update_group`` (local; the default world is untouched).
    The name can be reused afterwards. ``None`` is a no-op."""
    if group is None:
        return
    import torch.distributed as dist

    dist.destroy_process_group(group)


# ----------------------------------------------------------------- broadcast sender


class WeightSyncBroken(RuntimeError):
    """A transfer failed half-way: the servers and the group may be out of step. ``close()`` and
    connect a new sender (with another group name or port) before the next update."""


class BroadcastWeightSender:
    """Streams weights from the trainer's global rank 0 to disaggregated SGLang servers by
    broadcast over a dedicated process group (NCCL on GPU, gloo on CPU).

    Group layout: rank 0 is this process; server ``i``'s TP workers are ranks
    ``1 + sum(server_tp_sizes[:i])`` onwards (``rank_offset``); world size is
    ``1 + sum(server_tp_sizes)``. Usable as ``SGLangEngine(weight_updater=sender)``.

    Memory: ``send`` packs tensors into buckets of at most ``max_bucket_bytes`` on ``device`` and
    looks one bucket ahead (to mark the last one), so it holds at most two buckets at a time.

    ``master_address`` must be reachable from every server (it hosts the group's TCP store on
    ``master_port``). ``device``: where buckets live and broadcasts run (default: the current
    CUDA device for NCCL, the CPU otherwise). ``timeout_s`` bounds the group's join and each
    collective. ``failure_grace_s``: after a server has answered with an error, how long to let
    the broadcast finish before declaring the group out of step (``WeightSyncBroken``).

    The HTTP calls go through the engine (``post_to``/``post_all``, a ``ServerGroup``), one payload
    per server.
    """

    def __init__(
        self,
        engine: ServerGroup,
        *,
        server_tp_sizes: Sequence[int],
        master_address: str,
        master_port: int,
        backend: str = "nccl",
        group_name: str = DEFAULT_GROUP_NAME,
        max_bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float = 600.0,
        device: Union[str, torch.device, None] = None,
        failure_grace_s: float = 10.0,
    ) -> None:
        tp_sizes = [int(t) for t in server_tp_sizes]
        if len(tp_sizes) != len(engine.servers):
            raise ValueError(f"{len(tp_sizes)} TP sizes for {len(engine.servers)} servers")
        if any(t < 1 for t in tp_sizes):
            raise ValueError(f"TP sizes must be >= 1, got {tp_sizes}")
        if max_bucket_bytes < 1:
            raise ValueError(f"max_bucket_bytes must be >= 1, got {max_bucket_bytes}")
        self.engine = engine
        self.server_tp_sizes = tp_sizes
        self.rank_offsets = [1 + sum(tp_sizes[:i]) for i in range(len(tp_sizes))]
        self.world_size = 1 + sum(tp_sizes)
        self.master_address = master_address
        self.master_port = int(master_port)
        self.backend = backend
        self.group_name = group_name
        self.max_bucket_bytes = int(max_bucket_bytes)
        self.timeout_s = float(timeout_s)
        self.failure_grace_s = float(failure_grace_s)
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else "cpu"
        self.device = torch.device(device)
        self._group: Optional[ProcessGroup] = None
        self._broken: Optional[str] = None
        self._stuck: Optional[asyncio.Future] = None  # a collective still blocked in its thread

    @property
    def connected(self) -> bool:
        return self._group is not None

    async def connect(self) -> None:
        """Ask every server to join the group (``/init_weights_update_group``) while this process
        joins as rank 0 in a worker thread (the join blocks until everyone has arrived)."""
        if self._broken:
            raise WeightSyncBroken(self._broken)
        if self._group is not None:
            return
        payloads = [
            control.init_weights_update_group_payload(
                self.master_address, self.master_port, offset, self.world_size,
                group_name=self.group_name, backend=self.backend,
            )
            for offset in self.rank_offsets
        ]

        def join() -> "ProcessGroup":
            with self._on_device():
                return open_update_group(
                    backend=self.backend, master_address=self.master_address,
                    master_port=self.master_port, rank=0, world_size=self.world_size,
                    group_name=self.group_name, timeout_s=self.timeout_s,
                )

        self._group = await self._together(
            join, self.engine.post_to(range(len(payloads)), "init_weights_update_group", lambda i: payloads[i])
        )

    async def send(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Stream ``(hf_name, tensor)`` pairs to every server and set their weight version.

        Per bucket: ``/update_weights_from_distributed`` (names, dtypes, shapes) to every server
        and, concurrently, one broadcast per tensor in the same order. ``flush_cache`` and
        ``weight_version`` go with the last bucket only, so a server never reports the new
        version while it holds a mix. Raises ``SGLangServerError`` when a server answers
        ``success: false`` after the transfer (the group stays usable), and ``WeightSyncBroken``
        when the transfer itself failed half-way. Packing (which advances ``named_tensors``) runs
        in a worker thread, under ``no_grad`` and on ``device``, so the event loop stays free.
        """
        if self._broken:
            raise WeightSyncBroken(self._broken)
        if self._group is None:
            await self.connect()
        # SGLang (0.5.23) loads weights only inside a begin/end session
        try:
            await self.engine.post_all("begin_weight_update", control.begin_weight_update_payload())
        except ConnectionError as exc:  # a member of the group is gone: the group is unusable
            self._broken = (f"weight-update group {self.group_name!r}: a server failed before a transfer: "
                            f"{exc}; close() this sender and connect a new one")
            raise WeightSyncBroken(self._broken) from exc
        try:
            await self._send_buckets(named_tensors, version)
        except BaseException:
            with contextlib.suppress(Exception):  # the transfer's error is the one to report
                await self.engine.post_all("end_weight_update", control.end_weight_update_payload())
            raise
        await self.engine.post_all("end_weight_update", control.end_weight_update_payload())
        self.engine.set_weight_version(version)

    async def _send_buckets(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        buckets = pack_buckets(named_tensors, self.max_bucket_bytes, device=self.device)
        current = await asyncio.to_thread(self._next_bucket, buckets)
        while current is not None:
            following = await asyncio.to_thread(self._next_bucket, buckets)
            last = following is None
            views = unpack_bucket(current)
            payload = control.update_weights_from_distributed_payload(
                [m.name for m in current.tensors],
                [m.dtype for m in current.tensors],
                [m.shape for m in current.tensors],
                group_name=self.group_name,
                flush_cache=last,
                weight_version=version if last else None,
            )
            await self._together(
                lambda: self._broadcast(views),
                self.engine.post_all("update_weights_from_distributed", payload),
            )
            del views
            current = following

    async def __call__(self, engine: ServerGroup, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """The ``SGLangEngine`` ``weight_updater`` hook."""
        if engine is not self.engine:
            raise ValueError("this BroadcastWeightSender belongs to another SGLangEngine")
        await self.send(named_tensors, version)

    async def close(self) -> None:
        """Ask the servers to leave the group (best effort) and destroy ours. Idempotent."""
        group, self._group = self._group, None
        if group is None:
            return
        results = await asyncio.gather(
            *(self._destroy_remote(i) for i in range(len(self.engine.servers))),
            return_exceptions=True,
        )
        for server, result in zip(self.engine.servers, results):
            if isinstance(result, BaseException):
                log.warning("%s/destroy_weights_update_group failed (ignored): %s", server.url, result)
        if self._stuck is not None and not self._stuck.done():
            # Destroying a group under a thread still blocked in one of its collectives can crash
            # the process; leave it to the backend's timeout.
            log.warning("weight-update group %r left open: a collective is still blocked", self.group_name)
            return
        close_update_group(group)

    # ---------------------------------------------------------------- internals

    def _on_device(self) -> contextlib.AbstractContextManager:
        """CUDA's current device is per thread: make the worker thread use ours."""
        if self.device.type == "cuda":
            return torch.cuda.device(self.device)
        return contextlib.nullcontext()

    def _next_bucket(self, buckets: Iterator[Any]) -> Any:
        with self._on_device(), torch.no_grad():
            return next(buckets, None)

    def _broadcast(self, tensors: list[tuple[str, Tensor]]) -> None:
        import torch.distributed as dist

        with self._on_device():
            for _name, tensor in tensors:
                dist.broadcast(tensor, src=0, group=self._group)
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()

    async def _together(self, collective: Callable[[], T], requests: Awaitable[Any]) -> T:
        """Run a blocking collective in a worker thread and the HTTP calls that make the servers
        take part in it, concurrently; both must finish. Server errors are raised first (they say
        why); a failure that leaves the collective running or half-done breaks the sender."""
        work = asyncio.ensure_future(asyncio.to_thread(collective))
        calls = asyncio.ensure_future(requests)
        try:
            await asyncio.wait({work, calls}, return_when=asyncio.FIRST_EXCEPTION)
        except BaseException:  # cancelled
            calls.cancel()
            self._mark_broken("cancelled during a transfer", work)
            raise
        if calls.done() and calls.exception() is not None:
            # A server that refused after receiving everything (the usual success=false) has let
            # the collective finish, or it is about to: give it a moment before giving up on it.
            if not work.done():
                await asyncio.wait({work}, timeout=self.failure_grace_s)
            if not work.done() or work.exception() is not None:
                self._mark_broken(f"a server failed during a transfer: {calls.exception()}", work)
                raise WeightSyncBroken(self._broken) from calls.exception()
            raise calls.exception()
        if work.exception() is not None:
            calls.cancel()
            self._mark_broken(f"the collective failed: {work.exception()!r}", work)
            raise WeightSyncBroken(self._broken) from work.exception()
        await calls  # the collective is done; the servers answer once they have loaded
        return work.result()

    def _mark_broken(self, why: str, work: asyncio.Future) -> None:
        self._broken = (f"weight-update group {self.group_name!r}: {why}; the servers and the group "
                        f"may be out of step: close() this sender and connect a new one")
        if not work.done():
            self._stuck = work
            work.add_done_callback(lambda f: f.cancelled() or f.exception())  # no "never retrieved"

    async def _destroy_remote(self, index: int) -> Any:
        return await self.engine.post_to([index], "destroy_weights_update_group",
                                         control.destroy_weights_update_group_payload(self.group_name))


# ----------------------------------------------------------------- CUDA-IPC update (colocated)


@dataclass(frozen=True)
class Collectives:
    """The blocking collectives run together by the processes that feed one IPC update (each call
    runs in a worker thread bound to the bucket device). They carry only handles and reasons, and
    ranks >= 1 wait in them while rank 0 posts to the servers, so in training they are the control
    group's (``collectives``: gloo on the host, never an NCCL wait on a GPU a server is using).
    ``LOCAL``: one process feeds everything."""

    gather_to_0: Callable[[Any], Optional[list[Any]]]  # every rank's value in rank order on rank 0
    barrier: Callable[[], None]
    broadcast_from_0: Callable[[Any], Any]


LOCAL = Collectives(gather_to_0=lambda value: [value], barrier=lambda: None, broadcast_from_0=lambda value: value)


@dataclass(frozen=True)
class IpcFeed:
    """Who serializes the entry of each tensor-parallel worker: ``feeders[server][t]`` is the rank
    that feeds worker ``t`` of server ``server`` (colocated training: the rank on that worker's GPU;
    one process feeding every worker: rank 0 everywhere). Each (server, worker) pair gets a
    serialization of its own: torch's CUDA-IPC reference counting expects one receiver per share."""

    feeders: Mapping[int, tuple[int, ...]]

    @classmethod
    def one_process(cls, tp_sizes: Mapping[int, int]) -> "IpcFeed":
        return cls({index: (0,) * int(tp) for index, tp in tp_sizes.items()})

    @property
    def servers(self) -> list[int]:
        return sorted(self.feeders)

    def slots(self, rank: int) -> list[tuple[int, int]]:
        """The (server, worker) pairs ``rank`` serializes an entry for."""
        return [(index, t) for index in self.servers for t, r in enumerate(self.feeders[index]) if r == rank]


class WeightSyncFailed(RuntimeError):
    """The IPC update failed on rank 0 (raised on the other ranks with rank 0's reason)."""


def _thread_device(device: Optional[Union[str, torch.device]]) -> torch.device:
    """The device the worker threads bind to (a CUDA device without an index: the current one)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


async def _attempt(call: Awaitable[Any]) -> Optional[BaseException]:
    try:
        await call
    except Exception as exc:  # noqa: BLE001 - reported after every rank has finished the transfer
        return exc
    return None


async def update_weights_by_ipc(engine: Optional[ServerGroup], named: Iterable[tuple[str, Tensor]], version: int,
                                *, feed: IpcFeed, rank: int = 0, max_bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                                device: Optional[Union[str, torch.device]] = None,
                                collectives: Collectives = LOCAL) -> int:
    """The colocated weight update, the one path every caller takes (``SGLangDeployment`` in
    training, ``spade engine check``, the weight-sync benchmark, the GPU tests,
    ``IpcWeightUpdater``). Called by every feeding process (``engine`` on rank 0 only,
    ``named`` the whole model on every rank).

    Per size-bounded bucket on ``device``: each rank serializes the bucket once per worker slot it
    feeds (``feed.slots(rank)``), rank 0 gathers the entries and posts each server its
    ``/update_weights_from_tensor`` (entry ``t`` from worker ``t``'s feeder), then every rank waits
    at a barrier, so the buffers stay alive until the servers have loaded them. All of it inside a
    ``/begin_weight_update`` .. ``/end_weight_update`` session on ``feed.servers``, then a cache
    flush and the engine's new weight version. ``version`` travels with rank 0's last bucket only:
    a server reports the version of its latest update as soon as it has loaded it, so earlier it
    would name the new version while holding half-old weights. A server's refusal does not stop
    the other ranks half-way: they finish the buckets, rank 0 raises the error and the others
    ``WeightSyncFailed``.
    Returns the number of buckets."""
    main = rank == 0
    if main and engine is None:
        raise ValueError("rank 0 needs the engine")
    servers = feed.servers
    mine = feed.slots(rank)
    bound = _thread_device(device)
    source = WatchedStream(named)
    buckets = pack_buckets(source, max_bucket_bytes, device=device)

    def next_entries() -> Optional[tuple[Any, dict[tuple[int, int], str], bool]]:
        bucket = next(buckets, None)
        if bucket is None:
            return None
        tensors = unpack_bucket(bucket)
        return bucket, {slot: serialize_named_tensors(tensors) for slot in mine}, source.spent

    error: Optional[BaseException] = None
    if main and servers:
        error = await _attempt(engine.post_to(servers, "begin_weight_update", control.begin_weight_update_payload()))
    count, cuda = 0, False
    while True:
        step = await in_thread(bound, next_entries)
        if step is None:
            break
        bucket, entries, last = step
        cuda |= bucket.buffer.is_cuda
        gathered = await in_thread(bound, collectives.gather_to_0, entries)
        if main and servers and error is None:
            error = await _attempt(engine.post_to(servers, "update_weights_from_tensor", lambda index: (
                control.update_weights_from_tensor_payload(
                    [gathered[r][(index, t)] for t, r in enumerate(feed.feeders[index])],
                    flush_cache=False, weight_version=version if last else None))))
        await in_thread(bound, collectives.barrier)
        del bucket, entries, gathered, step
        count += 1
    if main and servers:
        ended = await _attempt(engine.post_to(servers, "end_weight_update", control.end_weight_update_payload()))
        error = error or ended
        if error is None:
            error = await _attempt(engine.post_to(servers, "flush_cache", None))
    if cuda:
        torch.cuda.ipc_collect()  # give back the shared bucket blocks the servers have let go of
    reason = await in_thread(bound, collectives.broadcast_from_0,
                             None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    if reason is not None:
        raise WeightSyncFailed(f"the weight update failed on rank 0: {reason}")
    if main:
        engine.set_weight_version(version)
    return count


async def push_weights_by_ipc(engine: ServerGroup, named: Iterable[tuple[str, Tensor]], version: int, *,
                              tp: Union[int, Sequence[int], None] = None,
                              max_bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                              device: Optional[Union[str, torch.device]] = None) -> int:
    """``update_weights_by_ipc`` from this one process to every server of ``engine`` (each of their
    TP workers gets an entry of its own). ``tp``: the servers' TP size, one for all or one per
    server; None asks each server (``/get_server_info``). Returns the number of buckets."""
    if tp is None:
        sizes = [control.server_info_tp_size(info) for info in await engine.post_all("get_server_info", None)]
    elif isinstance(tp, int):
        sizes = [tp] * len(engine.servers)
    else:
        sizes = [int(t) for t in tp]
    if len(sizes) != len(engine.servers) or any(t < 1 for t in sizes):
        raise ValueError(f"TP sizes {sizes} for {len(engine.servers)} servers")
    return await update_weights_by_ipc(engine, named, version, feed=IpcFeed.one_process(dict(enumerate(sizes))),
                                       max_bucket_bytes=max_bucket_bytes, device=device)


@dataclass(frozen=True)
class IpcWeightUpdater:
    """``SGLangEngine(weight_updater=IpcWeightUpdater(...))``: the engine's ``update_weights`` runs
    ``push_weights_by_ipc`` from this one process (colocated servers; ``tp`` None asks each server)."""

    tp: Union[int, Sequence[int], None] = None
    max_bucket_bytes: int = DEFAULT_BUCKET_BYTES
    device: Optional[Union[str, torch.device]] = None

    async def __call__(self, engine: ServerGroup, named: Iterable[tuple[str, Tensor]], version: int) -> None:
        await push_weights_by_ipc(engine, named, version, tp=self.tp, max_bucket_bytes=self.max_bucket_bytes,
                                  device=self.device)
