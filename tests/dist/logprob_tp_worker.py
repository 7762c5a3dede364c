"""Worker for tests/rl/test_logprobs.py: vocab-parallel token_logprobs against the single-rank result.

Run with ``torchrun --nproc_per_node 2 tests/dist/logprob_tp_worker.py``. Every rank builds the
same fp64 inputs, computes the TP=1 reference on the full vocabulary, then the TP result on its
vocabulary shard over a gloo group, and compares log-probs, the hidden gradient and its weight
shard's gradient. Exits non-zero (an AssertionError) on any mismatch; prints one OK line per rank.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from spade.rl.logprobs import logprobs_from_logits, token_logprobs  # noqa: E402

TOL = 1e-6


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def check_case(rank: int, world: int, *, seq_len: int, batch: int, hidden_size: int, vocab: int,
               chunk_size: int, temperature, reduce_hidden_grad: bool, seed: int) -> None:
    """``temperature``: a float, or "per-token" for a random ``[B, T]`` tensor (each token at its own T)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(seq_len, batch, hidden_size, dtype=torch.float64, generator=gen)
    weight = torch.randn(vocab, hidden_size, dtype=torch.float64, generator=gen)
    targets = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    upstream = torch.randn(batch, seq_len, dtype=torch.float64, generator=gen)
    # Make sure both shards own some targets.
    targets[0, 0], targets[-1, -1] = 0, vocab - 1
    if temperature == "per-token":
        temperature = torch.rand(batch, seq_len, dtype=torch.float64, generator=gen) + 0.3
    divisor = temperature.t().unsqueeze(-1) if isinstance(temperature, torch.Tensor) else temperature

    # TP=1 reference, on this rank alone, checked against the plain log_softmax path.
    ref_hidden = hidden.clone().requires_grad_()
    ref_weight = weight.clone().requires_grad_()
    ref = token_logprobs(ref_hidden, ref_weight, targets, chunk_size=chunk_size, temperature=temperature)
    (ref * upstream).sum().backward()
    plain = logprobs_from_logits((hidden @ weight.t() / divisor).transpose(0, 1), targets)
    assert max_diff(ref.detach(), plain) < TOL, "TP=1 chunked path disagrees with log_softmax"

    shard = vocab // world
    tp_hidden = hidden.clone().requires_grad_()
    tp_weight = weight[rank * shard:(rank + 1) * shard].clone().requires_grad_()
    out = token_logprobs(tp_hidden, tp_weight, targets, chunk_size=chunk_size, temperature=temperature,
                         tp_group=dist.group.WORLD, reduce_hidden_grad=reduce_hidden_grad)
    (out * upstream).sum().backward()
    grad_hidden = tp_hidden.grad.clone()
    if not reduce_hidden_grad:
        dist.all_reduce(grad_hidden, op=dist.ReduceOp.SUM)

    shown = "per-token" if isinstance(temperature, torch.Tensor) else temperature
    label = f"rank {rank} chunk={chunk_size} temperature={shown} reduce={reduce_hidden_grad}"
    d_out = max_diff(out.detach(), ref.detach())
    d_hidden = max_diff(grad_hidden, ref_hidden.grad)
    d_weight = max_diff(tp_weight.grad, ref_weight.grad[rank * shard:(rank + 1) * shard])
    assert d_out < TOL, f"{label}: log-probs differ by {d_out}"
    assert d_hidden < TOL, f"{label}: hidden gradients differ by {d_hidden}"
    assert d_weight < TOL, f"{label}: weight-shard gradients differ by {d_weight}"
    print(f"OK {label} max|diff| logp={d_out:.1e} grad_hidden={d_hidden:.1e} grad_weight={d_weight:.1e}",
          flush=True)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, f"expected 2 ranks, got {world}"
    try:
        check_case(rank, world, seq_len=9, batch=2, hidden_size=8, vocab=14, chunk_size=4,
                   temperature=1.0, reduce_hidden_grad=True, seed=0)
        check_case(rank, world, seq_len=13, batch=3, hidden_size=16, vocab=40, chunk_size=5,
                   temperature=0.6, reduce_hidden_grad=True, seed=1)
        check_case(rank, world, seq_len=6, batch=1, hidden_size=4, vocab=10, chunk_size=1024,
                   temperature=1.3, reduce_hidden_grad=False, seed=2)
        check_case(rank, world, seq_len=11, batch=3, hidden_size=8, vocab=18, chunk_size=4,
                   temperature="per-token", reduce_hidden_grad=True, seed=3)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
