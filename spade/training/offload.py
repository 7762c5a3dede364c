"""Move the trainer's GPU memory to host while the colocated rollout engine generates, and back.

The trainer and the SGLang servers share the GPUs. While the engine generates, everything the
trainer keeps on the device between steps is dead weight: the parameters, the gradient buffers,
the optimizer's fp32 main parameters and its Adam moments. ``TrainingOffloader.offload()`` copies
all of it to host memory and frees the device memory; ``onload()`` allocates it again and copies
it back, bit for bit, before the next train step.

How: by storage, not by tensor. Megatron's DDP keeps the gradients (and, with the distributed
optimizer, the parameters) in one contiguous buffer per dtype; every ``param.main_grad`` and
``param.data`` is a view into it, as are the bucket views, the distributed optimizer's shard
views and, for fp32 parameters, the optimizer's "main" parameters and their ``.grad``. Replacing
tensors (``p.data = p.data.cpu()``) would cut those aliases. So the offloader collects every
tensor it covers, groups them by their ``untyped_storage()``, copies each storage once into host
memory (pinned blocks, see ``HOST_BLOCK_BYTES``), then shrinks the storage to 0 bytes
(``resize_(0)``). All the tensor objects
stay as they were (same shapes, strides, offsets, aliasing); ``onload()`` grows each storage back
to its size (``resize_(n)``) and copies its bytes in, after which every view reads the same
values at a new address. Nothing may read or write the covered tensors while they are offloaded.

What Megatron-core 0.16.1 offers, and why it is not used:

* ``_ParamAndGradBuffer.offload_to_cpu``/``reload_from_cpu`` and
  ``DistributedDataParallel.offload_grad_buffers``/``restore_grad_buffers`` free the grad buffer
  without copying it (it comes back zeroed) and move the param buffer only where one exists,
  which is with the distributed optimizer: without it the parameters keep their own storage and
  nothing covers them. They use the deprecated ``TypedStorage`` API, pin with ``.pin_memory()``
  (fails without CUDA) and always call ``torch.cuda`` functions.
* ``MegatronOptimizer.offload_to_cpu``/``restore_from_cpu`` replace ``p.data`` and the state
  tensors with new CPU/CUDA tensors: synchronous copies into fresh unpinned memory on every call,
  CUDA tensors only (a no-op on CPU). With fp32 parameters under the distributed optimizer, the
  optimizer's parameters are views into the DDP param buffer: together with the buffer offload
  their bytes move twice, and the restore turns them into separate copies, so from then on the
  device holds those weights twice.

Not covered: module buffers that are not parameters (none of consequence in a GPTModel), the
loss scaler's and ``found_inf`` scalars, Megatron's global scratch buffer, and FP8 parameters
(Transformer Engine tensor subclasses whose data is not in their own storage). Storages that
do not live on the training device (torch Adam's CPU ``step`` tensors on a GPU run) are left
alone.

On the CPU the host and the device are the same memory, so by default offloading there is a
no-op that still reports what it would move (``moved_bytes == 0``). ``move_on_host=True`` makes it
run the real copy / free / restore path on CPU tensors (without pinning, synchronising or
emptying a cache): the tests use it to check the logic that runs on the GPU.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Literal, Mapping, Optional, Sequence

import torch
from torch import Tensor

KINDS: tuple[str, ...] = ("params", "grads", "main_params", "optimizer_state")
"""What a storage holds, by the first kind it was seen under: model parameters (the DDP param
buffer or each parameter's own storage), gradients (DDP grad buffers, ``main_grad``, ``.grad``),
the optimizer's own parameters (fp32 main params; views of the params for fp32 models, counted
there), and optimizer state (Adam moments, and anything else tensor-valued in its state)."""

_HOST_ALIGNMENT = 512  # bytes; each storage's host copy starts at a multiple of this
HOST_BLOCK_BYTES = 256 * 2**20
"""Host memory is taken in blocks of this size. torch's pinned-memory allocator rounds every
request up to a power of two (an 11 GiB buffer would pin 16 GiB), so the blocks are a power of two
themselves and the waste stays under one block; 256 MiB copies still run at full bandwidth."""


@dataclass(frozen=True)
class OffloadReport:
    """What one ``offload()`` or ``onload()`` call covered and moved, for metrics.

    ``bytes_by_kind`` counts the device storages covered (each once), whether or not they were
    moved; ``moved_bytes`` is what was actually copied: 0 on a CPU no-op or a repeated call.
    """

    direction: Literal["offload", "onload"]
    bytes_by_kind: Mapping[str, int] = field(default_factory=dict)
    moved_bytes: int = 0
    storages: int = 0
    seconds: float = 0.0

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_kind.values())

    def metrics(self, prefix: str = "offload/") -> dict[str, float]:
        """Flat float metrics, e.g. ``offload/offload_gb``, ``offload/offload_s``."""
        name = f"{prefix}{self.direction}"
        out = {f"{name}_gb": self.moved_bytes / 2**30, f"{name}_s": self.seconds}
        out.update({f"{prefix}{kind}_gb": count / 2**30 for kind, count in self.bytes_by_kind.items()})
        return out


@dataclass
class _Slot:
    """One device storage while it is offloaded: where its bytes are kept on the host."""

    storage: torch.UntypedStorage
    nbytes: int
    kind: str
    host_offset: int


class _HostArena:
    """Host memory for offloaded bytes: equal blocks (pinned for a CUDA device), addressed as one
    flat range. It only grows, so blocks pinned once are reused by every later offload."""

    def __init__(self, block_bytes: int, pinned: bool) -> None:
        self.block_bytes = block_bytes
        self.pinned = pinned
        self.blocks: list[Tensor] = []

    @property
    def nbytes(self) -> int:
        return len(self.blocks) * self.block_bytes

    def reserve(self, nbytes: int) -> None:
        while self.nbytes < nbytes:
            self.blocks.append(torch.empty(self.block_bytes, dtype=torch.uint8, device="cpu",
                                           pin_memory=self.pinned))

    def pieces(self, offset: int, nbytes: int) -> Iterator[tuple[Tensor, int, int]]:
        """``(host view, start, end)`` covering ``[offset, offset + nbytes)`` of the flat range;
        ``start:end`` is the matching byte range of the storage stored there."""
        done = 0
        while done < nbytes:
            block, within = divmod(offset + done, self.block_bytes)
            length = min(nbytes - done, self.block_bytes - within)
            yield self.blocks[block][within: within + length], done, done + length
            done += length


def _byte_view(storage: torch.UntypedStorage) -> Tensor:
    """A flat uint8 tensor over all of ``storage`` (sharing it, not copying)."""
    empty = torch.empty(0, dtype=torch.uint8, device=storage.device)
    return empty.set_(storage, 0, (storage.nbytes(),), (1,))


def _torch_optimizers(optimizer) -> list:
    """The torch optimizers inside a Megatron optimizer (chained or not), or a torch optimizer."""
    if optimizer is None:
        return []
    inners = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    found = []
    for inner in inners:
        if getattr(inner, "is_stub_optimizer", False):
            continue
        torch_optimizer = getattr(inner, "optimizer", None)
        if torch_optimizer is None and hasattr(inner, "param_groups") and hasattr(inner, "state"):
            torch_optimizer = inner  # already a torch optimizer
        if torch_optimizer is not None:
            found.append(torch_optimizer)
    return found


def _ddp_buffers(chunk: torch.nn.Module) -> list:
    """Megatron DDP's ``_ParamAndGradBuffer``s of a chunk (none for a plain module).

    Read from the instance dict: DDP's ``buffers`` list attribute shadows ``Module.buffers()``."""
    found = []
    for name in ("buffers", "expert_parallel_buffers"):
        value = vars(chunk).get(name)
        if isinstance(value, (list, tuple)):
            found.extend(value)
    return found


def _first_device(chunks: Sequence[torch.nn.Module], optimizer) -> torch.device:
    for chunk in chunks:
        for param in chunk.parameters():
            return param.device
    for torch_optimizer in _torch_optimizers(optimizer):
        for group in torch_optimizer.param_groups:
            for param in group["params"]:
                return param.device
    return torch.device("cpu")


class TrainingOffloader:
    """Offload / onload the training state of some model chunks and their optimizer.

    ``chunks``: the DDP-wrapped chunks (``TrainModel.chunks``); plain modules work too (their
    parameters and ``main_grad``/``.grad`` are covered). ``optimizer``: the Megatron optimizer
    from ``build_optimizer`` (chained or not), a torch optimizer, or None (e.g. a frozen
    reference model). The tensors are collected at every ``offload()``, so optimizer state created
    by a later first step, or replaced by a checkpoint load, is covered.

    ``kinds``: which of ``KINDS`` this offloader moves. A storage's kind is decided over all
    kinds (the first one it is seen under), so two offloaders with disjoint ``kinds`` never
    move the same storage: the trainer sends gradients and optimizer state to host first and the
    parameters only after they have been streamed to the rollout engine.
    ``move_on_host``: on a CPU device, run the real copy / free / restore path anyway (tests).
    ``keep_host_buffer``: keep the (pinned) host memory between cycles; pinning gigabytes costs
    seconds, so by default it is taken once and reused. ``host_block_bytes``: see
    ``HOST_BLOCK_BYTES`` (tests make it small so that storages span several blocks).
    """

    def __init__(
        self,
        chunks: Sequence[torch.nn.Module],
        optimizer=None,
        *,
        kinds: Sequence[str] = KINDS,
        move_on_host: bool = False,
        keep_host_buffer: bool = True,
        host_block_bytes: int = HOST_BLOCK_BYTES,
    ) -> None:
        if host_block_bytes <= 0 or host_block_bytes % _HOST_ALIGNMENT:
            raise ValueError(f"host_block_bytes must be a positive multiple of {_HOST_ALIGNMENT}, "
                             f"got {host_block_bytes}")
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown or not kinds:
            raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {list(kinds)}")
        self.kinds = tuple(kinds)
        self.chunks = list(chunks)
        self.optimizer = optimizer
        self.device = _first_device(self.chunks, optimizer)
        self.move_on_host = move_on_host
        self.keep_host_buffer = keep_host_buffer
        self._slots: list[_Slot] = []
        self._offloaded = False
        self._covered: dict[str, int] = {}
        self.host_block_bytes = host_block_bytes
        self._host: Optional[_HostArena] = None
        self.last_report: Optional[OffloadReport] = None

    # ------------------------------------------------------------------ state

    @property
    def offloaded(self) -> bool:
        return self._offloaded

    @property
    def moves(self) -> bool:
        """Whether offloading really copies and frees (a GPU, or ``move_on_host``)."""
        return self.device.type != "cpu" or self.move_on_host

    @property
    def host_buffer_bytes(self) -> int:
        """Host memory held for offloading (kept between cycles with ``keep_host_buffer``)."""
        return 0 if self._host is None else self._host.nbytes

    @property
    def host_buffer_pinned(self) -> bool:
        return self._host is not None and all(block.is_pinned() for block in self._host.blocks)

    @property
    def _on_cuda(self) -> bool:
        return self.device.type == "cuda"

    # ------------------------------------------------------------------ what is covered

    def _tensors(self) -> Iterator[tuple[str, Optional[Tensor]]]:
        """Every tensor covered, with its kind; the same storage may come up many times."""
        for chunk in self.chunks:
            for buffer in _ddp_buffers(chunk):
                yield "params", getattr(buffer, "param_data", None)
                yield "grads", getattr(buffer, "grad_data", None)
            for param in chunk.parameters():
                yield "params", param
                yield "grads", getattr(param, "main_grad", None)
                yield "grads", param.grad
        for torch_optimizer in _torch_optimizers(self.optimizer):
            for group in torch_optimizer.param_groups:
                for param in group["params"]:
                    yield "main_params", param
                    yield "grads", param.grad
            for state in torch_optimizer.state.values():
                for value in state.values():
                    if isinstance(value, Tensor):
                        yield "optimizer_state", value

    def _collect(self) -> list[tuple[torch.UntypedStorage, str]]:
        """The distinct allocated storages on the device, each with the first kind seen."""
        seen: dict[int, tuple[torch.UntypedStorage, str]] = {}
        for kind, tensor in self._tensors():
            if tensor is None or tensor.device != self.device:
                continue
            storage = tensor.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in seen:
                continue  # empty, freed by someone else, or already collected
            if not storage.resizable():
                raise RuntimeError(f"a {kind} tensor {tuple(tensor.shape)} has a storage that cannot be "
                                   "resized (allocated outside torch's allocator): it cannot be offloaded")
            seen[storage.data_ptr()] = (storage, kind)
        return [(storage, kind) for storage, kind in seen.values() if kind in self.kinds]

    @staticmethod
    def _count(pairs: Iterable[tuple[int, str]]) -> dict[str, int]:
        counts = dict.fromkeys(KINDS, 0)
        for nbytes, kind in pairs:
            counts[kind] += nbytes
        return counts

    # ------------------------------------------------------------------ host memory

    def _host_arena(self, nbytes: int) -> _HostArena:
        """The host arena, grown to at least ``nbytes`` (pinned for a CUDA device)."""
        if self._host is None:
            self._host = _HostArena(self.host_block_bytes, pinned=self._on_cuda)
        self._host.reserve(nbytes)
        return self._host

    def _synchronize(self) -> None:
        if self._on_cuda:
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------ moving

    def offload(self) -> OffloadReport:
        """Copy everything covered to host memory and free it on the device.

        A no-op returning ``moved_bytes == 0`` when already offloaded, and on the CPU unless
        ``move_on_host``. On CUDA: non-blocking copies into pinned memory, one synchronize, then
        the storages are freed and ``torch.cuda.empty_cache()`` hands the memory back to the
        driver, so the colocated engine can allocate it."""
        started = time.perf_counter()
        if self._offloaded:
            return self._report("offload", 0, len(self._slots), started)
        storages = self._collect()
        self._covered = self._count((storage.nbytes(), kind) for storage, kind in storages)
        if not self.moves:
            self._offloaded = True
            return self._report("offload", 0, len(storages), started)

        slots, offset = [], 0
        for storage, kind in storages:
            nbytes = storage.nbytes()
            slots.append(_Slot(storage, nbytes, kind, offset))
            offset += -(-nbytes // _HOST_ALIGNMENT) * _HOST_ALIGNMENT
        host = self._host_arena(offset)
        for slot in slots:
            device_bytes = _byte_view(slot.storage)
            for host_bytes, start, end in host.pieces(slot.host_offset, slot.nbytes):
                host_bytes.copy_(device_bytes[start:end], non_blocking=True)
        self._synchronize()  # the host copies are complete before the device memory goes
        for slot in slots:
            slot.storage.resize_(0)
        if self._on_cuda:
            torch.cuda.empty_cache()
        self._slots = slots
        self._offloaded = True
        return self._report("offload", sum(slot.nbytes for slot in slots), len(slots), started)

    def onload(self) -> OffloadReport:
        """Reallocate every offloaded storage on the device and copy its bytes back.

        A no-op returning ``moved_bytes == 0`` when not offloaded. Afterwards every covered tensor
        (and every view of it) holds exactly the values it had before ``offload()``. If the device
        runs out of memory half way (the engine still holds it), calling again after freeing
        memory resumes: storages already back are not touched again."""
        started = time.perf_counter()
        if not self._offloaded:
            return self._report("onload", 0, 0, started)
        slots = self._slots
        for slot in slots:
            if slot.storage.nbytes() == slot.nbytes:
                continue  # restored by an earlier, interrupted call
            slot.storage.resize_(slot.nbytes)
            device_bytes = _byte_view(slot.storage)
            for host_bytes, start, end in self._host.pieces(slot.host_offset, slot.nbytes):
                device_bytes[start:end].copy_(host_bytes, non_blocking=True)
        self._synchronize()  # the device copies are complete before anyone reads them
        self._slots = []
        if not self.keep_host_buffer:
            self._host = None
        self._offloaded = False
        return self._report("onload", sum(slot.nbytes for slot in slots), len(slots), started)

    @contextlib.contextmanager
    def released(self) -> Iterator[OffloadReport]:
        """``with offloader.released(): ...``: offloaded inside the block, onloaded after it."""
        report = self.offload()
        try:
            yield report
        finally:
            self.onload()

    def _report(self, direction: Literal["offload", "onload"], moved: int, storages: int,
                started: float) -> OffloadReport:
        report = OffloadReport(direction=direction, bytes_by_kind=dict(self._covered), moved_bytes=moved,
                               storages=storages, seconds=time.perf_counter() - started)
        self.last_report = report
        return report


class StagedOffload:
    """The trainer's two stages around a weight sync (``engine.sglang.offload_training``).

    After the train step the gradients, fp32 main parameters and optimizer state leave first
    (``offload_state``), the parameters stay until they have been streamed to the rollout engine
    and then follow (``offload_params``). A restart during rollouts needs only the parameters back
    (``onload_params``); the train step needs everything (``onload``).
    """

    STATE_KINDS = ("grads", "main_params", "optimizer_state")

    def __init__(self, chunks: Sequence[torch.nn.Module], optimizer=None, **options) -> None:
        self.state = TrainingOffloader(chunks, optimizer, kinds=self.STATE_KINDS, **options)
        self.params = TrainingOffloader(chunks, optimizer, kinds=("params",), **options)

    def offload_state(self) -> OffloadReport:
        return self.state.offload()

    def offload_params(self) -> OffloadReport:
        return self.params.offload()

    def onload_params(self) -> OffloadReport:
        return self.params.onload()

    def onload(self) -> tuple[OffloadReport, OffloadReport]:
        return self.params.onload(), self.state.onload()
