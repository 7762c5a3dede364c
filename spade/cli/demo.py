"""``spade demo``: the sandbox part of the main job (``make demo`` runs it, then ``spade train``).

Admits every example environment through the sandbox, then plays each in the sandbox twice over:
through the episode runner with a seeded random policy that picks among the ``\\boxed{...}``
actions named in the rules, and with the scripted reference solver of ``examples/solvers.py``.
It shows the whole runtime path (isolation self-test, admission stages, multi-turn play, the
return rule) on any machine, in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from ..agent.actions import boxed_contents
from ..envs.admission import admit
from ..envs.protocol import episode_return
from ..envs.runner import Message, Policy, play_episode
from ..envs.sandbox.client import SandboxedEnv, SandboxService
from .common import read_text, require_config_file, sandbox_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "envs"
SOLVERS = EXAMPLES.parent / "solvers.py"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    demo = subparsers.add_parser("demo", help="admit and play the example environments in the sandbox")
    demo.add_argument("paths", nargs="*", metavar="PATH", help="environments (default: examples/envs/*.py)")
    demo.add_argument("--episodes", type=int, default=3, help="episodes per environment")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--config", metavar="FILE", help="YAML file whose 'sandbox:' section sets the limits")
    demo.add_argument("--isolation", choices=("bubblewrap", "unsafe-local"))
    demo.set_defaults(handler=run_demo)


def random_rules_policy(seed: int) -> Policy:
    """Chooses uniformly among the boxed actions quoted in the opening message."""
    rng = random.Random(seed)

    async def policy(messages: list[Message]) -> str:
        opening = next(m.content for m in messages if m.role == "user")
        choices = [c for c in boxed_contents(opening) if c and c != "..."] or ["look"]
        return f"I will try this.\n\\boxed{{{rng.choice(choices)}}}"

    return policy


class BlockingEnv:
    """A synchronous face for a sandboxed environment, so a scripted solver can drive it from a thread."""

    def __init__(self, env: SandboxedEnv, loop: asyncio.AbstractEventLoop):
        self.env, self.loop = env, loop

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        result = asyncio.run_coroutine_threadsafe(self.env.reset(seed=seed), self.loop).result()
        return result.observation, result.info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return asyncio.run_coroutine_threadsafe(self.env.step(action), self.loop).result().as_tuple()


def load_solvers() -> dict[str, Any]:
    if not SOLVERS.exists():
        return {}
    spec = importlib.util.spec_from_file_location("example_solvers", SOLVERS)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.SOLVERS)


async def solver_return(service: SandboxService, source: str, solver: Any, seed: int) -> float:
    env = await service.open(source)
    try:
        transcript = await asyncio.to_thread(solver, BlockingEnv(env, asyncio.get_running_loop()), seed)
    finally:
        await env.close()
    return episode_return([step[2] for step in transcript], bool(transcript) and transcript[-1][3])


def run_demo(args: argparse.Namespace) -> int:
    require_config_file(args.config)
    paths = [Path(p) for p in args.paths] or sorted(EXAMPLES.glob("*.py"))
    return asyncio.run(_demo(args, paths))


async def _demo(args: argparse.Namespace, paths: list[Path]) -> int:
    started = time.perf_counter()
    async with await SandboxService.start(sandbox_config(args)) as service:
        layers = ", ".join(name for name, ok in service.report.layers.items() if ok)
        print(f"sandbox ready ({service.config.isolation}): {layers}\n")
        print(f"{'environment':<22} {'class':<22} {'admission':<14} {'episodes':>8} {'mean turns':>10} "
              f"{'random return':>13} {'solver return':>13}")
        solvers = load_solvers()
        rejected = 0
        for path in paths:
            verdict = await admit(service, read_text(str(path)))
            if not verdict.admitted:
                rejected += 1
                error = verdict.error
                assert error is not None
                print(f"{path.stem:<22} {'-':<22} {'rejected':<14} {error.stage.value}: {error.kind.value}")
                continue
            admission = f"{sum(verdict.timings_ms.values()):.0f} ms"
            source = read_text(str(path))
            episodes = []
            for index in range(args.episodes):
                env = await service.open(source)
                try:
                    episodes.append(await play_episode(env, random_rules_policy(args.seed + index),
                                                       seed=args.seed + index))
                finally:
                    await env.close()
            turns = sum(len(e.turns) for e in episodes) / len(episodes)
            mean_return = sum(e.episode_return for e in episodes) / len(episodes)
            solved = "-"
            if path.stem in solvers:
                returns = [await solver_return(service, source, solvers[path.stem], args.seed + index)
                           for index in range(args.episodes)]
                solved = f"{sum(returns) / len(returns):.2f}"
            print(f"{path.stem:<22} {verdict.class_name or '':<22} {admission:<14} {len(episodes):>8} "
                  f"{turns:>10.1f} {mean_return:>13.2f} {solved:>13}")
    print(f"\n{len(paths) - rejected}/{len(paths)} environments admitted; "
          f"finished in {time.perf_counter() - started:.1f} s")
    return 1 if rejected else 0
