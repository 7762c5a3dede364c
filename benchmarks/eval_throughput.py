"""Output tokens/s of `spade eval`'s runner against the engine's own batched generation, side by side.

    python benchmarks/eval_throughput.py --model embedded --prompts 16 --concurrency 8 --max-new-tokens 32
    python benchmarks/eval_throughput.py --model DIR --engine sglang --sglang-url URL --prompts 512 --concurrency 64

Both passes send the same prompts (Reasoning-Gym hard questions, chat-templated), the same sampling
settings and the same per-sample seeds, with ``--concurrency`` requests in flight:

* ``engine``: ``asyncio.gather`` of ``engine.generate`` on pre-tokenised prompts, nothing else;
* ``spade eval``: ``run_benchmark`` (chat rendering, the concurrency bound, decoding, extraction,
  the package's scorer, a results file appended per item) over the same items.

The engine is warmed up once first. Output tokens/s = generated tokens / wall time of the pass; the
printed ratio ``spade eval / engine`` is the figure (target 0.95 or more). ``--json`` adds one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spade.eval.reasoning_gym_bench import ReasoningGymHard  # noqa: E402
from spade.eval.runner import ChatModel, run_benchmark, sample_seed  # noqa: E402
from spade.eval.types import SamplingSettings  # noqa: E402
from spade.rollout.engine import GenerationRequest, SamplingParams  # noqa: E402
from spade.run.engines import engine_settings, open_engine, resolve_model  # noqa: E402


async def main(args: argparse.Namespace) -> dict:
    loaded = await open_engine(resolve_model(args.model), engine_settings(
        engine=args.engine, sglang_urls=args.sglang_url, max_batch_size=args.concurrency))
    sampling = SamplingSettings(n=1, temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=args.max_new_tokens)
    bench = ReasoningGymHard("math", episodes=max(1, -(-args.prompts // 31)), sampling=sampling)
    items = bench.load(seed=0)[: args.prompts]
    bench.load = lambda seed, limit=None: items  # the same items in both passes
    chat = ChatModel(loaded.engine, loaded.tokenizer, concurrency=args.concurrency,
                     max_context_tokens=loaded.max_context_tokens)
    prompts = [chat.render(item.messages) for item in items]
    seeds = [sample_seed(0, bench.name, item.item_id, 0) for item in items]
    limit = asyncio.Semaphore(args.concurrency)

    async def direct(prompt, seed):
        params = SamplingParams(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=args.max_new_tokens, seed=seed)
        async with limit:
            return await loaded.engine.generate(GenerationRequest(tuple(prompt), params))

    await asyncio.gather(*(direct(p, s) for p, s in zip(prompts[:args.concurrency], seeds)))  # warm-up
    start = time.perf_counter()
    results = await asyncio.gather(*(direct(p, s) for p, s in zip(prompts, seeds)))
    engine_s = time.perf_counter() - start
    engine_tokens = sum(len(r.token_ids) for r in results)
    with tempfile.TemporaryDirectory() as out:
        chat.generated_tokens = 0
        start = time.perf_counter()
        await run_benchmark(bench, chat, seed=0, out_dir=Path(out))
        eval_s = time.perf_counter() - start
    eval_tokens = chat.generated_tokens
    loaded.engine.close()
    figures = {"prompts": len(items), "concurrency": args.concurrency, "max_new_tokens": args.max_new_tokens,
               "engine_tok_s": engine_tokens / engine_s, "eval_tok_s": eval_tokens / eval_s,
               "engine_tokens": engine_tokens, "eval_tokens": eval_tokens}
    figures["ratio"] = figures["eval_tok_s"] / figures["engine_tok_s"]
    return figures


def cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--engine", choices=("hf", "sglang"), default="hf")
    parser.add_argument("--sglang-url", nargs="+", default=[])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(main(args))
    print(f"{'pass':<12}{'tokens':>8}{'tok/s':>10}")
    print(f"{'engine':<12}{figures['engine_tokens']:>8}{figures['engine_tok_s']:>10.1f}")
    print(f"{'spade eval':<12}{figures['eval_tokens']:>8}{figures['eval_tok_s']:>10.1f}")
    print(f"ratio spade eval / engine: {figures['ratio']:.3f}")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(cli())
