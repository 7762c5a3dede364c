"""Admission's ``reference_policy`` stage: the designer proves its game winnable (issue 23).

With ``selfplay.admission.reference_policy`` on, the games designer prompt asks for a method
``reference_policy(self, observation) -> str`` beside ``reset`` and ``step``
(:data:`spade.designer.prompts.REFERENCE_POLICY_SPEC`). After the degenerate-policy probes, the
sandboxed child plays it on the probes' seeds, in one ``probe`` request through the same loop
(:mod:`spade.envs.sandbox.runtime.probe_play`: each reply read by ``parse_action``, each episode
scored by ``episode_return``, the turn budget and the step and time budgets of the probes). The
game is admitted only when the mean return over every seed reaches ``min_return``
(``selfplay.admission.reference_min_return``, default 0.9); otherwise it is rejected as ``reference_lost``,
and a class without the method as ``reference_missing``. spade's addition, off by default and in
the paper recipes; ``selfplay.admission.paper_exact`` turns it off too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .degenerate_probes import PolicyResult, finish_cut
from .runner import DEFAULT_MAX_TURNS, turn_budget
from .sandbox.client import SandboxedEnv
from .sandbox.runtime.probe_play import (DEFAULT_MAX_SECONDS, DEFAULT_MAX_STEPS, PROBE_SEEDS, REFERENCE_POLICY,
                                         ProbePlan)

DEFAULT_MIN_RETURN = 0.9


@dataclass(frozen=True)
class ReferenceSettings:
    """``min_return``: the mean return over ``seeds`` the reference policy must reach
    (``selfplay.admission.reference_min_return``); ``seeds`` empty (the run's settings): admission plays the
    candidate's first round of probe seeds (issue 40); ``max_steps`` / ``max_seconds``: its step and
    time budgets (the probes' own)."""

    min_return: float = DEFAULT_MIN_RETURN
    seeds: tuple[int, ...] = PROBE_SEEDS
    max_steps: int = DEFAULT_MAX_STEPS
    max_seconds: float = DEFAULT_MAX_SECONDS


@dataclass
class ReferenceReport:
    """The reference policy's episodes and whether it won; ``probes_best_return``: the best mean
    return of a degenerate probe policy on the same game (None when the probes were off)."""

    min_return: float
    turns: int
    seeds: tuple[int, ...]
    result: PolicyResult = field(default_factory=lambda: PolicyResult(REFERENCE_POLICY, "the game's own "
                                                                      "reference_policy(observation)"))
    steps: int = 0
    budget_exhausted: bool = False
    probes_best_return: float | None = None

    @property
    def mean_return(self) -> float | None:
        return self.result.mean_return

    @property
    def won(self) -> bool:
        """Played on every seed, with a mean return at or above ``min_return``."""
        mean = self.mean_return
        return mean is not None and len(self.result.returns) == len(self.seeds) and mean >= self.min_return

    def message(self) -> str:
        """Why the reference policy lost, for the ``reference_lost`` rejection."""
        played = self.result
        if not played.returns:
            return "the reference policy was not played: the probe budget ran out"
        cut = " (the step or time budget ran out before every seed was played)" if self.budget_exhausted else ""
        return (f"the game's reference_policy() reaches a mean return of {played.mean_return:.3f} over seeds "
                f"{played.seeds} (returns {[round(r, 3) for r in played.returns]}, episodes ending "
                f"{played.endings}){cut}; it must reach {self.min_return:g} on every seed of {list(self.seeds)}")

    def to_json(self) -> dict[str, Any]:
        return {"min_return": self.min_return, "turns": self.turns, "won": self.won, "steps": self.steps,
                "budget_exhausted": self.budget_exhausted, "probes_best_return": self.probes_best_return,
                **{key: value for key, value in self.result.to_json().items() if key not in ("policy", "description")}}


async def run_reference(env: SandboxedEnv, settings: ReferenceSettings, *,
                        max_turns: int | None = None) -> ReferenceReport:
    """Play ``env``'s reference policy in the sandbox. Raises EnvFault (kind ``reference_missing``)
    for a class without the method, and the environment's earlier fault if it has failed."""
    turns = turn_budget(max_turns or DEFAULT_MAX_TURNS, env.max_turns)
    plan = ProbePlan((REFERENCE_POLICY,), tuple(settings.seeds), turns, settings.min_return, settings.max_steps,
                     settings.max_seconds, reset_timeout_s=0.0, step_timeout_s=0.0)
    run = await env.probe(plan)
    outcome = run.outcome
    if outcome is None:
        assert run.cut is not None
        outcome = finish_cut(plan, run.episodes, run.cut.kind.value, run.cut.message)
    report = ReferenceReport(settings.min_return, turns, tuple(settings.seeds), steps=outcome.steps,
                             budget_exhausted=outcome.budget_exhausted)
    for episode in outcome.episodes:
        report.result.endings.append(episode.ending)
        if episode.value is not None:
            report.result.returns.append(episode.value)
            report.result.seeds.append(episode.seed)
            report.result.errors += int(episode.fault)
    return report
