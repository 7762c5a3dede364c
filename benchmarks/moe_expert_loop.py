"""Host time of megatron-core's SequentialMLP expert loop (the experts without grouped GEMM).

Without Transformer Engine (and without the ``grouped_gemm`` CUDA extension that megatron-core
0.16.1's legacy ``GroupedMLP`` needs) spade's MoE layers run ``SequentialMLP``: one Python
iteration per local expert, each a few matmuls. On a GPU those launches are asynchronous, so the
loop costs time only where the host takes longer to issue an expert than the GPU takes to run it.
This measures the host side on the CPU: forward + backward of one layer's local experts with a
tiny hidden size (compute negligible) for E experts against one expert holding all the rows, so
``(t_E - t_1) / (E - 1)`` is the host time one more expert iteration adds.

    .venv/bin/python benchmarks/moe_expert_loop.py [--experts 16] [--rows 2048] [--repeats 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def experts(num_local: int, hidden: int, ffn: int):
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import SequentialMLP

    config = TransformerConfig(
        num_layers=1, hidden_size=hidden, ffn_hidden_size=ffn, moe_ffn_hidden_size=ffn,
        num_attention_heads=4, num_moe_experts=num_local, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, bias_activation_fusion=False, gradient_accumulation_fusion=False,
        use_cpu_initialization=True)
    submodules = MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
    return SequentialMLP(num_local, config, submodules, pg_collection=ProcessGroupCollection.use_mpu_process_groups())


def seconds_per_pass(module, rows: int, hidden: int, repeats: int) -> float:
    num_local = module.num_local_experts
    split = torch.full((num_local,), rows // num_local, dtype=torch.long)
    x = torch.randn(int(split.sum()), hidden, requires_grad=True)
    probs = torch.rand(int(split.sum()))
    times = []
    for i in range(repeats + 3):
        start = time.perf_counter()
        out, _ = module(x, split, probs)
        out.sum().backward()
        if i >= 3:  # warm-up
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=16, help="local experts (30B-A3B under EP8: 16)")
    parser.add_argument("--rows", type=int, default=2048, help="token rows routed to this rank's experts")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--ffn", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()

    from spade.training.parallel import init_parallel

    init_parallel(seed=1)
    torch.set_num_threads(1)
    one = seconds_per_pass(experts(1, args.hidden, args.ffn), args.rows, args.hidden, args.repeats)
    many = seconds_per_pass(experts(args.experts, args.hidden, args.ffn), args.rows, args.hidden, args.repeats)
    per_expert = (many - one) / (args.experts - 1)
    print(f"forward+backward, {args.rows} rows, hidden {args.hidden}, ffn {args.ffn}: "
          f"1 expert {one * 1e3:.2f} ms, {args.experts} experts {many * 1e3:.2f} ms, "
          f"{per_expert * 1e6:.0f} us per extra expert iteration")


if __name__ == "__main__":
    main()
