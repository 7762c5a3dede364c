"""Admission time the degenerate-policy probes add per candidate: one round trip per step (the
old path) against every episode in one sandbox request (the ``probe`` request, today's path).

    python benchmarks/admission_probes.py [--rounds R] [--json]

Candidates: the seed games and the six ``examples/envs/`` (all admitted) and the exploit corpus of
``tests/test_degenerate_probes.py`` (all rejected). Each round opens every candidate twice in the
real sandbox service and times the probe stage alone on each path (the same settings and run turn
budget, 25); the two reports must be identical (the script stops otherwise). It prints the median
and p90 per candidate of each path, for admitted and rejected candidates, and the ratio of the
medians. The old per-call loop lives here only, as the reference the new path is checked against
(``tests/test_degenerate_probes.py`` imports it for the same check).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from typing import Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (REPO_ROOT, os.path.join(REPO_ROOT, "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)

from spade.agent.actions import parse_action  # noqa: E402
from spade.envs.degenerate_probes import (PolicyResult, ProbeBudget, ProbeReport, ProbeSettings,  # noqa: E402
                                          probe_policies, run_probes)
from spade.envs.protocol import EnvFault, EnvInstance, InfrastructureFault, episode_return  # noqa: E402
from spade.envs.runner import DEFAULT_MAX_TURNS, turn_budget  # noqa: E402
from spade.envs.sandbox.client import SandboxService  # noqa: E402
from spade.envs.sandbox.config import SandboxConfig  # noqa: E402
from spade.envs.sandbox.runtime.probe_play import ProbePolicy, ProbeView  # noqa: E402

MAX_TURNS = 25


async def _per_call_episode(env: EnvInstance, policy: ProbePolicy, seed: int, turns: int, budget: ProbeBudget,
                            played: dict[tuple[int, str], float]) -> tuple[float, bool, str | None] | None:
    rng = random.Random(f"{seed}:{policy.name}")
    try:
        first = await env.reset(seed=seed)
    except InfrastructureFault:
        raise
    except EnvFault:
        return 0.0, True, None
    observation, previous = first.observation, None
    rewards: list[float] = []
    terminated = False
    for _ in range(turns):
        reply = policy.act(ProbeView(first.observation, observation, previous, rng))
        if reply is None:
            return None
        if policy.constant and previous is None and (seed, reply) in played:
            return played[(seed, reply)], False, None
        if not budget.take():
            return None
        try:
            result = await env.step(parse_action(reply))
        except InfrastructureFault:
            raise
        except EnvFault:
            return 0.0, True, reply if policy.constant else None
        rewards.append(result.reward)
        previous, observation = reply, result.observation
        if result.terminated or result.truncated:
            terminated = result.terminated
            break
    return episode_return(rewards, terminated), False, previous if policy.constant else None


async def per_call_probes(env: EnvInstance, settings: ProbeSettings, *, max_turns: int | None = None) -> ProbeReport:
    """The probes as admission ran them before the ``probe`` request: one sandbox call per reset and step."""
    turns = turn_budget(max_turns or DEFAULT_MAX_TURNS, env.max_turns)
    report = ProbeReport(settings.threshold, turns)
    budget = ProbeBudget(settings.max_steps, settings.max_seconds)
    played: dict[tuple[int, str], float] = {}
    for policy in probe_policies():
        result = PolicyResult(policy.name, policy.description)
        report.results.append(result)
        for position, seed in enumerate(settings.seeds):
            if result.cannot_reach(settings.threshold, len(settings.seeds) - position):
                break
            outcome = await _per_call_episode(env, policy, seed, turns, budget, played)
            if outcome is None:
                if budget.exhausted:
                    break
                continue
            value, fault, reply = outcome
            result.returns.append(value)
            result.seeds.append(seed)
            result.errors += int(fault)
            if reply is not None:
                played[(seed, reply)] = value
        if report.judge(result, budget):
            break
    return report


def comparable(report: ProbeReport) -> dict[str, Any]:
    """A report's JSON without the per-episode endings (which only the new path records)."""
    data = report.to_json()
    for policy in data["policies"]:
        policy.pop("endings", None)
    return data


def candidates() -> dict[str, tuple[str, bool]]:
    """name -> (source, admitted?)."""
    from test_degenerate_probes import EXPLOITS, HONEST

    out = {name: (source, True) for name, source in HONEST.items() if name in _SEED_AND_EXAMPLES}
    out.update({name: (source, False) for name, (source, _) in EXPLOITS.items()})
    return out


_SEED_AND_EXAMPLES = {name[:-3] for folder in ("examples/seed_envs", "examples/envs")
                      for name in os.listdir(os.path.join(REPO_ROOT, folder)) if name.endswith(".py")}


async def _time(service: SandboxService, source: str, probe: Any, settings: ProbeSettings) -> tuple[float, ProbeReport]:
    env = await service.open(source, max_turns=MAX_TURNS)
    try:
        start = time.perf_counter()
        report = await probe(env, settings, max_turns=MAX_TURNS)
        return (time.perf_counter() - start) * 1000.0, report
    finally:
        await env.close()


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]


async def measure(rounds: int) -> dict[str, Any]:
    settings = ProbeSettings()
    games = candidates()
    times: dict[str, dict[str, list[float]]] = {"per_call": {}, "one_request": {}}
    async with await SandboxService.start(SandboxConfig()) as service:
        for _ in range(rounds):
            for name, (source, _) in games.items():
                old_ms, old = await _time(service, source, per_call_probes, settings)
                new_ms, new = await _time(service, source, run_probes, settings)
                if comparable(old) != comparable(new):
                    raise SystemExit(f"{name}: the two paths disagree\nper call: {comparable(old)}\n"
                                     f"one request: {comparable(new)}")
                times["per_call"].setdefault(name, []).append(old_ms)
                times["one_request"].setdefault(name, []).append(new_ms)
    result: dict[str, Any] = {"rounds": rounds, "cpus": os.cpu_count(), "candidates": {}}
    for group, admitted in (("admitted", True), ("rejected", False)):
        names = [name for name, (_, ok) in games.items() if ok is admitted]
        row: dict[str, Any] = {"candidates": len(names)}
        for path in ("per_call", "one_request"):
            per_candidate = [statistics.median(times[path][name]) for name in names]
            row[path] = {"median_ms": round(statistics.median(per_candidate), 2),
                         "p90_ms": round(_p90(per_candidate), 2)}
        row["ratio"] = round(row["per_call"]["median_ms"] / row["one_request"]["median_ms"], 1)
        result["candidates"][group] = row
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="times each candidate is probed on each path")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    result = asyncio.run(measure(args.rounds))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"degenerate-policy probes, added admission time per candidate ({args.rounds} rounds, "
          f"{result['cpus']} CPUs; the two paths' reports identical on every candidate)")
    for group, row in result["candidates"].items():
        old, new = row["per_call"], row["one_request"]
        print(f"  {group:<8} ({row['candidates']:>2}): per call median {old['median_ms']:7.2f} ms p90 "
              f"{old['p90_ms']:7.2f} ms | one request median {new['median_ms']:6.2f} ms p90 {new['p90_ms']:6.2f} ms"
              f" | {row['ratio']}x")


if __name__ == "__main__":
    main()
