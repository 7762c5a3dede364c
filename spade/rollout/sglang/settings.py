"""The ``engine.sglang`` config section: how spade launches, reaches and feeds SGLang servers.

It lives beside the SGLang code that reads it (``deployment``, ``engine``); the config
tree (``spade.train_config``) imports it, never the other way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from ...config import require

# SGLang reads it (``get_bool_env_var``: "1" or "true") in ``srt/layers/sampler.py``: set, the returned
# log-probs are those of softmax(logits) at T = 1 instead of softmax(logits / T) (see spade.rollout.engine).
ORIGINAL_LOGPROB_VARIABLE = "SGLANG_RETURN_ORIGINAL_LOGPROB"


@dataclass(frozen=True)
class SGLangSection:
    """The ``sglang`` rollout engine (``engine.kind: sglang``); docs/scale_out.md explains each key.

    Colocated (``urls`` empty): local rank 0 of every node launches ``servers_per_node`` SGLang
    servers on that node's GPUs, each over ``tp * dp`` GPUs starting at GPU ``i * tp * dp``, and
    weights travel by CUDA IPC from the trainer ranks on the same GPUs. Disaggregated (``urls``
    given): the servers run elsewhere and weights travel by an NCCL broadcast from global rank 0.
    """

    urls: tuple[str, ...] = ()  # running servers (disaggregated); empty: launch colocated servers
    servers_per_node: int = 1
    tp: int = 1  # [--tp-size] GPUs per model replica
    ep: int = 1  # [--ep-size]
    dp: int = 1  # [--dp-size] must be 1: SGLang refuses weight updates with dp > 1
    mem_fraction: float = 0.6  # [--mem-fraction-static] share of GPU memory for weights + KV cache
    port: int = 30000  # the first server of a node listens here, the next on port + 1, ...
    host: str = "127.0.0.1"  # bind address; multi-node runs need an address other nodes reach
    advertise_host: Optional[str] = None  # address other nodes use (default: this node's hostname)
    server_args: dict = field(default_factory=dict)  # any other SGLang flag: {flag_name: value}
    server_command: tuple[str, ...] = ()  # replaces "python -m sglang.launch_server" (tests, wrappers)
    server_env: dict = field(default_factory=dict)  # extra environment of the server processes
    start_timeout_s: float = 900.0  # seconds a server may take to report healthy
    request_timeout_s: float = 900.0  # seconds one generation request may wait
    max_retries: int = 2  # a failed request is re-sent to another (or the restarted) server
    max_restarts: int = 3  # restarts of one server per run before the run fails
    release_memory: bool = True  # colocated: release weights and KV cache while the trainer runs
    offload_training: bool = True  # colocated: move training state to host while the servers generate
    weight_sync: Literal["auto", "ipc", "broadcast"] = "auto"  # auto: ipc colocated, broadcast otherwise
    bucket_mb: int = 512  # size bound of one weight-sync transfer
    broadcast_port: int = 0  # rendezvous port of the broadcast group on global rank 0 (0: any free)

    def __post_init__(self) -> None:
        key = "engine.sglang."
        for name in ("servers_per_node", "tp", "ep", "dp", "bucket_mb"):
            require(getattr(self, name) >= 1, key + name, f"must be >= 1, got {getattr(self, name)}")
        require(self.dp == 1, key + "dp", f"must be 1, got {self.dp}: SGLang refuses weight updates on servers "
                "started with --dp-size > 1; use servers_per_node for more replicas")
        require(0 < self.mem_fraction < 1, key + "mem_fraction", f"must be in (0, 1), got {self.mem_fraction}")
        require(0 < self.port < 65536, key + "port", f"must be a TCP port, got {self.port}")
        require(0 <= self.broadcast_port < 65536, key + "broadcast_port", f"must be a TCP port or 0, got {self.broadcast_port}")
        require(self.max_retries >= 0, key + "max_retries", f"must be >= 0, got {self.max_retries}")
        require(self.max_restarts >= 0, key + "max_restarts", f"must be >= 0, got {self.max_restarts}")
        for name in ("start_timeout_s", "request_timeout_s"):
            require(getattr(self, name) > 0, key + name, f"must be > 0, got {getattr(self, name)}")
        for name in ("server_args", "server_env"):
            value = getattr(self, name)
            require(isinstance(value, dict) and all(isinstance(k, str) for k in value), key + name,
                    f"must be a mapping with string keys, got {value!r}")
        original = str(self.server_env.get(ORIGINAL_LOGPROB_VARIABLE, "")).strip().lower()
        require(original not in ("1", "true"), key + "server_env",
                f"{ORIGINAL_LOGPROB_VARIABLE}={self.server_env.get(ORIGINAL_LOGPROB_VARIABLE)!r} makes SGLang return "
                "log-probs at temperature 1 (srt/layers/sampler.py, Sampler.forward) while the trainer computes them "
                "at the sampling temperature, which would bias every importance weight; leave it unset")
        require(self.weight_sync != "ipc" or not self.urls, key + "weight_sync",
                "ipc needs colocated servers (urls must be empty); use broadcast or auto with urls")
        reserved = {"model_path", "model-path", "tp_size", "tp-size", "ep_size", "ep-size", "dp_size", "dp-size",
                    "port", "host", "mem_fraction_static", "mem-fraction-static", "base_gpu_id", "base-gpu-id"}
        clash = sorted(k.lstrip("-") for k in self.server_args if k.lstrip("-") in reserved)
        require(not clash, key + "server_args", f"{clash[0] if clash else ''} is set by spade from its own keys "
                "(engine.sglang.tp/ep/dp/mem_fraction/port/host, model.hf_dir); set those instead")

    @property
    def colocated(self) -> bool:
        return not self.urls

    @property
    def sync_method(self) -> str:
        if self.weight_sync != "auto":
            return self.weight_sync
        return "ipc" if self.colocated else "broadcast"
