"""Size-bounded buckets of named tensors, for live weight sync to a rollout engine.

The trainer streams ``(hf_name, full tensor)`` pairs (``spade.models.loading.hf_weights``) and the
rollout engine wants them in a few large transfers, not thousands of small ones. ``pack_buckets``
turns the stream into ``Bucket``\\ s: one flat contiguous ``uint8`` buffer each, plus per-tensor
metadata (``TensorMeta``: name, dtype, shape, byte offset, byte count). A bucket travels in two
parts: the buffer by CUDA IPC (colocated SGLang), an NCCL broadcast or an in-process reference, and
the metadata as JSON over HTTP (``Bucket.meta_json`` / ``Bucket.from_meta_json``).
``unpack_bucket`` gives back ``(name, tensor)`` pairs with the exact dtype and shape (views into the
buffer by default, so bit-exact with no copy).

Memory: packing is streaming. Each bucket gets a fresh buffer of ``max_bucket_bytes`` (or the
exact size of an oversize tensor) and tensors are copied into it as they arrive, so at any time the
packer holds one bucket buffer plus the one tensor being added (the input iterator is advanced one
tensor at a time, and only as far as needed to fill the current bucket). The emitted buffer is a
prefix view of that allocation: on CPU untouched pages cost nothing; on CUDA the caching allocator
reserves the full ``max_bucket_bytes``, which is the bound anyway.

Layout: every tensor starts at a multiple of ``ALIGNMENT`` (64) bytes so that reinterpreting the
slice as any dtype (and vectorised copies on the receiving side) is aligned. A bucket's buffer
(padding included) is at most ``max_bucket_bytes``, except that a tensor larger than the bound is
put alone in a bucket of exactly its size. Order of the input is preserved across and within
buckets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional, Union

import torch
from torch import Tensor

ALIGNMENT = 64
META_VERSION = 1

_DTYPE_NAMES = (
    "float64", "float32", "float16", "bfloat16",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "complex64", "complex128",
    "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool",
)
# Only the dtypes this torch build has (float8 variants and wide unsigned ints are version-dependent).
DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name) for name in _DTYPE_NAMES if isinstance(getattr(torch, name, None), torch.dtype)
}
_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the name used in bucket metadata)."""
    try:
        return _NAMES[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} cannot be put in a weight bucket") from None


def dtype_from_name(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; a clear error for names this torch does not know."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype name {name!r} in bucket metadata (known: {sorted(DTYPES)})") from None


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class TensorMeta:
    """Where one tensor lives in a bucket's buffer."""

    name: str
    dtype: str  # a key of DTYPES, e.g. "bfloat16"
    shape: tuple[int, ...]
    offset: int  # byte offset into the buffer, a multiple of ALIGNMENT
    nbytes: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        dtype = dtype_from_name(self.dtype)
        numel = 1
        for s in self.shape:
            if s < 0:
                raise ValueError(f"{self.name}: negative dimension in shape {self.shape}")
            numel *= s
        expected = numel * torch.empty((), dtype=dtype).element_size()
        if self.nbytes != expected:
            raise ValueError(f"{self.name}: nbytes {self.nbytes} != {expected} for {self.dtype}{list(self.shape)}")
        if self.offset < 0 or self.offset % ALIGNMENT:
            raise ValueError(f"{self.name}: offset {self.offset} is not a non-negative multiple of {ALIGNMENT}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                "offset": self.offset, "nbytes": self.nbytes}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TensorMeta":
        return cls(name=str(d["name"]), dtype=str(d["dtype"]), shape=tuple(d["shape"]),
                   offset=int(d["offset"]), nbytes=int(d["nbytes"]))


@dataclass(frozen=True)
class Bucket:
    """A flat contiguous 1-D ``uint8`` buffer and the tensors laid out in it, in input order."""

    buffer: Tensor
    tensors: tuple[TensorMeta, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensors", tuple(self.tensors))
        if self.buffer.dtype != torch.uint8 or self.buffer.dim() != 1 or not self.buffer.is_contiguous():
            raise ValueError("a bucket buffer must be a contiguous 1-D uint8 tensor")
        for meta in self.tensors:
            if meta.offset + meta.nbytes > self.buffer.numel():
                raise ValueError(f"{meta.name}: bytes [{meta.offset}, {meta.offset + meta.nbytes}) "
                                 f"outside the {self.buffer.numel()}-byte buffer")

    @property
    def nbytes(self) -> int:
        return int(self.buffer.numel())

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.tensors]

    def meta(self) -> dict[str, Any]:
        """JSON-serialisable metadata (everything but the buffer's bytes)."""
        return {"version": META_VERSION, "nbytes": self.nbytes, "alignment": ALIGNMENT,
                "tensors": [m.to_dict() for m in self.tensors]}

    def meta_json(self) -> str:
        return json.dumps(self.meta(), separators=(",", ":"))

    @classmethod
    def from_meta_json(cls, buffer: Tensor, meta: Union[str, bytes, dict[str, Any]]) -> "Bucket":
        """Rebuild a bucket on the receiving side from its buffer and ``meta_json()``."""
        if not isinstance(meta, dict):
            meta = json.loads(meta)
        if meta.get("version") != META_VERSION:
            raise ValueError(f"bucket metadata version {meta.get('version')!r}, expected {META_VERSION}")
        if int(meta["nbytes"]) != buffer.numel():
            raise ValueError(f"buffer has {buffer.numel()} bytes, metadata says {meta['nbytes']}")
        return cls(buffer=buffer, tensors=tuple(TensorMeta.from_dict(t) for t in meta["tensors"]))


def _as_bytes(tensor: Tensor) -> Tensor:
    """The tensor's bytes as a flat uint8 tensor (same device)."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype == torch.uint8:
        return flat
    if flat.dtype == torch.bool:
        return flat.view(torch.uint8)
    if flat.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=flat.device)
    return flat.view(torch.uint8)


class _Builder:
    def __init__(self, capacity: int, device: torch.device):
        self.buffer = torch.empty(capacity, dtype=torch.uint8, device=device)
        self.metas: list[TensorMeta] = []
        self.used = 0

    def fits(self, nbytes: int) -> bool:
        return align_up(self.used) + nbytes <= self.buffer.numel()

    def add(self, name: str, tensor: Tensor) -> None:
        offset = align_up(self.used)
        data = _as_bytes(tensor)
        nbytes = data.numel()
        if nbytes:
            self.buffer[offset:offset + nbytes].copy_(data, non_blocking=False)
        self.metas.append(TensorMeta(name, dtype_name(tensor.dtype), tuple(tensor.shape), offset, nbytes))
        self.used = offset + nbytes

    def finish(self) -> Bucket:
        return Bucket(buffer=self.buffer[:self.used], tensors=tuple(self.metas))


def pack_buckets(
    named_tensors: Iterable[tuple[str, Tensor]],
    max_bucket_bytes: int,
    *,
    device: Optional[Union[str, torch.device]] = None,
) -> Iterator[Bucket]:
    """Stream ``(name, tensor)`` pairs into buckets of at most ``max_bucket_bytes`` bytes.

    Lazy: the input is advanced one tensor at a time, only when the current bucket can still take
    more, and a bucket is yielded as soon as the next tensor does not fit. A tensor larger than
    ``max_bucket_bytes`` is yielded alone in a bucket of exactly its size. Buffers live on
    ``device`` (default: the device of the bucket's first tensor; a tensor on another device closes
    the current bucket). Names must be unique.
    """
    if max_bucket_bytes < 1:
        raise ValueError(f"max_bucket_bytes must be >= 1, got {max_bucket_bytes}")
    fixed_device = torch.device(device) if device is not None else None
    seen: set[str] = set()
    builder: Optional[_Builder] = None
    for name, tensor in named_tensors:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name}: expected a tensor, got {type(tensor).__name__}")
        if name in seen:
            raise ValueError(f"duplicate tensor name {name!r}")
        seen.add(name)
        dtype_name(tensor.dtype)  # fail early on unsupported dtypes
        target = fixed_device or tensor.device
        nbytes = tensor.numel() * tensor.element_size()
        if builder is not None and (builder.buffer.device != target or not builder.fits(nbytes)):
            yield builder.finish()
            builder = None
        if builder is None:
            builder = _Builder(max(max_bucket_bytes, nbytes), target)
        builder.add(name, tensor)
        del tensor
    if builder is not None and builder.metas:
        yield builder.finish()


def unpack_bucket(bucket: Bucket, *, copy: bool = False) -> list[tuple[str, Tensor]]:
    """``(name, tensor)`` pairs in packing order, with the exact dtype and shape.

    Tensors are views into ``bucket.buffer`` (zero-copy; they alias it) unless ``copy=True``.
    """
    out: list[tuple[str, Tensor]] = []
    buffer = bucket.buffer
    for meta in bucket.tensors:
        dtype = dtype_from_name(meta.dtype)
        raw = buffer[meta.offset:meta.offset + meta.nbytes]
        if meta.nbytes == 0:
            tensor = torch.empty(meta.shape, dtype=dtype, device=buffer.device)
        else:
            tensor = (raw if dtype == torch.uint8 else raw.view(dtype)).view(meta.shape)
            if copy:
                tensor = tensor.clone()
        out.append((meta.name, tensor))
    return out


class WatchedStream:
    """Iterates a weight stream and records when it has run out. ``pack_buckets`` reads one tensor
    past a full bucket before handing it out, so the stream is spent exactly when the last bucket
    comes: a sender can tell the last bucket without holding a second one."""

    def __init__(self, source: Iterable[tuple[str, Tensor]]) -> None:
        self._source = iter(source)
        self.spent = False

    def __iter__(self) -> "WatchedStream":
        return self

    def __next__(self) -> tuple[str, Tensor]:
        try:
            return next(self._source)
        except StopIteration:
            self.spent = True
            raise
