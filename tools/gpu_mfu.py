"""Training-step MFU of a Qwen3-4B-shaped model with random weights on one GPU.

    python tools/gpu_mfu.py [--seq 4096] [--micro-batch-tokens 8192] [--steps 6] [--layers 36]

Builds the model through spade's own path (``spade.training.build_model``: Transformer Engine
spec when importable, bf16), runs full GRPO train steps (forward, chunked log-probs, policy loss,
backward, Adam) on random token sequences and reports model FLOPs utilisation against the GPU's
dense bf16 peak. FLOPs count what the step must do, not what it happens to do: 6 x the matmul
parameters per token (forward + backward), the causal attention score and value products, and
the output layer; recomputation is not credited.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--global-batch-seqs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6, help="timed steps (after 2 warm-up steps)")
    parser.add_argument("--layers", type=int, default=QWEN3_4B["num_hidden_layers"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_mfu.py needs a CUDA GPU")

    from spade.models import ParallelLayout, read_model_spec
    from spade.models.builder import BuildOptions, transformer_engine_usable
    from spade.training import (LossSettings, OptimizerSettings, TrainSample, build_model, build_optimizer,
                                init_parallel, make_micro_batches, train_step)

    built = time.perf_counter()
    config = {**QWEN3_4B, "num_hidden_layers": args.layers}
    spec = read_model_spec(config)
    layout = ParallelLayout()
    init_parallel(layout, seed=0)
    options = BuildOptions(params_dtype=torch.bfloat16)
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
