"""Worker for tests/test_control_group.py: ranks >= 1 wait for rank 0 longer than the default
process group's timeout, and survive.

Run as ``python tests/dist/control_worker.py OUT TIMEOUT_S DELAY_S``. This process imports
everything, then forks two ranks (so they reach ``init_parallel`` together) that join a gloo world
through torchrun's variables (``env://``) with a default-group timeout of ``TIMEOUT_S`` seconds.
In each scenario rank 0 takes ``DELAY_S`` (> ``TIMEOUT_S``) before it acts, as it does while it runs
rollouts and evaluation in a real run, while rank 1 waits:

1. ``samples``: rank 1 in ``share_samples`` (the rollout manager's command wait) until rank 0 shares
   the step's samples;
2. ``recover``: rank 0 tells rank 1 to restart a server and re-send the weights, then shares the
   samples; during the CUDA-IPC weight update rank 0's post to the server takes ``DELAY_S`` while
   rank 1 waits at the update's barrier;
3. ``publish``: both ranks publish the weights (release, resume, sync); rank 1's parameters take a
   while to leave the device, and rank 0 records whether they had when it resumed the KV cache;
4. ``barrier``: a plain control barrier;
5. ``premise``: rank 1 alone waits in a barrier of the default group, which must time out
   (otherwise the scenarios above prove nothing).

Each rank writes ``OUT/rank<r>.json``: every scenario's outcome (``"ok"`` or the error) and what
it received.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import sys
import time
import traceback
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS.parent)]

import megatron_patches  # noqa: E402,F401
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402,F401

from sglang_recording import RecordingEngine, RecordingMemory  # noqa: E402
from spade import collectives  # noqa: E402
from spade.models import ParallelLayout  # noqa: E402
from spade.rollout.manager import HFRolloutManager, SGLangRolloutManager  # noqa: E402
from spade.rollout.sglang.deployment import ServerPlan, SGLangDeployment  # noqa: E402
from spade.rollout.sglang.settings import SGLangSection  # noqa: E402
from spade.training.parallel import init_parallel  # noqa: E402

WEIGHTS = {"embed.weight": torch.arange(24, dtype=torch.float32).reshape(6, 4),
           "head.weight": torch.linspace(-2, 2, 12).reshape(3, 4)}
SAMPLES = [{"id": i, "tokens": list(range(i + 2)), "advantage": torch.tensor([0.5 * i])} for i in range(3)]


def deployment_for(rank: int, work: Path, delay: float, log: list, phase: dict) -> SGLangRolloutManager:
    """One colocated TP=2 server whose workers are fed by ranks 0 and 1 (rank 0 holds the engine)."""
    deployment = SGLangDeployment(SGLangSection(bucket_mb=1), model_dir=work, log_dir=work,
                                  device=torch.device("cpu"), local_rank=rank)
    deployment.plans = [ServerPlan(index=0, url="http://127.0.0.1:40000", owner_rank=0, port=40000,
                                   ipc_ranks=(0, 1))]
    marker = work / "rank1-params-off"
    slow_post = {"left": 1}

    async def on_call(call):
        if call.what == "/update_weights_from_tensor" and slow_post["left"]:
            slow_post["left"] -= 1
            await asyncio.sleep(delay)  # rank 1 waits at the update's barrier meanwhile
        if call.what == "/resume_memory_occupation" and call.tags == ("kv_cache",):
            log.append({"kv_resumed_after_rank1_params_off": marker.exists()})

    def on_move(what: str) -> None:
        if rank == 1 and what == "offload_params" and phase.get("publish"):
            time.sleep(delay / 3)
            marker.touch()

    if rank == 0:
        deployment.engine = RecordingEngine(1, [], on_call=on_call)
    backend = SGLangRolloutManager(deployment, is_main=rank == 0, device=torch.device("cpu"))
    backend.engine = deployment.engine
    backend.use_training_memory(RecordingMemory([], on_move=on_move))
    return backend


def same(a, b) -> bool:
    return json.dumps(a, default=lambda t: t.tolist()) == json.dumps(b, default=lambda t: t.tolist())


async def scenarios(rank: int, work: Path, delay: float) -> dict:
    out: dict = {}

    async def run(name, body):
        try:
            out[name] = await body()
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out[name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"

    cpu = torch.device("cpu")

    async def samples():
        backend = HFRolloutManager(None, is_main=rank == 0, device=cpu)
        if rank == 0:
            await asyncio.sleep(delay)  # rollouts and evaluation
            got = await backend.switch_to_training(SAMPLES)
        else:
            got = await backend.switch_to_training(None)
        return "ok" if same(got, SAMPLES) else f"wrong samples: {got!r}"

    log: list = []
    phase: dict = {}
    backend = deployment_for(rank, work, delay, log, phase)
    backend._weights = lambda: iter(WEIGHTS.items())
    backend.version = 1

    async def recover():
        if rank == 0:
            await asyncio.sleep(delay)
            await backend._recover(0)
            got = await backend.switch_to_training(SAMPLES)
            received = backend.engine.received
            entries = [dict(entry) for body in received for entry in body]
            if len(entries) != 2 or any(sorted(e) != sorted(WEIGHTS) for e in entries):
                return f"the server got {[sorted(e) for e in entries]}"
            if not all(torch.equal(e[name], WEIGHTS[name]) for e in entries for name in WEIGHTS):
                return "the server got other weights"
            if len(log) != 1:  # the restarted server's KV cache comes back once, after the re-sync
                return f"kv resumes during the recovery: {log}"
        else:
            got = await backend.switch_to_training(None)
        return "ok" if same(got, SAMPLES) else f"wrong samples: {got!r}"

    async def publish():
        log.clear()  # the recovery above resumed the restarted server's KV cache too
        phase["publish"] = True
        await backend.publish(lambda: iter(WEIGHTS.items()), 2)
        if rank == 0:
            return "ok" if log == [{"kv_resumed_after_rank1_params_off": True}] else f"kv resume: {log}"
        return "ok"

    async def barrier():
        if rank == 0:
            await asyncio.sleep(delay)
        collectives.barrier()
        return "ok"

    async def premise():
        if rank == 0:
            await asyncio.sleep(delay)
            return "ok"
        try:
            dist.barrier()  # the default group, alone: must time out
        except Exception:  # noqa: BLE001
            return "ok"
        return "the default group's barrier did not time out"

    await run("samples", samples)
    await run("recover", recover)  # rank 0's switch_to_training releases the server, as in a step
    await run("publish", publish)
    await run("barrier", barrier)
    await run("premise", premise)
    return out


def rank_main(rank: int, port: int, work: Path, timeout_s: float, delay: float) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    result: dict = {}
    try:
        init_parallel(ParallelLayout(), backend="gloo", timeout_minutes=timeout_s / 60)
        result = asyncio.run(scenarios(rank, work, delay))
        # both done before either exits (the premise left rank 1's default group broken)
        collectives.barrier()
    except Exception as exc:  # noqa: BLE001
        result["setup"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    (work / f"rank{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # no process-group teardown: rank 1's default group timed out on purpose


def main() -> None:
    work, timeout_s, delay = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    from spade.rollout.sglang.launcher import free_port

    port = free_port()
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=rank_main, args=(r, port, work, timeout_s, delay)) for r in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()


if __name__ == "__main__":
    main()
