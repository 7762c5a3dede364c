"""Admission's ``winnability`` stage: a game nobody can win teaches nothing (spade's addition, issue 40).

No degenerate probe can see a game that cannot be won (one that never sets ``terminated`` on
success, a goal out of reach): every probe loses it, as a skilled player would. The stage uses what
the designer already writes. After each reset of the probes' seeds, the sandboxed child plays

* ``solution``: the actions ``solution()`` returns (a list of strings, or text whose
  ``\\boxed{...}`` parts are the actions; the games contract asks for the method), in order;
* ``offered_reference_policy``: the class's optional ``reference_policy(observation)``, where it has one,

through the probes' loop (:mod:`spade.envs.sandbox.runtime.probe_play`: replies read by
``parse_action``, episodes scored by ``episode_return``, the probes' turn, step and time budgets).
The game is **won** when one of them reaches a mean return of ``min_return`` over every seed; it
is rejected as ``unwinnable`` when something was offered and nothing won. When the designer offered
only a description (``solution()`` returns prose, raises ``NotImplementedError``, or is missing, and
no ``reference_policy``), the verdict is **unproven**: admitted under ``unproven: admit`` (the
default, as today's contract allows a description), rejected as ``unwinnable`` under ``reject``.
``selfplay.admission.winnability_gate`` turns the stage on (spade's GPU recipes), ``selfplay.admission.winnability_unproven``
picks the rule; ``selfplay.admission.paper_exact`` turns it off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .degenerate_probes import DEFAULT_MAX_SECONDS, DEFAULT_MAX_STEPS, PolicyResult, finish_cut
from .reference_policy import DEFAULT_MIN_RETURN
from .runner import DEFAULT_MAX_TURNS, turn_budget
from .sandbox.client import SandboxedEnv
from .sandbox.runtime.probe_play import UNPLAYED, WINNABILITY_POLICIES, ProbePlan

Unproven = Literal["admit", "reject"]
UNPROVEN_RULES: tuple[str, ...] = ("admit", "reject")
WON, LOST, UNPROVEN = "won", "lost", "unproven"


@dataclass(frozen=True)
class WinnabilitySettings:
    """``min_return``: the mean return over every seed a proof must reach
    (``selfplay.admission.reference_min_return``); ``unproven``: what a game whose designer offered no
    playable proof gets (``selfplay.admission.winnability_unproven``); the step and time budgets are the probes'."""

    min_return: float = DEFAULT_MIN_RETURN
    unproven: Unproven = "admit"
    max_steps: int = DEFAULT_MAX_STEPS
    max_seconds: float = DEFAULT_MAX_SECONDS


@dataclass
class WinnabilityReport:
    min_return: float
    turns: int
    seeds: tuple[int, ...]
    results: list[PolicyResult] = field(default_factory=list)
    steps: int = 0
    budget_exhausted: bool = False
    fault: tuple[str, str] | None = None  # the first environment fault (kind, message)

    def offered(self) -> list[PolicyResult]:
        """The proofs the designer offered: the policies that played at least one episode."""
        return [r for r in self.results if r.returns]

    def winner(self) -> PolicyResult | None:
        for result in self.offered():
            mean = result.mean_return
            if mean is not None and len(result.returns) == len(self.seeds) and mean >= self.min_return:
                return result
        return None

    @property
    def verdict(self) -> str:
        if self.winner() is not None:
            return WON
        return LOST if self.offered() else UNPROVEN

    def why_unproven(self) -> str:
        notes = sorted({note for r in self.results for note in r.notes})
        return "; ".join(notes) or "the designer offered no solution() actions and no reference_policy()"

    def message(self) -> str:
        """Why the game is rejected as ``unwinnable``."""
        if self.verdict == UNPROVEN:
            return (f"no playable proof that the game can be won ({self.why_unproven()}); "
                    "selfplay.admission.winnability_unproven: reject asks every game for one")
        parts = []
        for result in self.offered():
            parts.append(f"{result.policy} reaches a mean return of {result.mean_return:.3f} over seeds {result.seeds} "
                         f"(returns {[round(r, 3) for r in result.returns]}, episodes ending {result.endings})")
        fault = "" if self.fault is None else f"; the game failed on the way ({self.fault[0]}: {self.fault[1]})"
        cut = " (the step or time budget ran out)" if self.budget_exhausted else ""
        return (f"what the designer offered does not win the game: {'; '.join(parts)}{cut}{fault}; a proof must "
                f"reach {self.min_return:g} on every seed of {list(self.seeds)}")[:2_000]

    def to_json(self) -> dict[str, Any]:
        winner = self.winner()
        return {"verdict": self.verdict, "min_return": self.min_return, "turns": self.turns, "seeds": list(self.seeds),
                "steps": self.steps, "budget_exhausted": self.budget_exhausted,
                "won_by": None if winner is None else winner.policy,
                "unproven": self.why_unproven() if self.verdict == UNPROVEN else None,
                "policies": [r.to_json() for r in self.results]}

    def lines(self) -> list[str]:
        out = []
        for result in self.results:
            mean = result.mean_return
            shown = ("not offered: " + (", ".join(sorted(result.notes)) or "nothing to play")) if mean is None \
                else f"mean return {mean:+.3f} over {len(result.returns)} seed(s)"
            flag = "  <- wins" if result is self.winner() else ""
            out.append(f"{result.policy:<26} {shown}{flag}")
        out.append(f"verdict: {self.verdict}")
        return out


async def run_winnability(env: SandboxedEnv, settings: WinnabilitySettings, seeds: tuple[int, ...], *,
                          max_turns: int | None = None) -> WinnabilityReport:
    """Play the designer's proofs on ``env`` (already loaded) in the sandbox, on ``seeds``."""
    turns = turn_budget(max_turns or DEFAULT_MAX_TURNS, env.max_turns)
    plan = ProbePlan(WINNABILITY_POLICIES, tuple(seeds), turns, settings.min_return, settings.max_steps,
                     settings.max_seconds, reset_timeout_s=0.0, step_timeout_s=0.0)
    run = await env.probe(plan)
    outcome = run.outcome
    if outcome is None:
        assert run.cut is not None
        outcome = finish_cut(plan, run.episodes, run.cut.kind.value, run.cut.message)
    report = WinnabilityReport(settings.min_return, turns, tuple(seeds), steps=outcome.steps,
                               budget_exhausted=outcome.budget_exhausted, fault=outcome.fault)
    described = {"solution": "the actions solution() returns after each reset",
                 "offered_reference_policy": "the game's own reference_policy(observation)"}
    for episode in outcome.episodes:
        if not report.results or report.results[-1].policy != episode.policy:
            report.results.append(PolicyResult(episode.policy, described.get(episode.policy, episode.policy),
                                               "winnability"))
        result = report.results[-1]
        result.endings.append(episode.ending)
        if episode.value is not None:
            result.returns.append(episode.value)
            result.seeds.append(episode.seed)
            result.errors += int(episode.fault)
        elif episode.ending in UNPLAYED and episode.ending != "budget":
            result.notes.add(f"{episode.policy}: {episode.reply or episode.ending}")
    return report
