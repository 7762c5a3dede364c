"""The share of admitted environments that a degenerate policy wins (issue 23).

A degenerate policy knows nothing of the environment: the games probes' constant and random
replies (:mod:`spade.envs.degenerate_probes`), or answering done / calling one tool over and over
in a tool environment (:mod:`spade.envs.tool_use.degenerate_probes`). Where does the verdict come from:

* **admission** (recorded): a run whose resolved config had ``selfplay.admission.probes`` true and
  ``admission.paper_exact`` false probed every candidate and rejected the ones a probe policy won
  (``rejected/…`` with kind ``degenerate_win``), so none of its admitted environments is won (a
  tool environment's saved ``tool_report`` also carries every policy's scores);
* **probe** (after the fact, ``spade analyze --probe``): a run made with the probes off, or before
  they existed, has its saved environments (``envs/step_N/ENV_ID.py``) played by the same probes in
  the sandbox, with the run's turn budget and threshold (a few hundred ms per environment);
* otherwise unknown (None), and left out of the share.

``env_source: rlve`` runs are not probed: their problems are JSON specs checked by rlve-gym's
verifiers, not code the probes can open.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..envs.degenerate_probes import DEFAULT_MAX_STEPS, DEFAULT_SEED_COUNT, DEFAULT_THRESHOLD, ProbeSettings, run_probes
from ..envs.protocol import EnvFault, InfrastructureFault
from ..envs.tool_use.degenerate_probes import run_tool_probes
from ..selfplay.admission_settings import MOVED_ADMISSION_KEYS
from .sources import RLVE

CONCURRENCY = 4
RECORDED, PROBED = "admission", "probe"
NOT_PROBED_RLVE = ("not applicable to env_source rlve: problems are JSON specs checked by rlve-gym's verifiers, "
                   "not code the probes can play")


@dataclass(frozen=True)
class DegenerateVerdict:
    won: bool | None  # None: unknown
    source: str | None  # RECORDED, PROBED or None
    policy: str | None = None  # the winning policy (after the fact only: admission rejected the winners)
    mean_return: float | None = None  # the winner's mean return / score
    reason: str = ""
    family: str | None = None  # the winning policy's family (issue 40)

    def to_json(self) -> dict[str, Any]:
        return {"degenerate_won": self.won, "degenerate_source": self.source, "degenerate_policy": self.policy,
                "degenerate_family": self.family, "degenerate_mean_return": self.mean_return,
                "degenerate_reason": self.reason}


def _selfplay(config: Mapping[str, Any]) -> Mapping[str, Any]:
    selfplay = config.get("selfplay")
    return selfplay if isinstance(selfplay, Mapping) else {}


def _admission(config: Mapping[str, Any]) -> dict[str, Any]:
    """The run's ``selfplay.admission`` values by their names there; a config written before the
    section had them as flat ``selfplay`` keys (``admission_probes``, ``degenerate_threshold``, ...)."""
    selfplay = _selfplay(config)
    nested = selfplay.get("admission")
    out = dict(nested) if isinstance(nested, Mapping) else {}
    for old, new in MOVED_ADMISSION_KEYS.items():
        name = new.removeprefix("admission.")
        if old in selfplay and name not in out:
            out[name] = selfplay[old]
    return out


def probes_at_admission(config: Mapping[str, Any]) -> bool:
    """Whether the run's admission ran the probes: ``admission.probes`` written true (a config
    written before the key existed had none) and ``admission.paper_exact`` not true."""
    admission = _admission(config)
    return admission.get("probes") is True and admission.get("paper_exact") is not True


def probe_settings(config: Mapping[str, Any]) -> ProbeSettings:
    """The run's threshold, step budget, seeds a round and run seed (the defaults where its config
    has none), so that each environment plays the seeds its admission would have drawn; no time
    limit beyond the default: after the fact nothing waits on admission."""
    admission = _admission(config)
    threshold = admission.get("probe_threshold")
    steps = admission.get("probe_steps")
    count = admission.get("probe_seeds")
    run = config.get("run")
    seed = run.get("seed") if isinstance(run, Mapping) else None
    return ProbeSettings(threshold=float(threshold) if isinstance(threshold, (int, float)) else DEFAULT_THRESHOLD,
                         max_steps=steps if isinstance(steps, int) and steps >= 1 else DEFAULT_MAX_STEPS,
                         seed_count=count if isinstance(count, int) and count >= 1 else DEFAULT_SEED_COUNT,
                         seed_base=seed if isinstance(seed, int) and not isinstance(seed, bool) else 0)


def run_turn_budget(config: Mapping[str, Any]) -> int | None:
    value = _selfplay(config).get("max_turns")
    return value if isinstance(value, int) and value >= 1 else None


def recorded_verdict(env: Any, config: Mapping[str, Any]) -> DegenerateVerdict:
    """What the run's own admission says about an admitted environment."""
    if getattr(env, "env_source", None) == RLVE:
        return DegenerateVerdict(None, None, reason=NOT_PROBED_RLVE)
    report = (getattr(env, "tool_report", None) or {}).get("probe_report")
    if isinstance(report, Mapping):
        won = report.get("winner") is not None
        return DegenerateVerdict(won, RECORDED, report.get("winner"),
                                 reason="the tool environment's admission report")
    if probes_at_admission(config):
        return DegenerateVerdict(False, RECORDED, reason="admitted by a run whose admission ran the probes")
    return DegenerateVerdict(None, None, reason="the run's admission did not run the probes: spade analyze --probe "
                                                "plays them on the saved environments")


def recorded_verdicts(runs: Sequence[Any]) -> dict[str, DegenerateVerdict]:
    return {env.uid: recorded_verdict(env, run.config) for run in runs for env in run.envs}


async def probe_source(service: Any, source: str, settings: ProbeSettings, max_turns: int | None) -> DegenerateVerdict:
    """Open one saved environment in the sandbox and play the probes (games or tools, as it is)."""
    try:
        env = await service.open(source, max_turns=max_turns)
    except EnvFault as fault:
        return DegenerateVerdict(None, None, reason=f"could not be opened: {fault.error.kind.value}")
    except InfrastructureFault:
        return DegenerateVerdict(None, None, reason="the sandbox failed")
    settings = settings.for_candidate(source)  # the seeds admission drew (or would have drawn) in this run
    try:
        if getattr(env, "tool_use", False):
            await env.reset(seed=settings.seeds[0])
            schemas = await env.tools()
            report = await run_tool_probes(env, schemas.tools, schemas.progress.total, settings, max_turns=max_turns)
        else:
            report = await run_probes(env, settings, max_turns=max_turns)
    except EnvFault as fault:
        return DegenerateVerdict(None, None, reason=f"faulted under the probes: {fault.error.kind.value}")
    except InfrastructureFault:
        return DegenerateVerdict(None, None, reason="the sandbox failed")
    finally:
        try:
            await env.close()
        except (EnvFault, InfrastructureFault):
            pass
    winner = report.winner
    if winner is None:
        what = "no probe policy wins" + (" (the probe budget ran out)" if report.budget_exhausted else "")
        return DegenerateVerdict(False, PROBED, reason=what)
    return DegenerateVerdict(True, PROBED, winner.policy, winner.mean_return,
                             reason=f"'{winner.policy}' ({winner.description}) wins", family=winner.family or None)


def run_probes_after_the_fact(runs: Sequence[Any], sandbox_config: Any = None,
                              only_unknown: Mapping[str, DegenerateVerdict] | None = None
                              ) -> dict[str, DegenerateVerdict]:
    """Probe every saved environment of ``runs`` (rlve problems aside) in a sandbox service started
    here; with ``only_unknown`` (the recorded verdicts), only those whose verdict is unknown.
    Raises SandboxUnavailable when the sandbox cannot start."""
    from ..envs.sandbox.client import SandboxService

    jobs = []
    for run in runs:
        settings, budget = probe_settings(run.config), run_turn_budget(run.config)
        for env in run.envs:
            if env.env_source == RLVE:
                continue
            if only_unknown is not None and only_unknown.get(env.uid, DegenerateVerdict(None, None)).won is not None:
                continue
            jobs.append((env.uid, env.source, settings, budget))

    async def main() -> dict[str, DegenerateVerdict]:
        if not jobs:
            return {}
        semaphore = asyncio.Semaphore(CONCURRENCY)
        async with await SandboxService.start(sandbox_config) as service:
            async def one(uid: str, source: str, settings: ProbeSettings, budget: int | None):
                async with semaphore:
                    return uid, await probe_source(service, source, settings, budget)

            return dict(await asyncio.gather(*(one(*job) for job in jobs)))

    return asyncio.run(main())


def summary(verdicts: Sequence[DegenerateVerdict], rejected_degenerate_win: int) -> dict[str, Any]:
    """A group's numbers: admitted environments with a known verdict, those a degenerate policy
    wins and their share, the candidates admission rejected for it, and where the verdicts came from."""
    known = [v for v in verdicts if v.won is not None]
    won = sum(1 for v in known if v.won)
    sources = sorted({v.source for v in known if v.source})
    families = sorted({v.family for v in known if v.won and v.family})
    return {"degenerate_known": len(known), "degenerate_won": won,
            "degenerate_share": won / len(known) if known else None,
            # the share of environments with a known verdict whose first winning policy is of each family
            "degenerate_share_by_family": {family: sum(1 for v in known if v.won and v.family == family) / len(known)
                                           for family in families},
            "rejected_degenerate_win": rejected_degenerate_win,
            "degenerate_from": "+".join(sources) if sources else None}
