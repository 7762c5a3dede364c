"""Worker for tests/test_checkpoint_distributed.py: checkpoint resharding and exact resume on 2 ranks.

Run as ``torchrun --nproc_per_node 2 tests/dist/checkpoint_worker.py WORK``. ``WORK`` holds what
the test prepared in one process at TP=1: ``hf-dense/`` and ``hf-moe/`` (tiny HF models),
``ckpt-dense-tp1/`` and ``ckpt-moe-tp1/`` (saved at TP=1) and ``reference.pt`` (input ids and
the TP=1 logits). Phases, each with its own Megatron parallel state:

1. tp2: load the dense TP=1 checkpoint at TP=2 -> logits;
2. ep2: load the MoE TP=1 checkpoint at EP=2 (data-parallel 2) -> logits;
3. tp2-train: train one step at TP=2 (plain optimizer), save model+optimizer+RNG to
   ``ckpt-dense-tp2-step1/`` and its parameters and Adam moments (HF-named, gathered) to
   ``tp2-step1-snapshot.pt``; then (a) continue one more step, and (b) load the checkpoint into a
   fresh model and optimizer and take the same step: losses, parameters and RNG draws must agree
   exactly;
4. dp2-distopt: the same with the distributed optimizer at TP=1 x DP=2, saved to
   ``ckpt-dense-dp2-distopt-step1/`` (snapshot: parameters only).

Rank 0 writes ``results.json`` (max differences, equalities and the continued runs' losses); the
test asserts on it. Only rank-independent facts are written, so rank 0 speaks for both.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS.parent)]

import support.hf_fixtures as hx  # noqa: E402
from spade.models import ParallelLayout  # noqa: E402
from spade.training.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from spade.training.parallel import init_parallel, teardown_parallel  # noqa: E402


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def rng_draws() -> list[float]:
    """Numbers from the default generator and from Megatron's model-parallel stream."""
    import random

    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    plain = torch.rand(3).tolist()
    with get_cuda_rng_tracker().fork():
        forked = torch.rand(3).tolist()
    return plain + forked + [random.random()]


def all_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def load_into_fresh(hf_dir: Path, layout: ParallelLayout, ckpt: Path, distributed_optimizer: bool):
    model, spec = hx.megatron_model(hf_dir, layout, load_weights=False, seed=77)
    ddp, optimizer = hx.trainer(model, distributed_optimizer=distributed_optimizer)
    torch.manual_seed(4321)  # the load must bring the saved RNG state back
    info = load_checkpoint(ckpt, [ddp], optimizer=optimizer)
    return model, spec, ddp, optimizer, info


def resume_phase(work: Path, name: str, layout: ParallelLayout, distributed_optimizer: bool) -> dict:
    """Train one step, save, then continue vs. reload-and-continue at the same layout."""
    hf_dir, ckpt = work / "hf-dense", work / f"ckpt-dense-{name}-step1"
    first, second = hx.batch(1), hx.batch(2)
    model, spec = hx.megatron_model(hf_dir, layout)
    ddp, optimizer = hx.trainer(model, distributed_optimizer=distributed_optimizer)
    hx.train_step(ddp, optimizer, first)
    save_checkpoint(ckpt, [ddp], hf_config=json.loads((hf_dir / "config.json").read_text()),
                    layout=layout, step=1, optimizer=optimizer, tokenizer_dir=hf_dir)
    snapshot = hx.hf_state(model, spec, layout)
    if not distributed_optimizer:
        snapshot.update(hx.adam_moments(model, optimizer, spec, layout))
    if dist.get_rank() == 0:
        torch.save(snapshot, work / f"{name}-step1-snapshot.pt")
    draws_a = rng_draws()
    loss_a = hx.train_step(ddp, optimizer, second)
    state_a = hx.hf_state(model, spec, layout)

    model_b, _, ddp_b, optimizer_b, info = load_into_fresh(hf_dir, layout, ckpt, distributed_optimizer)
    draws_b = rng_draws()
    loss_b = hx.train_step(ddp_b, optimizer_b, second)
    state_b = hx.hf_state(model_b, spec, layout)
    return {
        f"{name}_step": info.step,
        f"{name}_contents": list(info.contents),
        f"{name}_continued_loss": loss_a,
        f"{name}_resumed_loss": loss_b,
        f"{name}_params_equal": all_equal(state_a, state_b),
        f"{name}_rng_equal": draws_a == draws_b,
    }


def main() -> None:
    work = Path(sys.argv[1])
    reference = torch.load(work / "reference.pt")
    ids = reference["ids"]
    results: dict = {}
    started = time.perf_counter()

    tp2 = ParallelLayout(tp=2)
    init_parallel(tp2)
    model, _ = hx.megatron_model(work / "hf-dense", tp2, load_weights=False, seed=5)
    info = load_checkpoint(work / "ckpt-dense-tp1", [model])
    results["tp2_saved_layout"] = [info.layout.tp, info.layout.ep]
    results["tp2_logits_diff"] = max_diff(hx.full_logits(model, ids), reference["dense"])

    ep2 = ParallelLayout(ep=2, etp=1)
    init_parallel(ep2)
    model, _ = hx.megatron_model(work / "hf-moe", ep2, load_weights=False, seed=5)
    load_checkpoint(work / "ckpt-moe-tp1", [model])
    results["ep2_logits_diff"] = max_diff(hx.full_logits(model, ids), reference["moe"])

    init_parallel(tp2)
    results.update(resume_phase(work, "tp2", tp2, distributed_optimizer=False))

    init_parallel(ParallelLayout())
    results.update(resume_phase(work, "dp2-distopt", ParallelLayout(), distributed_optimizer=True))

    results["seconds"] = round(time.perf_counter() - started, 1)
    if dist.get_rank() == 0:
        (work / "results.json").write_text(json.dumps(results, indent=1))
    print(f"OK rank {dist.get_rank()}", flush=True)
    teardown_parallel()


if __name__ == "__main__":  # the checkpoint writer spawns a helper process: keep this guard
    main()
