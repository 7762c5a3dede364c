"""Peak CPU memory of token log-probs, forward + backward: naive full logits vs chunked.

The real setting is one 32k-token sequence over Qwen3's 151,936-token vocabulary; here both are
divided by 8 (4,096 tokens, 18,992 ids, hidden 256) so it runs on a CPU in seconds, and the chunk
is divided by 8 too (1,024 -> 128), keeping every ratio the same.

Each variant runs in a fresh subprocess that builds the inputs, warms up on a tiny problem, reads
its peak resident set size (ru_maxrss), runs forward + backward and reads it again; the
difference is the extra peak memory of the computation, inputs excluded.

    python benchmarks/logprob_memory.py            # both variants, side by side
    python benchmarks/logprob_memory.py --variant chunked   # one variant, prints JSON
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SCALE = 8
SEQ_LEN = 32_768 // SCALE
VOCAB = 151_936 // SCALE
HIDDEN = 256
BATCH = 1
CHUNK = 1024 // SCALE
TARGET_RATIO = 1 / 8


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def run_variant(variant: str, seq_len: int, vocab: int, hidden_size: int, chunk: int) -> dict[str, float]:
    import torch

    from spade.rl.logprobs import logprobs_from_logits, token_logprobs

    def step(hidden, weight, targets, upstream):
        if variant == "naive":
            logits = torch.matmul(hidden.reshape(-1, hidden.shape[-1]), weight.t()).float()
            logp = logprobs_from_logits(logits, targets.t().reshape(-1)).view(hidden.shape[0], -1).t()
        else:
            logp = token_logprobs(hidden, weight, targets, chunk_size=chunk)
        (logp * upstream).sum().backward()
        return logp.detach()

    def inputs(t: int, v: int, h: int):
        gen = torch.Generator().manual_seed(0)
        hidden = (0.1 * torch.randn(t, BATCH, h, generator=gen)).requires_grad_()
        weight = (0.1 * torch.randn(v, h, generator=gen)).requires_grad_()
        targets = torch.randint(0, v, (BATCH, t), generator=gen)
        upstream = torch.randn(BATCH, t, generator=gen)
        return hidden, weight, targets, upstream

    step(*inputs(64, 512, hidden_size))  # warm up kernels and thread pools outside the measurement
    args = inputs(seq_len, vocab, hidden_size)
    # Gradient buffers are part of either variant's result; count them as inputs.
    args[0].grad = torch.zeros_like(args[0])
    args[1].grad = torch.zeros_like(args[1])
    before = peak_rss_mib()
    start = time.perf_counter()
    logp = step(*args)
    seconds = time.perf_counter() - start
    after = peak_rss_mib()
    return {
        "peak_mib": after - before,
        "seconds": seconds,
        "logp_sum": float(logp.double().sum()),
        "grad_hidden_norm": float(args[0].grad.double().norm()),
        "grad_weight_norm": float(args[1].grad.double().norm()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=("naive", "chunked"))
    parser.add_argument("--seq-len", type=int, default=SEQ_LEN)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--hidden", type=int, default=HIDDEN)
    parser.add_argument("--chunk", type=int, default=CHUNK)
    args = parser.parse_args()
    sizes = ["--seq-len", str(args.seq_len), "--vocab", str(args.vocab), "--hidden", str(args.hidden),
             "--chunk", str(args.chunk)]
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.seq_len, args.vocab, args.hidden, args.chunk)))
        return 0

    print("command:", shlex.join([sys.executable, *sys.argv]))
    tokens = BATCH * args.seq_len
    full_logits_mib = tokens * args.vocab * 4 / 2**20
    print(f"sizes: tokens={tokens} (batch {BATCH} x seq {args.seq_len}), vocab={args.vocab}, hidden={args.hidden}, "
          f"chunk={args.chunk}, fp32; one full fp32 logits tensor = {full_logits_mib:.1f} MiB")
    print("(32k x 151,936 scaled down by 8 on both axes; each variant in a fresh process, peak RSS minus inputs)")
    results = {}
    for variant in ("naive", "chunked"):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--variant", variant, *sizes]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            print(f"{variant} failed:\n{done.stdout}{done.stderr}")
            return 1
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    naive, chunked = results["naive"], results["chunked"]
    print(f"{'':10}{'peak MiB':>12}{'seconds':>10}{'sum logp':>18}{'|grad h|':>14}{'|grad W|':>14}")
    for name, r in results.items():
        print(f"{name:10}{r['peak_mib']:12.1f}{r['seconds']:10.2f}{r['logp_sum']:18.6f}"
              f"{r['grad_hidden_norm']:14.6f}{r['grad_weight_norm']:14.6f}")
    same = all(abs(naive[k] - chunked[k]) <= 1e-3 * max(1.0, abs(naive[k]))
               for k in ("logp_sum", "grad_hidden_norm", "grad_weight_norm"))
    ratio = chunked["peak_mib"] / naive["peak_mib"]
    passed = ratio <= TARGET_RATIO and same
    print(f"ratio chunked/naive = {ratio:.3f} (target <= {TARGET_RATIO:.3f}); results agree: {same}")
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
