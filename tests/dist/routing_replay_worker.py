"""Worker for tests/test_routing_replay_distributed.py: routing replay under EP2 and TP2 x EP2.

``torchrun --nproc_per_node N tests/dist/routing_replay_worker.py --out DIR --case C`` runs the
case's layout; ``python tests/dist/routing_replay_worker.py --reference --out DIR`` a world of one
(EP1). Same trainer (the tiny Qwen3-MoE with perturbed weights), same engine records
(test_routing_replay's), same samples. Per rank it saves the samples' log-probs with and without
replay, the gradients of one replayed ``forward_backward`` (HF names, shards merged) and prints the
router agreement of the replayed pass (counts all-reduced over the world, as the learner does).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from support.paths import add_test_dirs  # noqa: E402

add_test_dirs()  # the test modules it imports may live in tests/<package>/

from spade.models import ParallelLayout, RankCoords  # noqa: E402
from spade.models.builder import BuildOptions, naming_for  # noqa: E402
from spade.models.loading import group_gather  # noqa: E402
from spade.models.weight_map import iter_hf_weights  # noqa: E402
from spade.training import (  # noqa: E402
    LossSettings,
    build_model,
    compute_logprobs,
    data_parallel_shard,
    forward_backward,
    init_parallel,
    make_micro_batches,
    teardown_parallel,
)
from test_models_parity import checkpoint_state, tiny_hf  # noqa: E402
from test_routing_replay import PERTURB, engine_trajectories, perturbed  # noqa: E402

LAYOUTS = {
    "ep2": ParallelLayout(ep=2, etp=1),
    "tp2_ep2": ParallelLayout(tp=2, ep=2, etp=1, sequence_parallel=True),
}


def run(layout: ParallelLayout, mode: str, out_dir: Path) -> dict:
    from megatron_patches.router_replay import agreement_counts, attach

    ctx = init_parallel(layout, seed=1234)
    hf_model, spec = tiny_hf("qwen3-moe")
    samples = [t.to_train_sample() for t in engine_trajectories(hf_model)]
    state = checkpoint_state(perturbed(hf_model, PERTURB), spec)
    options = BuildOptions(params_dtype=torch.float32)
    mine = data_parallel_shard(samples, ctx.dp_size, ctx.dp_rank)
    multiple = layout.tp if layout.sequence_parallel else 1
    batches = make_micro_batches([samples[i] for i in mine], 48, packed=False, pad_to_multiple_of=multiple)
    result = {}
    for replay in (False, True):
        model = build_model(spec, layout, options=options, hf_state=state)
        if replay:
            attach(model.chunks)
        logprobs = compute_logprobs(model.chunks, batches)
        result[f"logprobs_{'replay' if replay else 'own'}"] = {mine[i]: lp for i, lp in enumerate(logprobs)}
    agreement_counts(model.chunks)  # reset: the counts below are the replayed forward/backward's
    forward_backward(model.chunks, batches, LossSettings(routing_replay="rollout"))
    counts = torch.tensor(agreement_counts(model.chunks), dtype=torch.float64)
    dist.all_reduce(counts)
    grads = {n: p.main_grad.detach().clone() for n, p in model.unwrapped()[0].named_parameters()}
    result["grads"] = {n: t.clone() for n, t in
                       iter_hf_weights(grads, spec, layout, RankCoords.current(), group_gather(), naming_for(options))}
    torch.save(result, out_dir / f"{mode}.rank{ctx.rank}.pt")
    teardown_parallel(destroy_process_group=False)
    return dict(mode=mode, rank=ctx.rank, agreement=counts[0].item() / counts[1].item(), micro_batches=len(batches))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--case", default="ep2", choices=sorted(LAYOUTS))
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        result = run(ParallelLayout() if args.reference else LAYOUTS[args.case],
                     "reference" if args.reference else args.case, args.out)
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), ("RESULT " + json.dumps(result) + "\n").encode())
    finally:
        teardown_parallel()


if __name__ == "__main__":
    main()
