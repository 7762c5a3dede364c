"""Tool-use episodes per second through the real sandbox (open, reset, tools, 10 tool calls,
close), beside the games figure of ``benchmarks/sandbox_bench.py``.

    .venv/bin/python benchmarks/tool_bench.py --episodes 200 --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from spade.envs.sandbox.client import SandboxService
from spade.envs.sandbox.config import SandboxConfig
from spade.envs.tool_use.local import EXAMPLES_DIR

CALLS_PER_EPISODE = 10


async def episode(service: SandboxService, source: str, seed: int) -> None:
    env = await service.open(source, max_turns=25)
    try:
        await env.reset(seed=seed)
        await env.tools()
        for i in range(CALLS_PER_EPISODE):
            await env.call_tool("get_balance", {"account": "checking" if i % 2 else "savings"})
    finally:
        await env.close()


async def main(episodes: int, concurrency: int) -> dict[str, float]:
    source = (EXAMPLES_DIR / "banking.py").read_text()
    async with await SandboxService.start(SandboxConfig()) as service:
        await episode(service, source, 0)  # warm
        semaphore = asyncio.Semaphore(concurrency)

        async def bounded(i: int) -> None:
            async with semaphore:
                await episode(service, source, i)

        start = time.perf_counter()
        await asyncio.gather(*(bounded(i) for i in range(episodes)))
        elapsed = time.perf_counter() - start
    return {"episodes": episodes, "calls_per_episode": CALLS_PER_EPISODE, "concurrency": concurrency,
            "seconds": round(elapsed, 3), "episodes_per_s": round(episodes / elapsed, 1),
            "tool_calls_per_s": round(episodes * CALLS_PER_EPISODE / elapsed, 1)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.episodes, args.concurrency))))
