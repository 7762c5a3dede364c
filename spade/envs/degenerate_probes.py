"""Degenerate-policy probes: admission's ``degenerate_probe`` stage (spade's addition, issue 23).

A fixed family of cheap policies that know nothing about the game plays a loaded environment to
the end on a few seeds, through the same checks as training's sandboxed ``reset`` / ``step``. A
game in which one of them reaches a mean return at or above the threshold pays for something
other than skill (a reward for running out of turns, for an unparseable action, a secret shown in
the first observation, ...) and is rejected as ``degenerate_win``.

The family and the loop are :mod:`spade.envs.sandbox.runtime.probe_play` (its docstring lists
them): the sandboxed child plays every episode in one ``probe`` request, replies read by
``parse_action`` and scored by ``episode_return``, the same code as here. This module builds the
request from the settings, finishes the loop when the child was killed on the way (every episode
after that one ends in a fault, as after a failed call), and turns the episodes into the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..agent.actions import parse_action
from .runner import DEFAULT_MAX_TURNS, turn_budget
from .sandbox.client import SandboxedEnv
from .sandbox.runtime.probe_play import (DEFAULT_MAX_SECONDS, DEFAULT_MAX_STEPS, DEFAULT_THRESHOLD, PROBE_SEEDS,
                                         EnvFailed, Episode, ProbeBudget, ProbeOutcome, ProbePlan, ProbePolicy,
                                         ProbeView, cannot_reach, observation_numbers, observation_words, play,
                                         probe_policies, reference_policy)

__all__ = ["DEFAULT_MAX_SECONDS", "DEFAULT_MAX_STEPS", "DEFAULT_THRESHOLD", "PROBE_SEEDS", "PolicyResult",
           "ProbeBudget", "ProbePolicy", "ProbeReport", "ProbeSettings", "ProbeView", "observation_numbers",
           "observation_words", "probe_policies", "run_probes"]

@dataclass(frozen=True)
class ProbeSettings:
    """``threshold``: a policy whose mean return reaches it wins (``selfplay.degenerate_threshold``);
    ``seeds``: the reset seeds each policy plays; ``max_steps``: ``step`` calls over all probes
    (``selfplay.degenerate_probe_steps``); ``max_seconds``: wall-clock time over all probes (a game
    with slow steps is then judged on the policies played, not timed out of admission)."""

    threshold: float = DEFAULT_THRESHOLD
    seeds: tuple[int, ...] = PROBE_SEEDS
    max_steps: int = DEFAULT_MAX_STEPS
    max_seconds: float = DEFAULT_MAX_SECONDS


@dataclass
class PolicyResult:
    policy: str
    description: str
    returns: list[float] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    errors: int = 0  # episodes an environment fault ended (return 0)
    endings: list[str] = field(default_factory=list)  # how each episode ended (probe_play.Episode.ending)

    @property
    def mean_return(self) -> float | None:
        return sum(self.returns) / len(self.returns) if self.returns else None

    def cannot_reach(self, threshold: float, seeds_left: int) -> bool:
        """Even a return of 1.0 on every seed left would keep the mean below ``threshold``."""
        return cannot_reach(self.returns, threshold, seeds_left)

    def to_json(self) -> dict[str, Any]:
        mean = self.mean_return
        data = {"policy": self.policy, "description": self.description,
                "mean_return": None if mean is None else round(mean, 4),
                "returns": [round(r, 4) for r in self.returns], "seeds": list(self.seeds), "errors": self.errors}
        if self.endings:
            data["endings"] = list(self.endings)
        return data


@dataclass
class ProbeReport:
    threshold: float
    turns: int  # the turn budget each episode had
    results: list[PolicyResult] = field(default_factory=list)
    steps: int = 0
    budget_exhausted: bool = False
    winner: PolicyResult | None = None

    def judge(self, result: PolicyResult, budget: ProbeBudget) -> bool:
        """After a policy's episodes: it is the winner when its mean return reaches the threshold.
        True when probing stops (a winner, or the budget ran out)."""
        mean = result.mean_return
        if mean is not None and mean >= self.threshold:
            self.winner = result
        self.steps, self.budget_exhausted = budget.used, budget.exhausted
        return self.winner is not None or budget.exhausted

    def to_json(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "turns": self.turns, "steps": self.steps,
                "budget_exhausted": self.budget_exhausted,
                "winner": None if self.winner is None else self.winner.policy,
                "policies": [result.to_json() for result in self.results]}

    def lines(self) -> list[str]:
        """One line per policy, for ``spade env check``."""
        out = []
        for result in self.results:
            mean = result.mean_return
            shown = (("not played: the probe budget ran out" if self.budget_exhausted and result is self.results[-1]
                      else "not played: the first observation shows no such value") if mean is None
                     else f"mean return {mean:+.3f} over {len(result.returns)} seed(s)")
            flag = "  <- wins" if result is self.winner else ""
            out.append(f"{result.policy:<26} {shown}{flag}")
        if self.budget_exhausted:
            out.append(f"(the probe budget ran out after {self.steps} steps: the policies after this one were not "
                       "played or judged)")
        return out


class _Spent:
    """The budget's state after the probes, for :meth:`ProbeReport.judge`."""

    def __init__(self, used: int, exhausted: bool):
        self.used, self.exhausted = used, exhausted


def probe_plan(settings: ProbeSettings, turns: int) -> ProbePlan:
    """The ``probe`` request for ``settings`` (the call timeouts are filled in by the sandbox)."""
    return ProbePlan(tuple(p.name for p in probe_policies()), tuple(settings.seeds), turns, settings.threshold,
                     settings.max_steps, settings.max_seconds, reset_timeout_s=0.0, step_timeout_s=0.0)


def finish_cut(plan: ProbePlan, episodes: tuple[Episode, ...], kind: str, message: str) -> ProbeOutcome:
    """The outcome of a probe run whose child was killed after reporting ``episodes``: the same
    loop, those episodes taken as played, and every call after them failing with the error. The
    episode after them is the one the kill cut short: it ends ``killed`` (its steps are unknown,
    so not counted)."""
    def failed(_: Any) -> Any:
        raise EnvFailed(kind, message)

    outcome = play(plan, failed, failed, parse_action, prior=episodes, extra=(reference_policy(failed),))
    if len(outcome.episodes) > len(episodes):
        cut = outcome.episodes[len(episodes)]
        outcome.episodes[len(episodes)] = Episode(cut.policy, cut.seed, cut.value, "killed", cut.steps, cut.reply)
    outcome.fault = outcome.fault or (kind, message)
    return outcome


def report_of(outcome: ProbeOutcome, threshold: float, turns: int) -> ProbeReport:
    """The report of a probe run: one :class:`PolicyResult` per policy reached, in order."""
    descriptions = {p.name: p.description for p in probe_policies()}
    report = ProbeReport(threshold, turns)
    for episode in outcome.episodes:
        if not report.results or report.results[-1].policy != episode.policy:
            report.results.append(PolicyResult(episode.policy, descriptions[episode.policy]))
        result = report.results[-1]
        result.endings.append(episode.ending)
        if episode.value is not None:
            result.returns.append(episode.value)
            result.seeds.append(episode.seed)
            result.errors += int(episode.fault)
    spent = _Spent(outcome.steps, outcome.budget_exhausted)
    for result in report.results:  # the loop stopped at the first winner: only the last can be one
        report.judge(result, spent)
    report.steps, report.budget_exhausted = spent.used, spent.exhausted
    return report


async def run_probes(env: SandboxedEnv, settings: ProbeSettings, *, max_turns: int | None = None) -> ProbeReport:
    """Play every probe policy on ``env`` (already loaded) in the sandbox and report each one's
    mean return; the first policy at or above the threshold is the winner (probing stops there).
    Raises EnvFault only for a broken request (the environment's faults are zero returns)."""
    turns = turn_budget(max_turns or DEFAULT_MAX_TURNS, env.max_turns)
    plan = probe_plan(settings, turns)
    run = await env.probe(plan)
    outcome = run.outcome
    if outcome is None:
        assert run.cut is not None
        outcome = finish_cut(plan, run.episodes, run.cut.kind.value, run.cut.message)
    return report_of(outcome, settings.threshold, turns)
