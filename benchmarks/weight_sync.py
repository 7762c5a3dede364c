"""Seconds to push a whole model into a running rollout server, by transfer bucket size.

    # GPU, colocated: an SGLang server on this GPU, weights sent by CUDA IPC from this process
    python benchmarks/weight_sync.py --model-path models/Qwen3-4B-Instruct-2507 --device cuda \
        --bucket-mb 128,512,1024
    # CPU: the tests' protocol stand-in (shared-memory handles instead of CUDA IPC)
    python benchmarks/weight_sync.py --model-path DIR --device cpu \
        --server-command "python tests/sglang_standin/server.py"

What is timed is the trainer's colocated path, ``weight_transport.update_weights_by_ipc`` (the
function ``SGLangDeployment.sync_weights`` runs), fed from this one process: the model's tensors,
already on ``--device`` (read once from ``--model-path``'s safetensors, as the trainer holds them
after its TP/EP gathers), are packed into buckets of at most ``--bucket-mb`` (``pack_buckets``),
each bucket serialized as IPC handles once per server TP worker (``serialize_named_tensors``) and
posted to ``/update_weights_from_tensor`` inside a ``/begin_weight_update`` ..
``/end_weight_update`` session, then ``/flush_cache``. Each bucket size runs ``--repeats`` times;
the best and the median are printed with the bandwidth (model bytes / seconds).

One process feeds every TP worker here, so with ``--tp > 1`` the workers on other GPUs read this
GPU's memory over NVLink: a pessimistic bound. In training every rank feeds the worker on its own
GPU in parallel; that figure is ``time/sync_s`` in a run's ``metrics.jsonl`` (the 30B-A3B target,
8 GPUs colocated, is under 10 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from spade.models import read_model_spec  # noqa: E402
from spade.rollout.sglang.engine import SGLangEngine  # noqa: E402
from spade.training.hf_directory import read_hf_tensors  # noqa: E402
from spade.rollout.sglang.weight_transport import push_weights_by_ipc  # noqa: E402

from bench_server import add_server_args, served  # noqa: E402


def load_weights(model_path: Path, device: torch.device) -> list[tuple[str, torch.Tensor]]:
    """The model's tensors under the names the trainer sends them by, on ``device``."""
    return [(name, tensor.to(device))
            for name, tensor in read_hf_tensors(model_path, read_model_spec(model_path)).items()]


async def one_sync(engine: SGLangEngine, named: list[tuple[str, torch.Tensor]], bucket_bytes: int,
                   device: torch.device, tp: int, version: int) -> tuple[float, int]:
    started = time.perf_counter()
    buckets = await push_weights_by_ipc(engine, named, version, tp=tp, max_bucket_bytes=bucket_bytes, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started, buckets


async def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    named = load_weights(Path(args.model_path), device)
    total = sum(t.numel() * t.element_size() for _, t in named)
    results: dict[str, Any] = {"model_bytes": total, "tensors": len(named), "device": str(device), "runs": {}}
    async with served(args) as url:
        engine = SGLangEngine([url], control_timeout_s=3600)
        version = 1
        for mb in [int(x) for x in args.bucket_mb.split(",")]:
            times = []
            for _ in range(args.repeats):
                seconds, buckets = await one_sync(engine, named, mb << 20, device, args.tp, version)
                version += 1
                times.append(seconds)
            results["runs"][mb] = {"best_s": round(min(times), 4), "median_s": round(statistics.median(times), 4),
                                   "buckets": buckets, "gb_per_s": round(total / min(times) / 1e9, 3)}
        await engine.aclose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_server_args(parser)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bucket-mb", default="128,512,1024", help="comma-separated bucket bounds (MiB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = asyncio.run(run(args))
    print(f"model: {results['tensors']} tensors, {results['model_bytes'] / 1e9:.3f} GB on {results['device']}")
    for mb, r in results["runs"].items():
        print(f"bucket {mb:>5} MiB: best {r['best_s']:.3f} s, median {r['median_s']:.3f} s, "
              f"{r['buckets']} buckets, {r['gb_per_s']:.2f} GB/s")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
