"""Throughput and latency of the environment sandbox, next to the baselines it is judged against.

    python benchmarks/sandbox_bench.py [--episodes N] [--concurrency C] [--rounds R] [--json]

One run measures, side by side:

1. sandbox episodes/s: a 10-step counting environment opened fresh per episode (open, reset,
   10 steps, close) through the real :class:`SandboxService`, at concurrency C and at 1;
2. instantiation latency: ``service.open(source)`` alone, sequentially (no other load), and
   under the concurrency-C load of (1);
3. the in-process ``exec`` floor (no isolation at all);
4. fork-per-episode from a 4 GiB parent and from a small parent (in a separate, spawned process
   so the 4 GiB is freed afterwards);
5. the sandbox again while the calling process (the one that owns the service) holds 4 GiB.

Sections 1, 2 and 5 run in R rounds that alternate the small and the 4 GiB caller, each round on a
fresh service; the figures pool the rounds and the 4 GiB ratio is the median of the paired rounds.

It ends with a targets block (PASS/FAIL). See /work/shared/notes/sandbox.md for earlier figures.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from spade.envs.sandbox.client import SandboxService  # noqa: E402
from spade.envs.sandbox.config import SandboxConfig  # noqa: E402

STEPS = 10
BIG_PARENT_BYTES = 4 << 30
PAGE = 4096
INSTANTIATION_SAMPLES = 300
WARMUP_EPISODES = 16
FORK_TIME_CAP_S = 20.0
FORK_BIG_MAX_EPISODES = 100
FORK_SMALL_MAX_EPISODES = 300

TARGET_EPISODES_PER_S = 150.0
TARGET_OPEN_P50_MS = 10.0
TARGET_BIG_CALLER_RATIO = 0.9

ENV_SOURCE = '''
class CountingEnv:
    """Counts the steps; ends after max_turns of them."""

    def __init__(self, max_turns=10):
        self.max_turns = max_turns
        self.count = 0

    def reset(self, seed=None):
        self.count = 0
        return "count: 0", {"seed": seed}

    def step(self, action):
        self.count += 1
        done = self.count >= self.max_turns
        return f"count: {self.count} ({action})", 1.0, done, False, {}
'''


# -- results ------------------------------------------------------------------------------------


@dataclass
class Latency:
    samples: int
    p50_ms: float
    p95_ms: float

    @classmethod
    def of(cls, seconds: list[float]) -> "Latency":
        return cls(len(seconds), percentile(seconds, 50) * 1e3, percentile(seconds, 95) * 1e3)


@dataclass
class EpisodeRun:
    """Episodes played one way; ``latency`` is per episode unless the section says otherwise."""

    label: str
    episodes: int
    seconds: float
    concurrency: int = 1
    latency: Latency | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    samples: list[float] = field(default_factory=list, repr=False)  # what ``latency`` summarises

    @property
    def per_s(self) -> float:
        return self.episodes / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["samples"]
        return {**data, "episodes_per_s": self.per_s}

    @classmethod
    def timed(cls, label: str, episodes: int, seconds: float, concurrency: int, samples: list[float],
              **extra: Any) -> "EpisodeRun":
        return cls(label, episodes, seconds, concurrency, Latency.of(samples), dict(extra), list(samples))


def pooled(label: str, runs: list[EpisodeRun]) -> EpisodeRun:
    """Several rounds of one measurement as one: total episodes over total time, latencies pooled."""
    samples = [value for run in runs for value in run.samples]
    return EpisodeRun.timed(label, sum(r.episodes for r in runs), sum(r.seconds for r in runs),
                            runs[0].concurrency, samples, rounds=len(runs),
                            round_per_s=[round(r.per_s, 1) for r in runs])


def percentile(values: list[float], pct: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


# -- 1, 2, 5: through the sandbox service -------------------------------------------------------


async def play_sandboxed(service: SandboxService, seed: int) -> float:
    """One episode; returns how long ``open`` took."""
    started = time.perf_counter()
    env = await service.open(ENV_SOURCE, max_turns=STEPS)
    opened = time.perf_counter() - started
    try:
        await env.reset(seed=seed)
        for turn in range(STEPS):
            result = await env.step(f"\\boxed{{{turn}}}")
        assert result.terminated, "the counting env should end after its last step"
    finally:
        await env.close()
    return opened


async def sandbox_episodes(service: SandboxService, episodes: int, concurrency: int, label: str) -> EpisodeRun:
    """Episodes/s at a given concurrency; ``latency`` is that of ``open`` under this load."""
    gate = asyncio.Semaphore(concurrency)

    async def one(seed: int) -> float:
        async with gate:
            return await play_sandboxed(service, seed)

    await asyncio.gather(*(one(-1 - i) for i in range(WARMUP_EPISODES)))
    started = time.perf_counter()
    opens = await asyncio.gather(*(one(i) for i in range(episodes)))
    return EpisodeRun.timed(label, episodes, time.perf_counter() - started, concurrency, list(opens))


async def sequential_instantiation(service: SandboxService, samples: int, label: str) -> EpisodeRun:
    """``service.open`` alone, one at a time; close is not timed."""
    for _ in range(WARMUP_EPISODES // 4):
        await (await service.open(ENV_SOURCE)).close()
    times: list[float] = []
    started = time.perf_counter()
    for _ in range(samples):
        t0 = time.perf_counter()
        env = await service.open(ENV_SOURCE, max_turns=STEPS)
        times.append(time.perf_counter() - t0)
        await env.close()
    return EpisodeRun.timed(label, samples, time.perf_counter() - started, 1, times)


@dataclass
class SandboxRound:
    """One fresh service: episodes at C (and at 1), sequential opens, and how it started."""

    concurrent: EpisodeRun
    open_seq: EpisodeRun
    c1: EpisodeRun | None
    service_start_s: float
    isolation: list[str]
    caller_rss_mib: float


async def sandbox_round(episodes: int, concurrency: int, *, with_c1: bool) -> SandboxRound:
    t0 = time.perf_counter()
    service = await SandboxService.start(SandboxConfig())
    start_s = time.perf_counter() - t0
    try:
        concurrent = await sandbox_episodes(service, episodes, concurrency, "concurrent")
        c1 = await sandbox_episodes(service, episodes, 1, "c1") if with_c1 else None
        open_seq = await sequential_instantiation(service, INSTANTIATION_SAMPLES, "open_seq")
        isolation = [name for name, ok in service.report.layers.items() if ok]
    finally:
        await service.close()
    return SandboxRound(concurrent, open_seq, c1, start_s, isolation, vm_rss_bytes() / 2**20)


def caller_comparison(episodes: int, concurrency: int, rounds: int,
                      progress: Any) -> tuple[list[SandboxRound], list[SandboxRound]]:
    """Sections 1, 2 and 5: alternate a small caller and a 4 GiB caller, ``rounds`` times each.

    Alternating pairs the two under the same background conditions; on a small shared VM a single
    run of either moves by 20-30 % from one minute to the next. The 4 GiB is allocated and touched
    in this process before its fresh service starts, and freed after each round.
    """
    small: list[SandboxRound] = []
    big: list[SandboxRound] = []
    for index in range(rounds):
        progress(f"  round {index + 1}/{rounds}: small caller")
        small.append(asyncio.run(sandbox_round(episodes, concurrency, with_c1=index == 0)))
        progress(f"  round {index + 1}/{rounds}: 4 GiB caller")
        ballast = hold_touched(BIG_PARENT_BYTES)
        try:
            big.append(asyncio.run(sandbox_round(episodes, concurrency, with_c1=False)))
        finally:
            del ballast
    return small, big


# -- 3: in-process exec floor -------------------------------------------------------------------


def play_in_process(seed: int) -> float:
    namespace: dict[str, Any] = {"__name__": "environment"}
    exec(ENV_SOURCE, namespace)
    env = namespace["CountingEnv"](max_turns=STEPS)
    env.reset(seed=seed)
    total = 0.0
    for turn in range(STEPS):
        _, reward, terminated, _, _ = env.step(f"\\boxed{{{turn}}}")
        total += reward
    assert terminated
    return total


def exec_floor(episodes: int) -> EpisodeRun:
    times: list[float] = []
    started = time.perf_counter()
    for seed in range(episodes):
        t0 = time.perf_counter()
        play_in_process(seed)
        times.append(time.perf_counter() - t0)
    return EpisodeRun.timed("exec floor (no isolation)", episodes, time.perf_counter() - started, 1, times)


# -- 4: fork per episode (runs in a spawned process) -------------------------------------------


def vm_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def hold_touched(nbytes: int) -> bytearray:
    """``nbytes`` of memory with every page really resident (one write per page)."""
    buffer = bytearray(nbytes)
    buffer[::PAGE] = b"\x01" * len(range(0, nbytes, PAGE))
    return buffer


def fork_episodes(hold_bytes: int, max_episodes: int, time_cap_s: float) -> dict[str, Any]:
    """Fork one child per episode; the child execs the env, plays it, reports through a pipe."""
    t0 = time.perf_counter()
    ballast = hold_touched(hold_bytes) if hold_bytes else bytearray()
    touch_s = time.perf_counter() - t0
    rss = vm_rss_bytes()
    fork_calls: list[float] = []
    episodes: list[float] = []
    started = time.perf_counter()
    while len(episodes) < max_episodes and time.perf_counter() - started < time_cap_s:
        read_end, write_end = os.pipe()
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(read_end)
                total = play_in_process(len(episodes))
                os.write(write_end, f"{total}\n".encode())
                code = 0
            finally:
                os._exit(code)
        t1 = time.perf_counter()
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            reply = pipe.read()
        _, status = os.waitpid(pid, 0)
        episodes.append(time.perf_counter() - t0)
        fork_calls.append(t1 - t0)
        if os.waitstatus_to_exitcode(status) != 0 or float(reply) != STEPS:
            raise RuntimeError(f"fork child failed: status {status}, reply {reply!r}")
    elapsed = time.perf_counter() - started
    del ballast
    return {"episodes": len(episodes), "seconds": elapsed, "rss_bytes": rss, "touch_s": touch_s,
            "episode_s": episodes, "fork_call_s": fork_calls,
            "capped_by_time": len(episodes) < max_episodes}


def fork_run(label: str, hold_bytes: int, max_episodes: int) -> EpisodeRun:
    """``fork_episodes`` in a fresh spawned process, so its memory goes away with it."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        raw = pool.submit(fork_episodes, hold_bytes, max_episodes, FORK_TIME_CAP_S).result()
    fork_call = Latency.of(raw["fork_call_s"])
    return EpisodeRun.timed(label, raw["episodes"], raw["seconds"], 1, raw["episode_s"],
                            parent_rss_mib=raw["rss_bytes"] / 2**20, touch_s=raw["touch_s"],
                            fork_call_p50_ms=fork_call.p50_ms, fork_call_p95_ms=fork_call.p95_ms,
                            capped_by_time=raw["capped_by_time"])


# -- machine and report --------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    model = "?"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"nproc": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(), "cpu_model": model,
            "kernel": platform.release(), "python": platform.python_version(),
            "memory_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def build_report(args: argparse.Namespace, small: list[SandboxRound], big: list[SandboxRound],
                 floor: EpisodeRun, fork_big: EpisodeRun, fork_small: EpisodeRun, wall_s: float) -> dict[str, Any]:
    c = args.concurrency
    sandbox = pooled(f"sandbox c={c}", [r.concurrent for r in small])
    c1 = small[0].c1
    assert c1 is not None
    c1.label = "sandbox c=1"
    open_seq = pooled("open sequential", [r.open_seq for r in small])
    big_run = pooled(f"sandbox 4GiB caller c={c}", [r.concurrent for r in big])
    big_open = pooled("open 4GiB caller sequential", [r.open_seq for r in big])
    assert open_seq.latency is not None and big_open.latency is not None
    # paired per round, then the median: robust to one round landing in a noisy minute
    eps_ratios = [b.concurrent.per_s / s.concurrent.per_s for s, b in zip(small, big)]
    open_ratios = [b.open_seq.latency.p50_ms / s.open_seq.latency.p50_ms  # type: ignore[union-attr]
                   for s, b in zip(small, big)]
    eps_ratio = statistics.median(eps_ratios)
    ratios = {
        "big_caller_episodes": eps_ratio,
        "big_caller_episodes_per_round": [round(x, 3) for x in eps_ratios],
        "big_caller_episodes_pooled": big_run.per_s / sandbox.per_s,
        "big_caller_open_p50": statistics.median(open_ratios),
        "big_caller_open_p50_per_round": [round(x, 3) for x in open_ratios],
        "sandbox_over_exec_floor": sandbox.per_s / floor.per_s,
        "sandbox_over_fork_4gib": sandbox.per_s / fork_big.per_s if fork_big.per_s else float("nan"),
        "sandbox_over_fork_small": sandbox.per_s / fork_small.per_s,
    }
    targets = {
        "episodes_per_s": {"value": sandbox.per_s, "target": f">= {TARGET_EPISODES_PER_S:g}",
                           "pass": sandbox.per_s >= TARGET_EPISODES_PER_S},
        "open_p50_ms": {"value": open_seq.latency.p50_ms, "target": f"<= {TARGET_OPEN_P50_MS:g}",
                        "pass": open_seq.latency.p50_ms <= TARGET_OPEN_P50_MS},
        "big_caller_episodes_ratio": {"value": eps_ratio, "target": f">= {TARGET_BIG_CALLER_RATIO:g}",
                                      "pass": eps_ratio >= TARGET_BIG_CALLER_RATIO},
    }
    runs = [sandbox, c1, open_seq, floor, fork_big, fork_small, big_run, big_open]
    return {
        "machine": machine_info(),
        "settings": {"episodes": args.episodes, "concurrency": c, "steps": STEPS, "rounds": args.rounds,
                     "instantiation_samples": INSTANTIATION_SAMPLES, "fork_time_cap_s": FORK_TIME_CAP_S},
        "isolation": small[0].isolation,
        "service_start_ms": {"small_caller": [round(r.service_start_s * 1e3, 1) for r in small],
                             "big_caller": [round(r.service_start_s * 1e3, 1) for r in big]},
        "caller_rss_mib": {"small_caller": small[0].caller_rss_mib, "big_caller": big[0].caller_rss_mib},
        "runs": {run.label: run.to_json() for run in runs},
        "ratios": ratios,
        "targets": targets,
        "wall_s": wall_s,
    }


def print_table(report: dict[str, Any]) -> None:
    m = report["machine"]
    print(f"machine: {m['nproc']} cpus ({m['cpu_model']}), {m['memory_gib']:.1f} GiB, "
          f"kernel {m['kernel']}, python {m['python']}")
    print(f"isolation layers: {', '.join(report['isolation'])}")
    s = report["settings"]
    print(f"settings: {s['episodes']} episodes of {s['steps']} steps at concurrency {s['concurrency']} and "
          f"{s['instantiation_samples']} sequential opens per round, {s['rounds']} rounds alternating a small "
          f"and a 4 GiB caller")
    rss = report["caller_rss_mib"]
    starts = report["service_start_ms"]
    print(f"caller RSS: small {rss['small_caller']:.0f} MiB, big {rss['big_caller']:.0f} MiB; service start ms: "
          f"small {starts['small_caller']}, big {starts['big_caller']}")
    print()
    header = f"{'measurement':<34} {'n':>5} {'conc':>4} {'seconds':>8} {'per s':>9} {'p50 ms':>8} {'p95 ms':>8}  note"
    print(header)
    print("-" * len(header))
    notes = {
        "open": "latency of service.open alone",
        "c=": "latency column: open under this load",
        "exec floor": "latency column: whole episode",
        "fork": "latency column: whole episode",
    }
    for label, run in report["runs"].items():
        latency = run["latency"] or {}
        note = next((text for key, text in notes.items() if label.startswith(key) or key in label), "")
        extra = run["extra"]
        if "round_per_s" in extra:
            note += f"; per round/s {extra['round_per_s']}"
        if "fork_call_p50_ms" in extra:
            note += (f"; fork() call p50 {extra['fork_call_p50_ms']:.2f} ms; parent RSS "
                     f"{extra['parent_rss_mib']:.0f} MiB" + ("; stopped by time cap" if extra["capped_by_time"] else ""))
        print(f"{label:<34} {run['episodes']:>5} {run['concurrency']:>4} {run['seconds']:>8.2f} "
              f"{run['episodes_per_s']:>9.1f} {latency.get('p50_ms', float('nan')):>8.2f} "
              f"{latency.get('p95_ms', float('nan')):>8.2f}  {note}")
    print()
    r = report["ratios"]
    print("ratios:")
    print(f"  4 GiB caller / small caller, episodes/s   {r['big_caller_episodes']:.3f} (median of rounds "
          f"{r['big_caller_episodes_per_round']}; pooled {r['big_caller_episodes_pooled']:.3f})")
    print(f"  4 GiB caller / small caller, open p50     {r['big_caller_open_p50']:.3f} (median of rounds "
          f"{r['big_caller_open_p50_per_round']})")
    print(f"  sandbox / exec floor                      {r['sandbox_over_exec_floor']:.4f}")
    print(f"  sandbox / fork-per-episode from 4 GiB     {r['sandbox_over_fork_4gib']:.2f}")
    print(f"  sandbox / fork-per-episode, small parent  {r['sandbox_over_fork_small']:.2f}")
    print()
    print("targets:")
    names = {"episodes_per_s": "sandbox episodes/s (c=%d)" % s["concurrency"],
             "open_p50_ms": "instantiation p50 ms (sequential)",
             "big_caller_episodes_ratio": "4 GiB caller episodes/s ratio"}
    for key, target in report["targets"].items():
        print(f"  {names[key]:<36} {target['value']:>9.3f}  {target['target']:<8} {verdict(target['pass'])}")
    print(f"\ntotal wall time {report['wall_s']:.1f} s")


# -- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=600, help="episodes per sandbox run (default 600)")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent episodes (default 16)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating small/4 GiB caller rounds (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    quiet = args.json

    def progress(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr, flush=True)

    wall = time.perf_counter()
    progress("[1/4] in-process exec floor ...")
    floor = exec_floor(args.episodes)
    progress("[2/4] fork per episode from a 4 GiB parent ...")
    fork_big = fork_run("fork/episode, 4 GiB parent", BIG_PARENT_BYTES, FORK_BIG_MAX_EPISODES)
    progress("[3/4] fork per episode from a small parent ...")
    fork_small = fork_run("fork/episode, small parent", 0, FORK_SMALL_MAX_EPISODES)
    progress("[4/4] sandbox, small and 4 GiB caller ...")
    small, big = caller_comparison(args.episodes, args.concurrency, args.rounds, progress)

    report = build_report(args, small, big, floor, fork_big, fork_small, time.perf_counter() - wall)
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
