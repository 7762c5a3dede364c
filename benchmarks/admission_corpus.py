"""The probe corpus through admission (issue 40): what is rejected, what is kept, and what it costs.

    python benchmarks/admission_corpus.py [--rounds R] [--json]

Candidates: the exploit and honest corpora of ``tests/fixtures/probe_corpus`` (games of this
project's own writing), the six ``examples/envs/`` and the two seed games. Each is admitted through
the real sandbox service with the probes and the winnability stage on (the settings of spade's GPU
recipes: 8 seeds a round drawn from run seed 0, the run's turn budget 25), ``rounds`` times. It
prints, per group, how many were rejected and by which family (or ``unwinnable``), and the time
the probes and the winnability stage add to one candidate's admission (median and worst over the
candidates, each candidate's median over the rounds), beside the whole admission's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from spade.envs.admission import admit  # noqa: E402
from spade.envs.degenerate_probes import ProbeSettings  # noqa: E402
from spade.envs.sandbox.client import SandboxService  # noqa: E402
from spade.envs.sandbox.config import SandboxConfig  # noqa: E402
from spade.envs.winnability import WinnabilitySettings  # noqa: E402

CORPUS = REPO_ROOT / "tests" / "fixtures" / "probe_corpus"
MAX_TURNS = 25
ADDED = ("degenerate_probe", "winnability")


def groups() -> dict[str, list[Path]]:
    return {"exploit": sorted((CORPUS / "exploit").glob("*.py")), "honest": sorted((CORPUS / "honest").glob("*.py")),
            "examples and seed games": sorted((REPO_ROOT / "examples" / "envs").glob("*.py"))
            + sorted((REPO_ROOT / "examples" / "seed_envs").glob("*.py"))}


def expected(path: Path) -> str | None:
    found = re.search(r"^expected: (\w+)$", path.read_text(), re.MULTILINE)
    return found.group(1) if found else None


async def measure(rounds: int) -> dict[str, Any]:
    candidates = groups()
    added: dict[str, list[float]] = {}
    whole: dict[str, list[float]] = {}
    verdicts: dict[str, str] = {}
    async with await SandboxService.start(SandboxConfig()) as service:
        for _ in range(rounds):
            for paths in candidates.values():
                for path in paths:
                    verdict = await admit(service, path.read_text(), max_turns=MAX_TURNS, probes=ProbeSettings(),
                                          winnability=WinnabilitySettings())
                    key = str(path.relative_to(REPO_ROOT))
                    added.setdefault(key, []).append(sum(verdict.timings_ms.get(stage, 0.0) for stage in ADDED))
                    whole.setdefault(key, []).append(sum(verdict.timings_ms.values()))
                    if verdict.admitted:
                        verdicts[key] = "admitted"
                    elif verdict.error is not None and verdict.error.kind.value == "unwinnable":
                        verdicts[key] = "unwinnable"
                    else:
                        verdicts[key] = verdict.degenerate_family or verdict.error.kind.value
    result: dict[str, Any] = {"rounds": rounds, "cpus": os.cpu_count(), "groups": {}}
    for group, paths in candidates.items():
        keys = [str(p.relative_to(REPO_ROOT)) for p in paths]
        per_added = [statistics.median(added[k]) for k in keys]
        per_whole = [statistics.median(whole[k]) for k in keys]
        outcome = Counter(verdicts[k] for k in keys)
        wrong = [k for k, p in zip(keys, paths) if group == "exploit" and verdicts[k] != expected(p)]
        result["groups"][group] = {
            "candidates": len(keys), "admitted": outcome.get("admitted", 0),
            "verdicts": dict(sorted(outcome.items())), "not_the_expected_family": wrong,
            "added_ms": {"median": round(statistics.median(per_added), 1), "worst": round(max(per_added), 1)},
            "admission_ms": {"median": round(statistics.median(per_whole), 1), "worst": round(max(per_whole), 1)}}
    every = [statistics.median(v) for v in added.values()]
    result["all"] = {"candidates": len(every), "added_ms": {"median": round(statistics.median(every), 1),
                                                            "worst": round(max(every), 1)}}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="times each candidate is admitted")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    result = asyncio.run(measure(args.rounds))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"admission of the probe corpus ({args.rounds} rounds, {result['cpus']} CPUs, run turn budget {MAX_TURNS})")
    for group, row in result["groups"].items():
        added, whole = row["added_ms"], row["admission_ms"]
        print(f"  {group:<24} {row['candidates']:>2} candidates, {row['admitted']:>2} admitted; "
              f"probes + winnability median {added['median']:6.1f} ms, worst {added['worst']:6.1f} ms; "
              f"whole admission median {whole['median']:6.1f} ms")
        print(f"    verdicts: {row['verdicts']}")
        if row["not_the_expected_family"]:
            print(f"    NOT the expected family: {row['not_the_expected_family']}")
    print(f"  all {result['all']['candidates']} candidates: probes + winnability median "
          f"{result['all']['added_ms']['median']} ms, worst {result['all']['added_ms']['worst']} ms")


if __name__ == "__main__":
    main()
