"""Degenerate-policy probes: admission's ``degenerate_probe`` stage (spade's addition, issues 23 and 40).

A family of cheap policies that know nothing about the game plays a loaded environment to the end
on several seeds, through the same checks as training's sandboxed ``reset`` / ``step``. The
policies read the episode as it goes (they copy, list, echo, scan and bisect what the observations
show) but never work out what the game asks. A game in which one of them reaches a mean return at
or above its threshold pays for something other than skill (a reward for running out of turns, a
secret shown in the first observation or printed by a hint, a check that the answer is somewhere
in a long reply, ...) and is rejected as ``degenerate_win``, naming the policy and its family.

The seeds are drawn per candidate (:meth:`ProbeSettings.seeds_for`: from the run's seed and the
candidate's code), so that no fixed secret can happen to match a fixed probe seed, and each verdict
carries the confidence the seeds played give it (:meth:`ProbeReport.confidence`).

The family is :mod:`spade.envs.sandbox.runtime.probe_family` and the loop
:mod:`spade.envs.sandbox.runtime.probe_play`: the sandboxed child plays every episode in one
``probe`` request, replies read by ``parse_action`` and scored by ``episode_return``, the same code
as here. This module builds the request from the settings, finishes the loop when the child was
killed on the way (every episode after that one ends in a fault, as after a failed call), and turns
the episodes into the report.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

from ..agent.actions import parse_action
from .runner import DEFAULT_MAX_TURNS, turn_budget
from .sandbox.client import SandboxedEnv
from .sandbox.runtime.probe_family import SEARCH_THRESHOLD, threshold_for
from .sandbox.runtime.probe_play import (DEFAULT_MAX_SECONDS, DEFAULT_MAX_STEPS, DEFAULT_THRESHOLD, OFFERED_REFERENCE,
                                         PROBE_SEEDS, EnvFailed, Episode, ProbeBudget, ProbeOutcome, ProbePlan,
                                         ProbePolicy, ProbeView, cannot_reach, observation_numbers, observation_words,
                                         play, probe_policies, reference_policy, solution_policy)

__all__ = ["DEFAULT_MAX_SECONDS", "DEFAULT_MAX_STEPS", "DEFAULT_SEED_COUNT", "DEFAULT_THRESHOLD", "PROBE_SEEDS",
           "PolicyResult", "ProbeBudget", "ProbePolicy", "ProbeReport", "ProbeSettings", "ProbeView",
           "SEARCH_THRESHOLD", "derive_probe_seeds", "observation_numbers", "observation_words", "probe_policies",
           "run_probes"]

DEFAULT_SEED_COUNT = 8
DEFAULT_SEED_BASE = 0
# a policy with no positive return on the first seeds is not played on the rest: a policy whose
# true mean return reaches t scores 0 on one seed with probability at most 1 - t (Markov), so two
# screening seeds miss a policy at the threshold 0.5 at most one time in four, and one that wins
# every seed (a leaked secret, a scan that reaches it) never
DEFAULT_SCREEN_SEEDS = 2
# rounds of seed_count seeds drawn: a narrow win on one round is confirmed on the next (probe_play.CONFIRM_MARGIN)
DEFAULT_CONFIRM_ROUNDS = 3


def derive_probe_seeds(seed_base: int, code: str, count: int) -> tuple[int, ...]:
    """``count`` distinct reset seeds for one candidate, drawn from the run's seed and the
    candidate's code: the same candidate in the same run gets the same seeds, another candidate
    or another run others, so no fixed secret can be tuned to them."""
    digest = hashlib.sha256(code.encode("utf-8", "surrogateescape")).hexdigest()
    rng = random.Random(f"probe-seeds:{seed_base}:{digest}")
    return tuple(rng.sample(range(1, 2**31), count))


@dataclass(frozen=True)
class ProbeSettings:
    """``threshold``: a policy whose mean return reaches it wins (``selfplay.admission.probe_threshold``;
    a search family needs :data:`SEARCH_THRESHOLD`); ``seeds``: the reset seeds each policy plays,
    empty (the default) for ``seed_count`` seeds drawn per candidate from ``seed_base`` (the run's
    seed) and its code (``selfplay.admission.probe_seeds``); ``max_steps``: ``step`` calls over all
    probes (``selfplay.admission.probe_steps``); ``max_seconds``: wall-clock time over all probes (a
    game with slow steps is then judged on the policies played, not timed out of admission)."""

    threshold: float = DEFAULT_THRESHOLD
    seeds: tuple[int, ...] = ()
    max_steps: int = DEFAULT_MAX_STEPS
    max_seconds: float = DEFAULT_MAX_SECONDS
    seed_count: int = DEFAULT_SEED_COUNT
    seed_base: int = DEFAULT_SEED_BASE
    screen_seeds: int = DEFAULT_SCREEN_SEEDS
    confirm_rounds: int = DEFAULT_CONFIRM_ROUNDS

    def seeds_for(self, code: str) -> tuple[int, ...]:
        """The seeds this candidate's probes may play: ``seeds`` when given (one round), else
        ``confirm_rounds`` rounds of ``seed_count`` seeds drawn for it."""
        return tuple(self.seeds) or derive_probe_seeds(self.seed_base, code, self.seed_count * self.confirm_rounds)

    @property
    def round_seeds(self) -> int:
        """Seeds per round (0: one round of every seed, as with seeds given)."""
        return self.seed_count if self.confirm_rounds > 1 and len(self.seeds) > self.seed_count else 0

    @property
    def first_round(self) -> tuple[int, ...]:
        """The seeds of the first round: what every policy that is not screened out plays, and the
        winnability stage's seeds."""
        return tuple(self.seeds[:self.round_seeds]) if self.round_seeds else tuple(self.seeds)

    def for_candidate(self, code: str) -> "ProbeSettings":
        return replace(self, seeds=self.seeds_for(code))


def hoeffding_confidence(mean: float, seeds: int, threshold: float) -> float:
    """How sure ``seeds`` episodes with mean return ``mean`` make the verdict on the policy's true
    mean against ``threshold`` (Hoeffding's bound for returns in [0, 1]: the chance of a mean this
    far on the other side of the threshold is at most exp(-2 n d^2))."""
    if seeds <= 0:
        return 0.0
    return 1.0 - math.exp(-2.0 * seeds * (mean - threshold) ** 2)


@dataclass
class PolicyResult:
    policy: str
    description: str
    family: str = ""
    returns: list[float] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    errors: int = 0  # episodes an environment fault ended (return 0)
    endings: list[str] = field(default_factory=list)  # how each episode ended (probe_play.Episode.ending)
    notes: set[str] = field(default_factory=set)  # why episodes were not played (winnability: no actions, no method)

    @property
    def mean_return(self) -> float | None:
        return sum(self.returns) / len(self.returns) if self.returns else None

    def cannot_reach(self, threshold: float, seeds_left: int) -> bool:
        """Even a return of 1.0 on every seed left would keep the mean below ``threshold``."""
        return cannot_reach(self.returns, threshold, seeds_left)

    def to_json(self) -> dict[str, Any]:
        mean = self.mean_return
        data = {"policy": self.policy, "family": self.family, "description": self.description,
                "mean_return": None if mean is None else round(mean, 4),
                "returns": [round(r, 4) for r in self.returns], "seeds": list(self.seeds), "errors": self.errors}
        if self.endings:
            data["endings"] = list(self.endings)
        return data


def _below_confidence(returns: list[float], threshold: float) -> float:
    """How sure ``returns`` make "this policy's true mean is below ``threshold``": Hoeffding's
    bound, or for returns that are all 0 or less the sharper one that a policy whose mean reaches
    t in [0, 1] scores 0 on one seed with probability at most 1 - t (Markov), so on n seeds (1 - t)^n."""
    n = len(returns)
    bound = hoeffding_confidence(sum(returns) / n, n, threshold)
    if all(r <= 0 for r in returns):
        bound = max(bound, 1.0 - (1.0 - threshold) ** n)
    return bound


@dataclass(frozen=True)
class FamilyBest:
    """One family's best policy on a game: its name, mean return and the seeds it played."""

    family: str
    policy: str
    mean_return: float
    seeds: int

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "policy": self.policy, "mean_return": round(self.mean_return, 4),
                "seeds": self.seeds}


@dataclass
class ProbeReport:
    threshold: float
    turns: int
    results: list[PolicyResult] = field(default_factory=list)
    steps: int = 0
    budget_exhausted: bool = False
    winner: PolicyResult | None = None
    seeds: tuple[int, ...] = ()  # the seeds each policy could play
    round_seeds: int = 0  # seeds per round (0: one round of every seed)

    def threshold_of(self, result: PolicyResult) -> float:
        """The mean return at which ``result``'s policy wins (a search family's is higher)."""
        policy = _POLICIES.get(result.policy)
        return self.threshold if policy is None else threshold_for(policy, self.threshold)

    def judge(self, result: PolicyResult, budget: ProbeBudget) -> bool:
        """After a policy's episodes: it is the winner when its mean return reaches its threshold.
        True when probing stops (a winner, or the budget ran out)."""
        mean = result.mean_return
        if mean is not None and mean >= self.threshold_of(result):
            self.winner = result
        self.steps, self.budget_exhausted = budget.used, budget.exhausted
        return self.winner is not None or budget.exhausted

    @property
    def winning_family(self) -> str | None:
        return None if self.winner is None else self.winner.family

    def families(self) -> list[FamilyBest]:
        """Each family's best-scoring policy among those played, in the order families were reached."""
        best: dict[str, FamilyBest] = {}
        for result in self.results:
            mean = result.mean_return
            if mean is None:
                continue
            known = best.get(result.family)
            if known is None or mean > known.mean_return:
                best[result.family] = FamilyBest(result.family, result.policy, mean, len(result.returns))
        return list(best.values())

    def confidence(self) -> float | None:
        """How sure the seeds played make the verdict (:func:`hoeffding_confidence`): for a winner,
        its margin over the stage's threshold (a search family's higher bar only makes the rejection
        more cautious); otherwise the weakest margin below its threshold over the policies played
        (None when none played)."""
        if self.winner is not None:
            mean = self.winner.mean_return
            assert mean is not None
            return hoeffding_confidence(mean, len(self.winner.returns), self.threshold)
        margins = [_below_confidence(r.returns, self.threshold_of(r)) for r in self.results if r.returns]
        return min(margins) if margins else None

    def to_json(self) -> dict[str, Any]:
        confidence = self.confidence()
        return {"threshold": self.threshold, "turns": self.turns, "steps": self.steps,
                "budget_exhausted": self.budget_exhausted, "seeds": list(self.seeds), "round_seeds": self.round_seeds,
                "winner": None if self.winner is None else self.winner.policy,
                "winning_family": self.winning_family,
                "confidence": None if confidence is None else round(confidence, 4),
                "families": [best.to_json() for best in self.families()],
                "policies": [result.to_json() for result in self.results]}

    def lines(self) -> list[str]:
        """One line per family (its best policy and mean return), for ``spade env check``."""
        out = []
        for best in self.families():
            flag = "  <- wins" if self.winner is not None and best.family == self.winner.family else ""
            out.append(f"{best.family:<18} best {best.policy:<24} mean return {best.mean_return:+.3f} over "
                       f"{best.seeds} seed(s){flag}")
        played = {r.family for r in self.results if r.mean_return is not None}
        unplayed = sorted({r.family for r in self.results} - played)
        if unplayed:
            out.append(f"not played (nothing to play on any seed): {', '.join(unplayed)}")
        confidence = self.confidence()
        if confidence is not None:
            verdict = "a policy wins" if self.winner is not None else "no policy wins"
            per_round = self.round_seeds or len(self.seeds)
            out.append(f"verdict: {verdict} ({per_round} seeds a round, {len(self.seeds)} drawn for this candidate; "
                       f"Hoeffding confidence {confidence:.3f})")
        if self.budget_exhausted:
            out.append(f"(the probe budget ran out after {self.steps} steps: the policies after this one were not "
                       "played or judged)")
        return out


_POLICIES = {policy.name: policy for policy in probe_policies()}


class _Spent:
    """The budget's state after the probes, for :meth:`ProbeReport.judge`."""

    def __init__(self, used: int, exhausted: bool):
        self.used, self.exhausted = used, exhausted


def probe_plan(settings: ProbeSettings, turns: int) -> ProbePlan:
    """The ``probe`` request for ``settings`` (the call timeouts are filled in by the sandbox)."""
    return ProbePlan(tuple(p.name for p in probe_policies()), tuple(settings.seeds), turns, settings.threshold,
                     settings.max_steps, settings.max_seconds, reset_timeout_s=0.0, step_timeout_s=0.0,
                     screen_seeds=settings.screen_seeds, round_seeds=settings.round_seeds)


def finish_cut(plan: ProbePlan, episodes: tuple[Episode, ...], kind: str, message: str) -> ProbeOutcome:
    """The outcome of a probe run whose child was killed after reporting ``episodes``: the same
    loop, those episodes taken as played, and every call after them failing with the error. The
    episode after them is the one the kill cut short: it ends ``killed`` (its steps are unknown,
    so not counted)."""
    def failed(_: Any) -> Any:
        raise EnvFailed(kind, message)

    extra = (reference_policy(failed), solution_policy(failed), reference_policy(failed, name=OFFERED_REFERENCE))
    outcome = play(plan, failed, failed, parse_action, prior=episodes, extra=extra)
    if len(outcome.episodes) > len(episodes):
        cut = outcome.episodes[len(episodes)]
        outcome.episodes[len(episodes)] = Episode(cut.policy, cut.seed, cut.value, "killed", cut.steps, cut.reply)
    outcome.fault = outcome.fault or (kind, message)
    return outcome


def report_of(outcome: ProbeOutcome, threshold: float, turns: int, seeds: tuple[int, ...] = (),
              round_seeds: int = 0) -> ProbeReport:
    """The report of a probe run: one :class:`PolicyResult` per policy reached, in order."""
    report = ProbeReport(threshold, turns, seeds=seeds, round_seeds=round_seeds)
    for episode in outcome.episodes:
        if not report.results or report.results[-1].policy != episode.policy:
            policy = _POLICIES[episode.policy]
            report.results.append(PolicyResult(episode.policy, policy.description, policy.family))
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
    mean return; the first policy at or above its threshold is the winner (probing stops there).
    ``settings.seeds`` empty: seeds drawn from its ``seed_base`` and the class name (admission
    passes the seeds it drew from the candidate's code).
    Raises EnvFault only for a broken request (the environment's faults are zero returns)."""
    turns = turn_budget(max_turns or DEFAULT_MAX_TURNS, env.max_turns)
    if not settings.seeds:
        settings = settings.for_candidate(env.class_name or "")
    plan = probe_plan(settings, turns)
    run = await env.probe(plan)
    outcome = run.outcome
    if outcome is None:
        assert run.cut is not None
        outcome = finish_cut(plan, run.episodes, run.cut.kind.value, run.cut.message)
    return report_of(outcome, settings.threshold, turns, tuple(settings.seeds), settings.round_seeds)
