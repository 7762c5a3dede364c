"""The routed experts of a rollout, kept compactly for rollout routing replay (R3).

R3 ("Stabilizing MoE RL by aligning training and inference routers"; Megatron-core 0.16.1's
``moe/router_replay.py``) lets the trainer's MoE routers use the experts the rollout engine chose
instead of their own top-k. The engine reports, for every token it ran the model on, each MoE
layer's top-k expert ids; :class:`RoutedExperts` holds them as one ``[tokens, layers, top_k]``
array of ``uint8`` (at most 256 experts) or ``uint16`` (more), so Qwen3-30B-A3B (48 layers, top-8,
128 experts) costs 48 * 8 = 384 bytes per token.

Alignment: row ``i`` is the routing of ``token_ids[i]`` at position ``i`` (the forward that
predicts ``token_ids[i + 1]``), the same indexing as a trajectory's target-aligned arrays. SGLang
reports positions ``[0, seqlen - 1)`` (every token it fed through the model; the last generated
token never is), which is exactly that. A record may cover only a prefix of a sequence: positions
past ``num_tokens`` route by the trainer's own top-k.

The layer axis counts every decoder layer (SGLang's ``num_hidden_layers``); the trainer maps
layer ``l`` to the router of decoder layer ``l``.

JSON: ``{"shape": [t, l, k], "dtype": "uint8", "data": <base64 of the little-endian bytes>}``,
round-trip exact (the checkpointed delay buffer holds designer trajectories with their records).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch

DTYPES: tuple[str, ...] = ("uint8", "uint16")


def expert_dtype(num_experts: int) -> str:
    """``uint8`` when every expert id fits a byte, else ``uint16``."""
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    if num_experts <= 256:
        return "uint8"
    if num_experts <= 65536:
        return "uint16"
    raise ValueError(f"{num_experts} experts do not fit uint16 ids")


@dataclass(frozen=True, eq=False)
class RoutedExperts:
    """``[num_tokens, num_layers, top_k]`` expert ids (see the module docstring)."""

    array: np.ndarray

    def __post_init__(self) -> None:
        array = np.ascontiguousarray(self.array)
        if array.ndim != 3:
            raise ValueError(f"routed experts must be [tokens, layers, top_k], got shape {array.shape}")
        if array.dtype.name not in DTYPES:
            raise ValueError(f"routed experts must be one of {DTYPES}, got {array.dtype}")
        array = array.astype(array.dtype.newbyteorder("<"), copy=False)
        array.setflags(write=False)
        object.__setattr__(self, "array", array)

    @classmethod
    def from_ids(cls, ids: Any, num_experts: int) -> "RoutedExperts":
        """From any integer array or tensor of ids in ``[0, num_experts)``."""
        values = ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
        if values.size and (values.min() < 0 or values.max() >= num_experts):
            raise ValueError(f"expert ids must be in [0, {num_experts}), got {values.min()}..{values.max()}")
        return cls(values.astype(expert_dtype(num_experts)))

    @classmethod
    def from_bytes(cls, data: bytes, *, source_dtype: str, num_layers: int, top_k: int,
                   num_experts: int) -> "RoutedExperts":
        """From a flat little-endian buffer of ``source_dtype`` ids (SGLang sends int32)."""
        flat = np.frombuffer(data, dtype=np.dtype(source_dtype).newbyteorder("<"))
        width = num_layers * top_k
        if flat.size % width:
            raise ValueError(f"{flat.size} expert ids are not a whole number of tokens of "
                             f"{num_layers} layers x top-{top_k}")
        return cls.from_ids(flat.reshape(-1, num_layers, top_k), num_experts)

    @property
    def num_tokens(self) -> int:
        return int(self.array.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.array.shape[1])

    @property
    def top_k(self) -> int:
        return int(self.array.shape[2])

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    def prefix(self, num_tokens: int) -> "RoutedExperts":
        return RoutedExperts(self.array[:num_tokens])

    def to_tensor(self) -> torch.Tensor:
        """``int64`` ids (what the router's gather takes)."""
        return torch.from_numpy(self.array.astype(np.int64))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RoutedExperts):
            return NotImplemented
        return self.array.dtype == other.array.dtype and np.array_equal(self.array, other.array)

    def __hash__(self) -> int:
        return hash((self.array.shape, self.array.tobytes()))

    def __repr__(self) -> str:
        return f"RoutedExperts(tokens={self.num_tokens}, layers={self.num_layers}, top_k={self.top_k}, " \
               f"dtype={self.array.dtype.name})"

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.array.shape), "dtype": self.array.dtype.name,
                "data": base64.b64encode(self.array.tobytes()).decode("ascii")}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RoutedExperts":
        dtype = str(data["dtype"])
        if dtype not in DTYPES:
            raise ValueError(f"routed experts dtype must be one of {DTYPES}, got {dtype!r}")
        shape: Sequence[int] = [int(n) for n in data["shape"]]
        flat = np.frombuffer(base64.b64decode(data["data"]), dtype=np.dtype(dtype).newbyteorder("<"))
        return cls(flat.reshape(shape).copy())


def bytes_per_token(num_layers: int, top_k: int, num_experts: int) -> int:
    """Memory of one token's record: ``layers * top_k * itemsize``."""
    return num_layers * top_k * np.dtype(expert_dtype(num_experts)).itemsize


@dataclass(frozen=True)
class RoutingShape:
    """What an engine's routing answer means: every decoder layer (``num_hidden_layers``), the
    router's ``top_k`` (``num_experts_per_tok``) of ``num_experts``."""

    num_layers: int
    top_k: int
    num_experts: int

    @classmethod
    def of_hf_config(cls, config: Mapping[str, Any]) -> "RoutingShape":
        """From a Hugging Face MoE ``config.json`` (Qwen3-MoE's key names; transformers 5 writes
        ``num_local_experts`` for ``num_experts``)."""
        experts = config.get("num_experts") or config.get("num_local_experts")
        missing = [k for k in ("num_hidden_layers", "num_experts_per_tok") if not config.get(k)]
        missing += [] if experts else ["num_experts"]
        if missing:
            raise ValueError(f"loss.routing_replay: rollout needs a mixture-of-experts model; its config has no "
                             f"{', '.join(missing)}")
        return cls(int(config["num_hidden_layers"]), int(config["num_experts_per_tok"]), int(experts))

    def decode_sglang(self, value: str, tokens: int) -> RoutedExperts:
        """SGLang 0.5.23's ``meta_info["routed_experts"]``: base64 of the int32 ids of the positions
        ``[0, seqlen - 1)``, shaped ``[tokens, num_hidden_layers, top_k]`` (``state_capturer/
        routed_experts.py``; ``tokenizer_manager.py`` encodes with ``pybase64.b64encode(t.numpy()
        .tobytes())``); ``tokens`` is the expected row count."""
        record = RoutedExperts.from_bytes(base64.b64decode(value), source_dtype="int32", num_layers=self.num_layers,
                                          top_k=self.top_k, num_experts=self.num_experts)
        if record.num_tokens != tokens:
            raise ValueError(f"routed_experts has {record.num_tokens} tokens, expected prompt + output - 1 = {tokens}")
        return record
