"""Two-turn episodes on the hf engine with and without continuous batching, side by side.

A play-like workload on the embedded model (the smoke run's engine): ``--episodes`` episodes start
at once, each a simulated environment reset of 5-50 ms (opening an environment in the sandbox), a
first turn (a ~200-token chat prompt, up to ``--max-new-tokens`` sampled tokens that may stop
early), a simulated environment step of 5-30 ms, and a second turn whose prompt is the first
turn, its reply and a new observation. With continuous batching (the engine's default) a
second turn joins the batch that is still decoding; without it, it waits for the batch to end and
starts the next. Prints the wall time and tokens/s of each pass and the ratio.

    python benchmarks/continuous_batching.py [--episodes 32] [--max-new-tokens 96]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from spade.agent.prompts import first_user_message
from spade.models.embedded import embedded_model_dir
from spade.rollout import GenerationRequest, HFEngine, SamplingParams


def opening(tokenizer, index: int) -> list[int]:
    board = " ".join(random.Random(index).choice("abcdefgh") + str(k) for k in range(12))
    text = first_user_message(f"Episode {index}. The board reads: {board}. Pick the next square.")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    return tokenizer.encode(rendered, add_special_tokens=False)


async def episode(engine: HFEngine, tokenizer, index: int, max_new: int) -> int:
    sampling = dict(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=max_new)
    prompt = opening(tokenizer, index)
    await asyncio.sleep(random.Random(-index).uniform(0.005, 0.05))  # the environment's reset
    first = await engine.generate(GenerationRequest(tuple(prompt), SamplingParams(seed=2 * index, **sampling)))
    await asyncio.sleep(random.Random(index).uniform(0.005, 0.03))  # the environment's step
    observation = tokenizer.encode("\nThe square is taken. Another one?\n")
    second_prompt = prompt + list(first.token_ids) + observation
    second = await engine.generate(GenerationRequest(tuple(second_prompt), SamplingParams(seed=2 * index + 1,
                                                                                           **sampling)))
    return len(first.token_ids) + len(second.token_ids)


def run(engine: HFEngine, episodes: int, max_new: int) -> tuple[float, int]:
    async def go():
        return await asyncio.gather(*(episode(engine, engine.tokenizer, i, max_new) for i in range(episodes)))

    started = time.perf_counter()
    tokens = sum(asyncio.run(go()))
    return time.perf_counter() - started, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    engine = HFEngine(embedded_model_dir(), max_batch_size=args.episodes)
    print(f"{args.episodes} two-turn episodes, up to {args.max_new_tokens} tokens a turn, "
          f"max_batch_size {args.episodes}")
    figures = {}
    for label, continuous in (("continuous", True), ("static", False)):
        engine.continuous_batching = continuous
        seconds, tokens = run(engine, args.episodes, args.max_new_tokens)
        figures[label] = seconds
        print(f"{label:>10}: {seconds:6.1f} s, {tokens} tokens ({tokens / seconds:5.1f} tok/s)")
    print(f"ratio static / continuous wall time: {figures['static'] / figures['continuous']:.2f}")
    engine.close()


if __name__ == "__main__":
    main()
