"""Training-step MFU of a Qwen3-4B-shaped model with random weights on one GPU.

    python tools/gpu_mfu.py [--seq 4096] [--micro-batch-tokens 8192] [--steps 6] [--layers 36]
                            [--recompute auto|none|selective|full] [--recompute-method uniform|block]
                            [--recompute-num-layers N] [--plan-only [--device-memory-gib G]]

Builds the model through spade's own path (``spade.training.build_model``: Transformer Engine
spec when importable, bf16), runs full GRPO train steps (forward, chunked log-probs, policy loss,
backward, Adam) on random token sequences and reports model FLOPs utilisation against the GPU's
dense bf16 peak. FLOPs count what the step must do, not what it happens to do: 6 x the matmul
parameters per token (forward + backward), the causal attention score and value products, and
the output layer; recomputation is not credited.

Without Transformer Engine, Megatron's local attention keeps ``[rows * heads, seq, seq]`` scores
for the backward pass (216 GiB for the defaults without recompute), so ``--recompute auto`` means
selective recompute there and none with TE. Before building anything the step's memory is
estimated (``spade.training.memory_plan``) and settings whose estimate exceeds the device are
refused with what to change (``--no-memory-check`` runs them anyway). ``--plan-only`` prints the
estimate and exits; it runs without a GPU when ``--device-memory-gib`` is given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

QWEN3_4B = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, hidden_size=2560,
                intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6,
                tie_word_embeddings=True, hidden_act="silu", attention_bias=False)

DENSE_BF16_PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "H800": 989.4, "A100": 312.0, "L40S": 362.1, "B200": 2250.0}


def peak_tflops(device_name: str) -> float | None:
    for key, value in DENSE_BF16_PEAK_TFLOPS.items():
        if key in device_name:
            return value
    return None


def flops_per_token(config: dict, seq: int) -> float:
    """Training FLOPs for one token of a causal sequence of length ``seq``."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    ffn = config["intermediate_size"]
    per_layer_params = h * (q + 2 * kv) + q * h + 3 * h * ffn
    matmul_params = layers * per_layer_params + h * config["vocab_size"]  # + the output layer
    attention = layers * 2 * seq * q  # QK^T and AV, causal half of 2 * 2 * seq * q
    return 3 * (2 * matmul_params + attention)


@dataclass(frozen=True)
class Plan:
    options: Any  # spade.models.builder.BuildOptions
    estimate: Any  # spade.training.memory_plan.MemoryEstimate


def memory_plan(args: argparse.Namespace) -> Plan:
    """The build options for ``args`` and their step-memory estimate; exits (status 2) with the reason
    and what to change when the estimate exceeds the device."""
    from spade.models import ParallelLayout, read_model_spec
    from spade.models.builder import BuildOptions, transformer_engine_usable
    from spade.training.memory_plan import (GIB, MemoryPlanError, MicroBatchShape, RecomputeSettings,
                                            SettingNames, check_fits, estimate_step_memory)

    te = transformer_engine_usable()
    recompute = args.recompute if args.recompute != "auto" else ("none" if te else "selective")
    if args.recompute_num_layers < 1 or args.recompute_num_layers > args.layers:
        raise SystemExit(f"--recompute-num-layers {args.recompute_num_layers}: must be between 1 and --layers "
                         f"({args.layers})")
    options = BuildOptions(params_dtype=torch.bfloat16, recompute=recompute, recompute_method=args.recompute_method,
                           recompute_num_layers=args.recompute_num_layers)
    spec = read_model_spec({**QWEN3_4B, "num_hidden_layers": args.layers})
    shape = MicroBatchShape(rows=max(1, args.micro_batch_tokens // args.seq), seq_len=args.seq)
    settings = RecomputeSettings(recompute, args.recompute_method, args.recompute_num_layers)
    estimate = estimate_step_memory(spec, ParallelLayout(), shape, settings, distributed_optimizer=True,
                                    local_attention=not te, fused_norms=True)
    if args.device_memory_gib is not None:
        device_bytes, device_name = args.device_memory_gib * GIB, None
    elif torch.cuda.is_available():
        device_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        device_name = torch.cuda.get_device_name()
    else:
        device_bytes, device_name = None, None
    print(f"memory estimate ({'TE' if te else 'local'} spec, recompute {recompute}, {shape.rows} x {shape.seq_len} "
          f"tokens per micro-batch): {estimate.describe()}", flush=True)
    if args.memory_check and device_bytes is not None:
        names = SettingNames(recompute="--recompute", recompute_method="--recompute-method",
                             recompute_num_layers="--recompute-num-layers",
                             micro_batch_tokens="--micro-batch-tokens", parallel="fewer --layers (one GPU here)",
                             skip="--no-memory-check", assign=" ")
        try:
            check_fits(estimate, device_bytes, shape, settings, names=names, device_name=device_name)
        except MemoryPlanError as exc:
            print(f"refused: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        print(f"fits in {device_bytes / GIB:.1f} GiB", flush=True)
    return Plan(options=options, estimate=estimate)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--global-batch-seqs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6, help="timed steps (after 2 warm-up steps)")
    parser.add_argument("--layers", type=int, default=QWEN3_4B["num_hidden_layers"])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--recompute", choices=("auto", "none", "selective", "full"), default="auto",
                        help="activation recompute; auto: selective without Transformer Engine, none with it")
    parser.add_argument("--recompute-method", choices=("uniform", "block"), default="uniform",
                        help="with --recompute full: every layer in groups (uniform) or the first N layers (block)")
    parser.add_argument("--recompute-num-layers", type=int, default=1,
                        help="with --recompute full: layers per group (uniform) or recomputed layers (block)")
    parser.add_argument("--no-memory-check", dest="memory_check", action="store_false",
                        help="run even when the memory estimate exceeds the device")
    parser.add_argument("--plan-only", action="store_true", help="print the memory estimate and exit")
    parser.add_argument("--device-memory-gib", type=float, default=None,
                        help="device memory for the estimate (default: the GPU's)")
    args = parser.parse_args(argv)
    plan = memory_plan(args)
    if args.plan_only:
        return
    if not torch.cuda.is_available():
        raise SystemExit("gpu_mfu.py needs a CUDA GPU (--plan-only --device-memory-gib G runs without one)")

    from spade.models import ParallelLayout, read_model_spec
    from spade.models.builder import transformer_engine_usable
    from spade.training import (LossSettings, OptimizerSettings, TrainSample, build_model, build_optimizer,
                                init_parallel, make_micro_batches, train_step)

    built = time.perf_counter()
    config = {**QWEN3_4B, "num_hidden_layers": args.layers}
    spec = read_model_spec(config)
    layout = ParallelLayout()
    init_parallel(layout, seed=0)
    options = plan.options
    model = build_model(spec, layout, options=options, use_distributed_optimizer=True)
    optimizer, scheduler = build_optimizer(model.chunks, OptimizerSettings(lr=1e-6, use_distributed_optimizer=True,
                                                                           bf16=True))
    generator = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(args.global_batch_seqs):
        ids = torch.randint(0, config["vocab_size"], (args.seq,), generator=generator)
        mask = torch.ones(args.seq - 1)
        mask[: args.seq // 4] = 0  # a prompt
        samples.append(TrainSample(ids, mask, float(torch.randn((), generator=generator)),
                                   old_logprobs=-torch.rand(args.seq - 1, generator=generator) * 4))
    batches = make_micro_batches(samples, args.micro_batch_tokens)
    settings = LossSettings()
    print(f"model, optimizer and batch built in {time.perf_counter() - built:.1f} s", flush=True)
    times = []
    for step in range(2 + args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        metrics = train_step(model.chunks, optimizer, scheduler, batches, settings)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        print(f"step {step} ({'warm-up' if step < 2 else 'timed'}): {seconds:.3f} s, loss {metrics.loss:.4f}",
              flush=True)
        if step >= 2:
            times.append(seconds)
    tokens = sum(len(s.token_ids) for s in samples)
    step_s = sorted(times)[len(times) // 2]
    achieved = flops_per_token(config, args.seq) * tokens / step_s / 1e12
    name = torch.cuda.get_device_name()
    peak = peak_tflops(name)
    report = {
        "device": name, "transformer_engine": transformer_engine_usable(), "layers": args.layers,
        "seq": args.seq, "tokens_per_step": tokens, "micro_batches": len(batches), "step_s_median": round(step_s, 4),
        "tokens_per_s": round(tokens / step_s), "achieved_tflops": round(achieved, 1),
        "peak_tflops": peak, "mfu": None if peak is None else round(achieved / peak, 4),
        "max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1), "last_loss": metrics.loss,
        "recompute": options.recompute, "recompute_method": options.recompute_method,
        "recompute_num_layers": options.recompute_num_layers, **plan.estimate.to_dict(),
    }
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>18}: {value}")
        if report["mfu"] is not None:
            print(f"{'target':>18}: MFU >= 0.40 -> {'PASS' if report['mfu'] >= 0.40 else 'FAIL'}")


if __name__ == "__main__":
    main()
