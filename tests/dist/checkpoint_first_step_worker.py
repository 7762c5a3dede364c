"""Worker for tests/training/test_checkpoint_first_step.py: checkpoints saved before the optimizer's first
step, on 2 ranks.

Run as ``torchrun --nproc_per_node 2 tests/dist/checkpoint_first_step_worker.py WORK``; ``WORK``
holds ``hf-dense/`` (a tiny HF model). For TP=2 with the plain optimizer and for DP=2 with the
distributed optimizer: build a model and optimizer, save model+optimizer+RNG at step 0 before any
step (``ckpt-<name>-step0/``), take two steps (the uninterrupted run); then load the checkpoint
into a fresh model and optimizer and take the same two steps. Rank 0 writes ``results.json``
(losses of both, whether the parameters and RNG draws agree exactly, the saved optimizer_state).
The files each rank wrote must be in the checkpoint's manifest, and no rank may have started a
process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS.parent)]

import support.hf_fixtures as hx  # noqa: E402
from checkpoint_worker import all_equal, rng_draws  # noqa: E402
from spade.models import ParallelLayout  # noqa: E402
from spade.training.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from spade.training.checkpoint_info import read_checkpoint_info  # noqa: E402
from spade.training.checkpoint_manifest import read_manifest, verify_checkpoint  # noqa: E402
from spade.training.parallel import init_parallel, teardown_parallel  # noqa: E402


def phase(work: Path, name: str, layout: ParallelLayout, distributed_optimizer: bool) -> dict:
    hf_dir, ckpt = work / "hf-dense", work / f"ckpt-{name}-step0"
    model, spec = hx.megatron_model(hf_dir, layout)
    ddp, optimizer = hx.trainer(model, distributed_optimizer=distributed_optimizer)
    save_checkpoint(ckpt, [ddp], hf_config=json.loads((hf_dir / "config.json").read_text()),
                    layout=layout, step=0, optimizer=optimizer, tokenizer_dir=hf_dir)
    draws_a = rng_draws()
    losses_a = [hx.train_step(ddp, optimizer, hx.batch(1)), hx.train_step(ddp, optimizer, hx.batch(2))]
    state_a = hx.hf_state(model, spec, layout)

    fresh, _ = hx.megatron_model(hf_dir, layout, load_weights=False, seed=78)
    fresh_ddp, fresh_optimizer = hx.trainer(fresh, distributed_optimizer=distributed_optimizer)
    torch.manual_seed(4322)
    info = load_checkpoint(ckpt, [fresh_ddp], optimizer=fresh_optimizer)
    draws_b = rng_draws()
    losses_b = [hx.train_step(fresh_ddp, fresh_optimizer, hx.batch(1)),
                hx.train_step(fresh_ddp, fresh_optimizer, hx.batch(2))]
    state_b = hx.hf_state(fresh, spec, layout)
    distcp = sorted(n for n in read_manifest(ckpt) if n.endswith(".distcp"))
    return {
        f"{name}_optimizer_state": read_checkpoint_info(ckpt).optimizer_state,
        f"{name}_step": info.step,
        f"{name}_continued_losses": losses_a,
        f"{name}_resumed_losses": losses_b,
        f"{name}_params_equal": all_equal(state_a, state_b),
        f"{name}_rng_equal": draws_a == draws_b,
        f"{name}_distcp_ranks": sorted({n.split("_")[2] for n in distcp}),
        f"{name}_problems": verify_checkpoint(ckpt),
    }


def main() -> None:
    work = Path(sys.argv[1])
    results: dict = {}
    tp2 = ParallelLayout(tp=2)
    init_parallel(tp2)
    results.update(phase(work, "tp2", tp2, distributed_optimizer=False))
    init_parallel(ParallelLayout())
    results.update(phase(work, "dp2-distopt", ParallelLayout(), distributed_optimizer=True))
    children = [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, children)
    results["children"] = gathered
    if dist.get_rank() == 0:
        (work / "results.json").write_text(json.dumps(results, indent=1))
    print(f"OK rank {dist.get_rank()}", flush=True)
    teardown_parallel()


if __name__ == "__main__":
    main()
