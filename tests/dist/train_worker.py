"""Worker for tests/test_training_distributed.py: the Megatron train path under several layouts.

Two ways to run it, on the same cases, models, samples and seeds:

* ``torchrun --nproc_per_node 2 tests/dist/train_worker.py --out DIR --cases a,b``: each case
  runs under its two-rank layout (TP2, TP2+SP, PP2, DP2, EP2, ...), one after the other in the
  same world (the model-parallel groups are rebuilt per case).
* ``python tests/dist/train_worker.py --reference --out DIR --cases a,b``: a world of one, TP1,
  one micro-batch holding the whole batch, plain optimizer: the reference.

Per case and rank the worker computes the samples' log-probs (``compute_logprobs``), the loss and
gradients of one ``forward_backward`` (gradients exported under HF names through the weight map,
so shards and stages can be merged), and optionally the losses of a few optimizer steps. Tensors
go to ``DIR/<case>.<mode>.rank<r>.pt``; one ``RESULT {json}`` line per case and rank carries the
scalars. The test compares the two modes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from support.paths import add_test_dirs  # noqa: E402

add_test_dirs()  # the test modules it imports may live in tests/<package>/

from spade.models import ParallelLayout, RankCoords  # noqa: E402
from spade.models.builder import BuildOptions, naming_for  # noqa: E402
from spade.models.loading import RankExport, StageBroadcast, all_hf_weights, ep_all_gather, group_gather  # noqa: E402
from spade.models.weight_map import iter_hf_weights  # noqa: E402
from spade.training import (  # noqa: E402
    LossSettings,
    OptimizerSettings,
    TrainSample,
    build_model,
    build_optimizer,
    compute_logprobs,
    data_parallel_shard,
    forward_backward,
    init_parallel,
    make_micro_batches,
    teardown_parallel,
    train_step,
)
from test_models_parity import VOCAB, checkpoint_state, tiny_hf  # noqa: E402

REFERENCE_BUDGET = 1 << 20  # one micro-batch for the whole batch
LENGTHS = (9, 14, 6, 11, 17, 8, 12, 5)


@dataclass(frozen=True)
class Case:
    """One layout check. ``budget``: micro-batch token budget of the two-rank run."""

    model: str
    layout: ParallelLayout
    budget: int = 4096
    steps: int = 0
    lr: float = 2e-4
    distributed_optimizer: bool = False
    grads: bool = True
    loss: LossSettings = field(default_factory=lambda: LossSettings(kl_coef=0.05))
    per_token_advantages: bool = False
    turn_episodes: bool = False  # the samples are the turn samples of EPISODES, weighted (per_turn)


CASES: dict[str, Case] = {
    "tp2": Case("qwen3", ParallelLayout(tp=2), steps=3),
    "tp2_sp": Case("llama-tied", ParallelLayout(tp=2, sequence_parallel=True), per_token_advantages=True),
    "pp2": Case("qwen3", ParallelLayout(pp=2), budget=48, steps=3),
    "pp2_tied": Case("llama-tied", ParallelLayout(pp=2), budget=40,
                     loss=LossSettings(aggregation="seq_mean_token_mean")),
    "dp2": Case("qwen3", ParallelLayout(), budget=40, steps=3),
    # per-turn samples of one episode land on both ranks and in several micro-batches
    "dp2_turns": Case("qwen3", ParallelLayout(), budget=40, loss=LossSettings(aggregation="sample_mean"),
                      turn_episodes=True),
    "dp2_distopt": Case("qwen3", ParallelLayout(), budget=40, steps=3, distributed_optimizer=True, grads=False),
    "moe_ep2": Case("qwen3-moe", ParallelLayout(ep=2, etp=1), budget=30),  # 3 vs 2 micro-batches
    "moe_tp2": Case("qwen3-moe", ParallelLayout(tp=2, sequence_parallel=True)),
}


# turn samples of four episodes (indices into LENGTHS), as selfplay.plays.sample_form per_turn gives them
EPISODES = ((0, 1, 2), (3,), (4, 5), (6, 7))


def as_turn_episodes(samples: list[TrainSample]) -> list[TrainSample]:
    """Each episode's advantage on its turns, loss weights n_t / N, the count on its first turn."""
    out = list(samples)
    for episode in EPISODES:
        total = sum(samples[i].num_loss_tokens for i in episode)
        for t, i in enumerate(episode):
            out[i] = dataclasses.replace(samples[i], advantages=samples[episode[0]].advantages,
                                         loss_weight=samples[i].num_loss_tokens / total, count_weight=int(t == 0))
    return out


def make_samples(per_token_advantages: bool) -> list[TrainSample]:
    """Fixed samples: a prompt part (mask 0) then a response part (mask 1), mixed advantages."""
    gen = torch.Generator().manual_seed(7)
    samples = []
    for index, length in enumerate(LENGTHS):
        ids = torch.randint(0, VOCAB, (length,), generator=gen)
        mask = torch.zeros(length - 1)
        mask[length // 3:] = 1.0
        if per_token_advantages:
            advantages = torch.randn(length - 1, generator=gen)
        else:
            advantages = float(torch.randn((), generator=gen))
        samples.append(TrainSample(ids, mask, advantages))
    return samples


def with_logprobs(samples: list[TrainSample], old: dict[int, torch.Tensor]) -> list[TrainSample]:
    """Old log-probs from the model; rollout and reference log-probs are old plus fixed noise."""
    gen = torch.Generator().manual_seed(11)
    out = []
    for index, sample in enumerate(samples):
        noise = torch.randn(2, sample.num_targets, generator=gen) * 0.1
        if index in old:
            out.append(dataclasses.replace(
                sample, old_logprobs=old[index], rollout_logprobs=old[index] + noise[0],
                ref_logprobs=old[index] + noise[1]))
    return out


def hf_named_grads(model, spec, layout) -> dict[str, torch.Tensor]:
    """This rank's main_grads (after finalize) as full HF-named tensors (TP shards gathered)."""
    grads = {name: param.main_grad.detach().clone()
             for name, param in model.unwrapped()[0].named_parameters()}
    return {name: tensor.clone() for name, tensor in
            iter_hf_weights(grads, spec, layout, RankCoords.current(), group_gather(), naming_for(model.options))}


def run_case(name: str, case: Case, reference: bool, out_dir: Path) -> dict:
    layout = ParallelLayout() if reference else case.layout
    budget = REFERENCE_BUDGET if reference else case.budget
    ctx = init_parallel(layout, seed=1234)
    hf_model, spec = tiny_hf(case.model)
    model = build_model(
        spec, layout, options=BuildOptions(params_dtype=torch.float32), hf_state=checkpoint_state(hf_model, spec),
        use_distributed_optimizer=case.distributed_optimizer and not reference,
    )
    # what live weight sync streams: the whole model on every rank
    full = {name: tensor.clone() for name, tensor in all_hf_weights(
        model.chunks[0], spec, RankExport(layout, RankCoords.current(), group_gather(), naming_for(model.options)),
        ep_gather=ep_all_gather(), stages=StageBroadcast(ctx.device) if layout.pp > 1 else None)}
    multiple = layout.tp if layout.sequence_parallel else 1
    samples = make_samples(case.per_token_advantages)
    if case.turn_episodes:
        samples = as_turn_episodes(samples)
    mine = data_parallel_shard(samples, ctx.dp_size, ctx.dp_rank)
    local = [samples[i] for i in mine]
    logprobs = compute_logprobs(model.chunks, make_micro_batches(local, budget, packed=False,
                                                                  pad_to_multiple_of=multiple))
    old = {mine[i]: lp for i, lp in enumerate(logprobs)}
    train_samples = with_logprobs(samples, old)
    micro_batches = make_micro_batches(train_samples, budget, packed=False, pad_to_multiple_of=multiple)

    summary = forward_backward(model.chunks, micro_batches, case.loss)
    grads = hf_named_grads(model, spec, layout) if case.grads else {}
    losses, grad_norms = [], []
    if case.steps:
        optimizer, scheduler = build_optimizer(model.chunks, OptimizerSettings(
            lr=case.lr, weight_decay=0.1, use_distributed_optimizer=model.chunks[0].ddp_config.use_distributed_optimizer))
        for _ in range(case.steps):
            metrics = train_step(model.chunks, optimizer, scheduler, micro_batches, case.loss)
            losses.append(metrics.loss)
            grad_norms.append(metrics.grad_norm)
    mode = "reference" if reference else "parallel"
    torch.save({"logprobs": old, "grads": grads, "full_weights": full}, out_dir / f"{name}.{mode}.rank{ctx.rank}.pt")
    teardown_parallel(destroy_process_group=False)
    return dict(case=name, mode=mode, rank=ctx.rank, dp_rank=ctx.dp_rank, micro_batches=len(micro_batches),
                summary=dataclasses.asdict(summary), losses=losses, grad_norms=grad_norms)


def emit(result: dict) -> None:
    """One ``RESULT {json}`` line in a single write: both ranks share the pipe, and writes under
    PIPE_BUF bytes are not interleaved."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), ("RESULT " + json.dumps(result) + "\n").encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        for name in args.cases.split(","):
            started = time.time()
            result = run_case(name, CASES[name], args.reference, args.out)
            result["seconds"] = round(time.time() - started, 2)
            emit(result)
    finally:
        teardown_parallel()


if __name__ == "__main__":
    main()
