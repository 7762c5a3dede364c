"""Rollout shards side by side: one, two and four shards in one torchrun world (issue 26).

    python benchmarks/rollout_shards.py [--quick] [--shards 1,2,4] [--json [PATH]]

What runs. The driver launches ``torchrun --standalone --nproc_per_node 4`` on this file's worker
(gloo, CPU). In that one world every rank starts its own sandbox service (bubblewrap by default)
and its own engine, then each shard count runs in turn on the same processes: with ``S`` shards
the shards are ranks ``0, 4/S, ...`` (``selfplay.rollout_shards``'s placement: one per node, here
four "nodes" of one process), rank 0 splits each step's requests over them with
:class:`~spade.selfplay.plays.rollout_shards.ShardedPlayer` and the others serve with
:class:`~spade.selfplay.plays.rollout_shards.ShardServer`: the real players, sandbox, token-exact
conversations and the gloo messages a training run uses.

What is simulated. Only the model: benchmarks/rollout_schedule.py's :class:`SimulatedEngine`
(a reply of a log-normal length per episode, held for length x latency, valid non-final game
actions so episodes run to the turn budget). Its output depends only on the request, so every
shard count must produce the same plays (checked: a digest of every play's env, index, return and
tokens). A shard's capacity is ``--max-concurrent-episodes`` episodes at a time (the setting is per
shard: one node's servers), so the workload is latency-bound and more shards play more at once.

Measured per shard count, over ``--steps`` steps of ``--envs x --group`` no-hint plays: the step's
rollout wall time (rank 0's ``play_all`` until every shard's plays are merged), rank 0's CPU
seconds in it (process time: its own block's orchestration plus sending, receiving and merging),
and each ratio over one shard. Targets (issue 26): wall >= 1.8x faster at 2 shards and >= 3x at 4;
rank 0's CPU about 1/shards.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

WORLD = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 step, shorter latency (the test's setting)")
    p.add_argument("--shards", default="1,2,4", help="shard counts to run, each a divisor of 4")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--envs", type=int, default=8, help="environments per step")
    p.add_argument("--group", type=int, default=8, help="no-hint plays per environment")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-concurrent-episodes", type=int, default=4, help="per shard")
    p.add_argument("--median-tokens", type=float, default=200.0)
    p.add_argument("--sigma", type=float, default=0.5)
    p.add_argument("--cap", type=int, default=1000)
    p.add_argument("--token-latency-ms", type=float, default=1.0)
    p.add_argument("--isolation", default=os.environ.get("SPADE_SANDBOX_ISOLATION", "bubblewrap"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole torchrun launch")
    p.add_argument("--json", nargs="?", const="-", default=None, help="write the figures as JSON (to PATH or stdout)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # the JSON path rank 0 writes
    args = p.parse_args(argv)
    if args.quick:
        args.steps = 1
        args.token_latency_ms = min(args.token_latency_ms, 0.75)
    args.shard_counts = [int(s) for s in args.shards.split(",")]
    for count in args.shard_counts:
        if count < 1 or WORLD % count:
            p.error(f"--shards: {count} does not divide the world of {WORLD}")
    return args


# --------------------------------------------------------------------------- the worker (every rank)


def env_specs(count: int, max_turns: int) -> list[Any]:
    from benchmarks.step_overhead import ENV_FILES, EXAMPLE_ENVS
    from spade.selfplay.sources.designer_source import EnvSpec

    specs = []
    for i in range(count):
        name = ENV_FILES[i % len(ENV_FILES)]
        source = (EXAMPLE_ENVS / name).read_text()
        found = re.search(r"^class (\w+)", source, re.MULTILINE)
        specs.append(EnvSpec(f"g{i:03d}_{Path(name).stem}", i, "benchmark", source, "", found.group(1) if found
                             else "", max_turns, 0))
    return specs


def play_digest(plays: list[Any]) -> str:
    """One hash of every play's identity, return, turns and tokens, in order."""
    h = hashlib.sha256()
    for play in plays:
        tokens = () if play.trajectory is None else (play.trajectory.token_ids, play.trajectory.loss_mask)
        h.update(repr((play.env_id, play.hinted, play.index, play.seed, round(play.episode_return, 9), play.turns,
                       play.end_reason, tokens)).encode())
    return h.hexdigest()


async def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from benchmarks.rollout_schedule import SimulatedEngine
    from benchmarks.step_overhead import load_tokenizer
    from spade.envs.sandbox.client import SandboxService
    from spade.envs.sandbox.config import SandboxConfig
    from spade.selfplay.plays.player import Player
    from spade.selfplay.plays.rollout_shards import (ShardChannel, ShardLayout, ShardServer, ShardedPlayer,
                                                     shard_player)
    from spade.selfplay.settings import PlayRules, SamplingSettings, SelfPlaySettings

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tokenizer, tokenizer_name = load_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    settings = SelfPlaySettings(envs_per_set=args.envs, g_nohint=args.group, g_hint=0, max_turns=args.max_turns,
                                sampling=SamplingSettings().replace(agent={"max_tokens": args.cap + 64}),
                                max_context_tokens=args.max_turns * (args.cap + 64) + 4096,
                                plays=PlayRules(max_concurrent=args.max_concurrent_episodes), use_memory=False,
                                use_corpus=False, train_designer=False)
    service = await SandboxService.start(SandboxConfig(isolation=args.isolation))
    engine = SimulatedEngine(tokenizer, eos_id=eos, median=args.median_tokens, sigma=args.sigma, cap=args.cap,
                             token_latency_s=args.token_latency_ms / 1000.0)
    envs = env_specs(args.envs, args.max_turns)
    results = []
    try:
        for count in args.shard_counts:
            layout = ShardLayout.of(count, world)
            channel = ShardChannel.create(layout, rank)
            common = dict(sandbox=service, engine=engine, tokenizer=tokenizer, seed=args.seed)
            if rank == 0:
                base = shard_player(settings, **common)
                player = base if count == 1 else ShardedPlayer(
                    settings, channel=channel, chat_format=base.chat_format, stop_token_ids=base.stop_token_ids,
                    **common)
                figures: dict[str, Any] = {"shards": count, "wall_s": [], "cpu_s": [], "plays": [], "digests": []}
                for step in range(args.steps):
                    requests = player.requests(envs, with_hint=False)
                    started, cpu = time.perf_counter(), time.process_time()
                    plays = await player.play_all(step, requests)
                    figures["wall_s"].append(time.perf_counter() - started)
                    figures["cpu_s"].append(time.process_time() - cpu)
                    if count > 1:
                        channel.end_step()
                    figures["plays"].append(len(plays))
                    figures["digests"].append(play_digest(plays))
                    if count > 1:  # the plays each shard played (rank 0's step metrics)
                        figures.setdefault("shard_metrics", []).append(player.step_metrics())
                results.append(figures)
            elif channel.shard:
                server = ShardServer(shard_player(settings, **common), channel)
                for _ in range(args.steps):
                    await server.serve_step()
            dist.barrier()
    finally:
        await service.close()
    if rank == 0:
        Path(args.worker).write_text(json.dumps({"results": results, "tokenizer": tokenizer_name,
                                                 "isolation": args.isolation}))
    dist.destroy_process_group()


# --------------------------------------------------------------------------- the driver


def launch(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    forwarded = [f"--shards={args.shards}", f"--steps={args.steps}", f"--envs={args.envs}", f"--group={args.group}",
                 f"--max-turns={args.max_turns}", f"--max-concurrent-episodes={args.max_concurrent_episodes}",
                 f"--median-tokens={args.median_tokens}", f"--sigma={args.sigma}", f"--cap={args.cap}",
                 f"--token-latency-ms={args.token_latency_ms}", f"--isolation={args.isolation}", f"--seed={args.seed}"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
               str(Path(__file__).resolve()), *forwarded, "--worker", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}"
           f"{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(command, env=env, timeout=args.timeout, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"torchrun failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}")
    return json.loads(out.read_text())


def summarise(data: dict[str, Any]) -> dict[str, Any]:
    rows = data["results"]
    base = rows[0]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    out = []
    for row in rows:
        out.append({"shards": row["shards"], "wall_s": mean(row["wall_s"]), "cpu_s": mean(row["cpu_s"]),
                    "plays": row["plays"], "speedup": mean(base["wall_s"]) / mean(row["wall_s"]),
                    "cpu_ratio": mean(row["cpu_s"]) / mean(base["cpu_s"]),
                    "same_plays": row["digests"] == base["digests"],
                    "shard_metrics": row.get("shard_metrics", [])})
    return {"rows": out, "tokenizer": data["tokenizer"], "isolation": data["isolation"]}


def report(args: argparse.Namespace, summary: dict[str, Any]) -> str:
    lines = [f"rollout shards: {args.envs} envs x {args.group} plays, {args.max_turns} turns, "
             f"{args.max_concurrent_episodes} episodes at a time per shard, replies log-normal(median "
             f"{args.median_tokens:g}, sigma {args.sigma:g}, cap {args.cap}) x {args.token_latency_ms:g} ms/token; "
             f"{args.steps} step(s); world of {WORLD} on {os.cpu_count()} cores ({platform.processor() or 'cpu'}), "
             f"sandbox {summary['isolation']}",
             f"{'shards':>6} {'wall s/step':>12} {'speedup':>8} {'rank-0 CPU s':>13} {'CPU ratio':>10} {'same plays':>11}"]
    for row in summary["rows"]:
        lines.append(f"{row['shards']:>6} {row['wall_s']:>12.2f} {row['speedup']:>7.2f}x {row['cpu_s']:>13.3f} "
                     f"{row['cpu_ratio']:>10.2f} {str(row['same_plays']):>11}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        asyncio.run(worker(args))
        return 0
    with tempfile.TemporaryDirectory(prefix="spade-rollout-shards-") as tmp:
        summary = summarise(launch(args, Path(tmp) / "figures.json"))
    print(report(args, summary))
    if args.json == "-":
        print(json.dumps(summary, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
