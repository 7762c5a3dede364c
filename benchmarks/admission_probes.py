"""Admission time the degenerate-policy probes add per candidate: one round trip per step (the
old path) against every episode in one sandbox request (the ``probe`` request, today's path).

    python benchmarks/admission_probes.py [--rounds R] [--json]

Candidates: the seed games and the six ``examples/envs/`` (all admitted) and the exploit corpus of
``tests/envs/test_degenerate_probes.py`` (all rejected). Each round opens every candidate twice in the
real sandbox service and times the probe stage alone on each path (the same settings and run turn
budget, 25); the two reports must be identical (the script stops otherwise). It prints the median
and p90 per candidate of each path, for admitted and rejected candidates, and the ratio of the
medians. The per-call path lives here only, as the reference the one-request path is checked
against (``tests/envs/test_degenerate_probes.py`` imports it for the same check); since issue 40 it
drives the same loop (:func:`spade.envs.sandbox.runtime.probe_play.play`) through one sandbox call
per reset and step, so the check is on the sandbox path, not on a second copy of the loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (REPO_ROOT, os.path.join(REPO_ROOT, "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)

from spade.agent.actions import parse_action  # noqa: E402
from spade.envs.degenerate_probes import ProbeReport, ProbeSettings, probe_plan, report_of, run_probes  # noqa: E402
from spade.envs.protocol import EnvFault, EnvInstance, InfrastructureFault  # noqa: E402
from spade.envs.runner import DEFAULT_MAX_TURNS, turn_budget  # noqa: E402
from spade.envs.sandbox.client import SandboxService  # noqa: E402
from spade.envs.sandbox.config import SandboxConfig  # noqa: E402
from spade.envs.sandbox.runtime.probe_play import EnvFailed, play  # noqa: E402

MAX_TURNS = 25


async def per_call_probes(env: EnvInstance, settings: ProbeSettings, *, max_turns: int | None = None) -> ProbeReport:
    """The probes as admission ran them before the ``probe`` request: one sandbox call per reset and
    step. The loop is the same :func:`play` (run in a worker thread, each call sent to the event
    loop), so the two paths differ only in how the calls reach the game."""
    turns = turn_budget(max_turns or DEFAULT_MAX_TURNS, env.max_turns)
    if not settings.seeds:
        settings = settings.for_candidate(env.class_name or "")
    plan = probe_plan(settings, turns)
    loop = asyncio.get_running_loop()
    failed: list[EnvFailed] = []

    def call(make: Any) -> Any:
        if failed:  # after a fault every call fails the same way, as the environment is discarded
            raise failed[0]
        try:
            return asyncio.run_coroutine_threadsafe(make(), loop).result()
        except InfrastructureFault:
            raise
        except EnvFault as fault:
            failed.append(EnvFailed(fault.error.kind.value, fault.error.message))
            raise failed[0] from None

    def reset(seed: int) -> str:
        return call(lambda: env.reset(seed=seed)).observation

    def step(action: str) -> tuple[str, float, bool, bool]:
        result = call(lambda: env.step(action))
        return result.observation, result.reward, result.terminated, result.truncated

    outcome = await asyncio.to_thread(play, plan, reset, step, parse_action)
    return report_of(outcome, settings.threshold, turns, tuple(settings.seeds), settings.round_seeds)


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
