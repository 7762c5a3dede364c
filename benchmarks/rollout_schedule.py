"""Rollout schedules side by side: synchronous steps, partial rollouts, one step off policy and both (issue 26).

    python benchmarks/rollout_schedule.py [--quick] [--steps N] [--json [PATH]]

What runs. For each schedule, the real :class:`~spade.selfplay.orchestrator.Orchestrator`
``run_step`` on a fixed pool of the example games (``examples/envs``, copied into a temporary pool
directory, cycled to the needed count; ``selfplay.env_source: fixed_pool``, no designer, no hinted
arm), through the real sandbox service (bubblewrap by default), token-exact conversations, the
carried-play machinery and sample building, with a real tokenizer (the embedded SmolLM2 tokenizer
when it is available, else the tests' byte-level BPE ChatML tokenizer).

What is simulated. Only the model: :class:`SimulatedEngine` answers each agent turn with a reply of
``L`` tokens (reasoning text cut to length, then one ``\\boxed{action}`` drawn from a per-game list
of valid, non-final actions, as benchmarks/step_overhead.py does, so episodes run to the turn
budget) and holds the request for ``L * --token-latency-ms`` before answering. ``L`` is drawn once
per episode, log-normal: ``L = min(cap, round(median * exp(sigma * z)))``, ``z ~ N(0, 1)`` from a
generator seeded with the episode's sampling seed (the request's seed minus its turn count), so a
play carried into the next step keeps its length. Defaults: median 200 tokens, sigma 1.0, cap 2000,
1 ms per token (time is scaled down about 20x from a real decode, so a run is short; the
orchestration's own costs are not scaled, which makes them weigh more here than in a real run).
Requests do not slow each other: a latency-bound engine with spare batch capacity.

The schedules, at equal samples per step. ``sync``: ``envs_per_set = E`` environments, every step
waits for all ``E * g_nohint`` plays (the paper's schedule). ``partial``:
``selfplay.partial_rollouts.enabled: true`` with ``envs_per_set = E_p`` (default ``1.5 * E``: the
over-sampling) and ``complete_fraction = E / E_p``, so a step ends when ``E`` groups are complete
(carried ones included) and trains ``E * g_nohint`` samples, like ``sync``; the rest are carried
(``max_carry_steps`` as set). ``overlap``: ``sync``'s set with ``run.overlap: 1``'s schedule (the
next step's ``run_step`` runs during the update, as ``Trainer.one_step`` runs it). ``partial+overlap``:
both. Every step's update is simulated as ``--train-seconds`` (default 2 s) in which the step sends
the engine nothing, so in ``sync`` and ``partial`` the engine idles through it.

Measured, over steps 1..N (step 0, the set's admission, is run but not counted; ``k`` is set so no
later step regenerates): step wall time (mean over the steps), engine idle share (the time with no
request in flight / wall), mean requests in flight (time-weighted), agent samples per step and per
second (samples / summed wall), tokens generated and tokens discarded (replies cut when a step stops
and sampled again later), plays carried and aborted; then each schedule's ratios over ``sync``. No
model trains here: the update is the simulated ``--train-seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.step_overhead import (DEFAULT_GAME, ENV_FILES, EXAMPLE_ENVS, GAMES, REASONING,  # noqa: E402
                                      load_tokenizer)
from spade.envs.sandbox.client import SandboxService  # noqa: E402
from spade.envs.sandbox.config import SandboxConfig  # noqa: E402
from spade.rollout.engine import GenerationRequest, GenerationResult, RolloutEngine  # noqa: E402
from spade.selfplay.orchestrator import Orchestrator  # noqa: E402
from spade.selfplay.plays.partial_rollout_settings import PartialRolloutSettings  # noqa: E402
from spade.selfplay.settings import PlayRules, SamplingSettings, SelfPlaySettings  # noqa: E402
from spade.selfplay.step import Step  # noqa: E402

SCHEDULES = (("sync", False, False), ("partial", True, False), ("overlap", False, True),
             ("partial+overlap", True, True))  # name, partial rollouts, run.overlap
ASSISTANT_HEADER = "<|im_start|>assistant"


# --------------------------------------------------------------------------- the simulated engine


@dataclass
class EngineMeter:
    """Time with no request in flight and the time integral of the requests in flight."""

    inflight: int = 0
    since: float = 0.0           # last change of ``inflight``
    idle_s: float = 0.0
    busy_integral: float = 0.0   # sum over time of inflight * dt
    requests: int = 0
    tokens: int = 0              # tokens of the replies answered
    discarded_tokens: float = 0.0  # tokens of replies cancelled mid-way (time held / latency)
    cancelled: int = 0

    def _advance(self, now: float) -> None:
        dt = now - self.since
        if self.inflight == 0:
            self.idle_s += dt
        self.busy_integral += self.inflight * dt
        self.since = now

    def enter(self) -> None:
        self._advance(time.perf_counter())
        self.inflight += 1

    def leave(self) -> None:
        self._advance(time.perf_counter())
        self.inflight -= 1

    def restart(self) -> None:
        """Start a measuring window now (requests in flight stay counted)."""
        inflight = self.inflight
        self.__init__(inflight=inflight, since=time.perf_counter())

    def close_window(self) -> None:
        self._advance(time.perf_counter())


class SimulatedEngine(RolloutEngine):
    """Agent replies of a log-normal length per episode, each held for length x latency (module docstring)."""

    def __init__(self, tokenizer: Any, *, eos_id: int, median: float, sigma: float, cap: int,
                 token_latency_s: float):
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.median, self.sigma, self.cap = median, sigma, cap
        self.token_latency_s = token_latency_s
        self.meter = EngineMeter()
        self.lengths: list[int] = []   # L of each first turn answered (one per episode started)
        words = (REASONING * (1 + cap // 30)).split()
        self._reasoning = tuple(self._encode(" ".join(words)))
        if len(self._reasoning) < cap:
            raise ValueError(f"reasoning text too short for cap {cap}")
        self._actions = {name: [tuple(self._encode(f"\n\n\\boxed{{{action}}}")) for action in game["actions"]]
                         for name, game in list(GAMES.items()) + [("unknown", DEFAULT_GAME)]}

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def episode_length(self, episode_seed: int) -> int:
        z = random.Random(episode_seed).gauss(0.0, 1.0)
        return max(1, min(self.cap, round(self.median * math.exp(self.sigma * z))))

    @property
    def weight_version(self) -> int:
        return 0

    def reply(self, request: GenerationRequest) -> tuple[int, ...]:
        text = self.tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False)
        turns = text.count(ASSISTANT_HEADER) - 1  # the last header opens this reply
        if request.sampling.seed is None or turns < 0:
            raise ValueError("the simulated engine needs a seeded chat-template prompt")
        length = self.episode_length(request.sampling.seed - turns)
        if turns == 0:
            self.lengths.append(length)
        game = next((name for name, g in GAMES.items() if g["marker"] in text), "unknown")
        action = random.Random(request.sampling.seed).choice(self._actions[game])
        body = max(0, length - len(action) - 1)
        return self._reasoning[:body] + action + (self.eos_id,)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        ids = self.reply(request)
        finish = "stop"
        if len(ids) > request.sampling.max_new_tokens:
            ids, finish = ids[:request.sampling.max_new_tokens], "length"
        meter = self.meter
        meter.enter()
        started = time.perf_counter()
        try:
            await asyncio.sleep(len(ids) * self.token_latency_s)
        except asyncio.CancelledError:
            meter.cancelled += 1
            meter.discarded_tokens += (time.perf_counter() - started) / self.token_latency_s
            raise
        finally:
            meter.leave()
        meter.requests += 1
        meter.tokens += len(ids)
        return GenerationResult(ids, (-1.0,) * len(ids), finish, 0)

    async def update_weights(self, named_tensors, version: int) -> None:  # pragma: no cover - not used
        raise NotImplementedError("the simulated engine has no weights")

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- one schedule


@dataclass
class ScheduleFigures:
    name: str
    envs_per_set: int
    complete_fraction: float | None
    steps: int
    overlap: bool = False
    train_s: float = 0.0
    step_wall_s: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    carried_over: list[int] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    idle_s: float = 0.0
    busy_integral: float = 0.0
    requests: int = 0
    tokens: int = 0
    discarded_tokens: float = 0.0
    cancelled: int = 0
    setup_s: float = 0.0

    @property
    def mean_step_s(self) -> float:
        return self.wall_s / self.steps

    @property
    def idle_share(self) -> float:
        return self.idle_s / self.wall_s

    @property
    def mean_inflight(self) -> float:
        return self.busy_integral / self.wall_s

    @property
    def samples_per_s(self) -> float:
        return sum(self.samples) / self.wall_s

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(mean_step_s=self.mean_step_s, idle_share=self.idle_share, mean_inflight=self.mean_inflight,
                    samples_per_s=self.samples_per_s)
        return data


def make_pool(directory: Path, count: int) -> str:
    """``count`` example games (cycled over ENV_FILES) as a fixed pool directory."""
    directory.mkdir(parents=True)
    for i in range(count):
        name = ENV_FILES[i % len(ENV_FILES)]
        shutil.copyfile(EXAMPLE_ENVS / name, directory / f"g{i:03d}_{name}")
    return str(directory)


async def run_schedule(name: str, settings: SelfPlaySettings, engine: SimulatedEngine, service: SandboxService,
                       tokenizer: Any, run_dir: Path, steps: int, seed: int, *, train_s: float = 0.0,
                       overlap: bool = False) -> ScheduleFigures:
    """Steps 1..``steps`` of one schedule. Each step's update is simulated as ``train_s`` seconds in
    which the engine gets no request from it; with ``overlap`` the next step's ``run_step`` runs
    during that time, as ``Trainer.one_step`` does with ``run.overlap: 1`` (the first measured step
    plays alone, the last starts nothing)."""
    orchestrator = Orchestrator(settings, sandbox=service, engine=engine, tokenizer=tokenizer, corpus=None,
                                memory=None, run_dir=run_dir, seed=seed)
    enabled = settings.partial_rollouts.enabled
    figures = ScheduleFigures(name, settings.envs_per_set,
                              settings.partial_rollouts.complete_fraction if enabled else None, steps,
                              overlap=overlap, train_s=train_s)
    started = time.perf_counter()
    await orchestrator.run_step(Step(0))  # the set's admission and a first round of plays: not counted
    figures.setup_s = time.perf_counter() - started
    engine.meter.restart()
    began = time.perf_counter()
    ready = None
    for n in range(1, steps + 1):
        t0 = time.perf_counter()
        out, ready = ready or await orchestrator.run_step(Step(n)), None
        following = asyncio.create_task(orchestrator.run_step(Step(n + 1))) if overlap and n < steps else None
        await asyncio.sleep(train_s)  # the update
        if following is not None:
            ready = await following
        figures.step_wall_s.append(time.perf_counter() - t0)
        figures.samples.append(len(out.agent_samples))
        figures.carried_over.append(int(out.metrics.get("rollout/carried_over", 0)))
        figures.aborted.append(int(out.metrics.get("rollout/aborted", 0)))
    engine.meter.close_window()
    figures.wall_s = time.perf_counter() - began
    m = engine.meter
    figures.idle_s, figures.busy_integral = m.idle_s, m.busy_integral
    figures.requests, figures.tokens = m.requests, m.tokens
    figures.discarded_tokens, figures.cancelled = m.discarded_tokens, m.cancelled
    return figures


def settings_for(args: argparse.Namespace, pool: str, *, partial: bool) -> SelfPlaySettings:
    envs = args.partial_envs if partial else args.envs_per_set
    partial_settings = PartialRolloutSettings(
        enabled=True, complete_fraction=args.envs_per_set / args.partial_envs,
        max_carry_steps=args.max_carry_steps) if partial else PartialRolloutSettings()
    return SelfPlaySettings(
        envs_per_set=envs, g_nohint=args.g_nohint, g_hint=0, k=args.steps + 1, max_turns=args.max_turns,
        sampling=SamplingSettings().replace(agent={"max_tokens": args.cap + 64}), max_context_tokens=args.max_turns * (args.cap + 64) + 4096,
        plays=PlayRules(max_concurrent=args.max_concurrent_episodes), env_source="fixed_pool", designer_enabled=False,
        fixed_env_dir=pool, use_memory=False, use_corpus=False, train_designer=False,
        partial_rollouts=partial_settings)


async def run(args: argparse.Namespace, tokenizer: Any) -> tuple[list[ScheduleFigures], dict[str, Any]]:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sandbox_config = SandboxConfig(isolation=args.isolation)
    service = await SandboxService.start(sandbox_config)
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="spade-rollout-schedule-") as tmp:
            for name, partial, overlap in SCHEDULES:
                settings = settings_for(args, make_pool(Path(tmp) / f"pool_{name}", args.partial_envs if partial
                                                        else args.envs_per_set), partial=partial)
                engine = SimulatedEngine(tokenizer, eos_id=eos, median=args.median_tokens, sigma=args.sigma,
                                         cap=args.cap, token_latency_s=args.token_latency_ms / 1000.0)
                results.append(await run_schedule(name, settings, engine, service, tokenizer, Path(tmp) / name,
                                                  args.steps, args.seed, train_s=args.train_seconds,
                                                  overlap=overlap))
    finally:
        await service.close()
    context = {"isolation": sandbox_config.isolation, "sandbox_pool_size": sandbox_config.pool_size}
    return results, context


# --------------------------------------------------------------------------- report


def ratios(sync: ScheduleFigures, other: ScheduleFigures) -> dict[str, float]:
    return {"step_wall_s": other.mean_step_s / sync.mean_step_s,
            "idle_share": (other.idle_share / sync.idle_share) if sync.idle_share > 0 else float("nan"),
            "samples_per_s": other.samples_per_s / sync.samples_per_s}


def all_ratios(results: list[ScheduleFigures]) -> dict[str, dict[str, float]]:
    """Each schedule's figures over the synchronous schedule's (the first)."""
    return {f.name: ratios(results[0], f) for f in results[1:]}


def report(args: argparse.Namespace, tokenizer_name: str, context: dict, results: list[ScheduleFigures],
           total_s: float) -> str:
    sync, partial = results[0], results[1]
    lines: list[str] = []
    add = lines.append
    add(f"command: {shlex.join([sys.executable] + sys.argv)}")
    add(f"machine: {platform.node()} / {os.cpu_count()} CPUs / Python {platform.python_version()}")
    add(f"tokenizer: {tokenizer_name}; sandbox: {context['isolation']}, pool_size={context['sandbox_pool_size']}")
    add(f"simulated engine: reply length per episode log-normal, median {args.median_tokens:g} tokens, sigma "
        f"{args.sigma:g}, cap {args.cap}; {args.token_latency_ms:g} ms per token; requests do not slow each other")
    add(f"plays: g_nohint={args.g_nohint}, max_turns={args.max_turns} (valid non-final actions: every episode "
        f"plays its turn budget), max_concurrent_episodes={args.max_concurrent_episodes}; "
        f"measured steps 1..{args.steps} (step 0, admission, not counted)")
    add(f"sync: envs_per_set={sync.envs_per_set}; partial: envs_per_set={partial.envs_per_set}, complete_fraction="
        f"{partial.complete_fraction:.4f} (ends at {math.ceil(partial.complete_fraction * partial.envs_per_set)} "
        f"complete groups), max_carry_steps={args.max_carry_steps}")
    add(f"update: simulated, {args.train_seconds:g} s per step with no engine request from it; overlap: the next "
        "step's rollout runs during it (run.overlap: 1's schedule)")
    add("")
    width = max(14, max(len(f.name) for f in results) + 2)

    def row(label: str, cells: list[str]) -> None:
        add(f"{label:30}" + "".join(f"{c:>{width}}" for c in cells))

    row("", [f.name for f in results])
    row("step wall time (s, mean)", [f"{f.mean_step_s:.3f}" for f in results])
    row("engine idle share", [f"{f.idle_share:.4f}" for f in results])
    row("samples per second", [f"{f.samples_per_s:.3f}" for f in results])
    row("requests in flight (mean)", [f"{f.mean_inflight:.2f}" for f in results])
    row("samples per step (mean)", [f"{sum(f.samples) / f.steps:.2f}" for f in results])
    row("samples (total)", [str(sum(f.samples)) for f in results])
    row("wall, measured steps (s)", [f"{f.wall_s:.2f}" for f in results])
    row("engine requests answered", [str(f.requests) for f in results])
    row("tokens generated", [str(f.tokens) for f in results])
    row("tokens discarded (cut)", [f"{f.discarded_tokens:.0f}" for f in results])
    row("plays carried over (sum)", [str(sum(f.carried_over)) for f in results])
    row("plays aborted (whole groups)", [str(sum(f.aborted)) for f in results])
    add("")
    add("over sync:")
    for name, r in all_ratios(results).items():
        add(f"  {name:18} step wall time {r['step_wall_s']:.3f}  engine idle share {r['idle_share']:.3f}  "
            f"samples per second {r['samples_per_s']:.3f}")
    add("(engine idle share: no request in flight at all; the synchronous tail keeps one or two long requests in "
        "flight, so it shows in the requests in flight, not in the idle share)")
    add("")
    for f in results:
        add(f"{f.name}: per-step wall " + " ".join(f"{w:.2f}" for w in f.step_wall_s)
            + f" s; samples {f.samples}; step 0 (not counted) {f.setup_s:.2f} s")
    add(f"benchmark run time: {total_s:.1f} s")
    return "\n".join(lines)


QUICK = {"envs_per_set": 2, "partial_envs": 3, "g_nohint": 2, "max_turns": 2, "steps": 2, "median_tokens": 20.0,
         "cap": 100, "train_seconds": 0.1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"a tiny run for the tests (sets {', '.join(f'{k}={v}' for k, v in QUICK.items())})")
    parser.add_argument("--envs-per-set", type=int, default=4, help="E: environments per step (sync)")
    parser.add_argument("--partial-envs", type=int, default=None,
                        help="E_p: environments started per step with partial rollouts (default: ceil(1.5 E))")
    parser.add_argument("--g-nohint", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6, help="measured steps after step 0")
    parser.add_argument("--max-carry-steps", type=int, default=PartialRolloutSettings.max_carry_steps)
    parser.add_argument("--max-concurrent-episodes", type=int, default=64)
    parser.add_argument("--median-tokens", type=float, default=200.0)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--cap", type=int, default=2000, help="longest reply, tokens")
    parser.add_argument("--token-latency-ms", type=float, default=1.0)
    parser.add_argument("--train-seconds", type=float, default=2.0,
                        help="the simulated update per step (the engine idles through it unless overlapped)")
    parser.add_argument("--isolation", choices=("bubblewrap", "unsafe-local"), default="bubblewrap")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--json", metavar="PATH", nargs="?", const="-",
                        help="also write the figures as JSON (to PATH, or stdout with no PATH)")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.partial_envs is None:
        args.partial_envs = math.ceil(1.5 * args.envs_per_set)
    if args.partial_envs < args.envs_per_set:
        parser.error("--partial-envs must be at least --envs-per-set")
    if math.ceil(args.envs_per_set / args.partial_envs * args.partial_envs) != args.envs_per_set:
        parser.error("--envs-per-set / --partial-envs does not round-trip to the same group count")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    tokenizer, tokenizer_name = load_tokenizer()
    results, context = asyncio.run(run(args, tokenizer))
    total_s = time.perf_counter() - began
    print(report(args, tokenizer_name, context, results, total_s), flush=True)
    if args.json:
        data = {"command": shlex.join([sys.executable] + sys.argv), "tokenizer": tokenizer_name,
                "engine": {"median_tokens": args.median_tokens, "sigma": args.sigma, "cap": args.cap,
                           "token_latency_ms": args.token_latency_ms},
                "plays": {"g_nohint": args.g_nohint, "max_turns": args.max_turns, "steps": args.steps,
                          "max_carry_steps": args.max_carry_steps},
                "train_seconds": args.train_seconds, "context": context,
                "schedules": {f.name: f.summary() for f in results}, "ratios": all_ratios(results),
                "run_s": total_s}
        payload = json.dumps(data, indent=1)
        if args.json == "-":
            print(payload)
        else:
            Path(args.json).write_text(payload + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
