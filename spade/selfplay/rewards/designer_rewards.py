"""The designer's rewards (SPEC 1.4 and its alternatives). Standard library only.

The designer is scored ``k`` steps after it wrote an environment. The method's reward is a blend
of how much the hint helped (regret, :func:`hint_regret`) and how close the no-hint win rate over
the environment's window sits to the learnable middle band (:func:`plateau`). The advantages made
from these rewards are ``advantages.py``.

The designer's reward is one small interface, :class:`DesignerReward`: a callable from the
evidence of one environment's window (:class:`DesignerEvidence`: hinted and no-hint returns of the
generation step, no-hint returns of each later step) to a number. A reward that needs the whole
released set and state across regenerations (the paper's learning potential) implements
:class:`SetDesignerReward` instead; :func:`score_released` scores a set with either kind. Five
implementations, chosen by ``RewardSettings.designer_reward`` through :func:`designer_reward_for`:

* ``regret_plateau``: :class:`RegretPlateauReward` (SPEC 1.4, the method);
* ``regret_released``: :class:`ReleasedRegretReward` (the released code's
  ``--spade-env-reward-variant regret_based``: hinted mean minus the window's no-hint mean, floored at 0);
* ``learning_potential``: :class:`LearningPotentialReward` (the paper's EMA ablation, Eqs. 4-6:
  per-skill EMAs across regenerations, ``lp_gamma_fast`` / ``lp_gamma_slow``; before issue 20 it
  read gamma as a decay, keys ``lp_fast_decay`` / ``lp_slow_decay``);
* ``window_progress``: :class:`WindowProgressReward` (this project's per-environment variant: fast
  and slow EMAs over the steps of one environment's window, ``wp_*`` keys; before issue 15 it was
  called ``learning_potential`` with keys ``lp_fast_alpha``, ``lp_slow_alpha``, ``lp_scale``);
* ``solver_variance``: :class:`SolverVarianceReward` (SPICE's Gaussian of the agent's return
  variance, ``sv_*`` keys).

Every number comes from :class:`~spade.selfplay.rewards.reward_settings.RewardSettings` (``from_settings``),
the one place its default is written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from .reward_checks import check, finite_mean, require_finite
from .reward_settings import RewardSettings


def plateau(win: float, lo: float, hi: float, ramp: float) -> float:
    """1 for ``lo <= win <= hi``, falling linearly to 0 over ``ramp`` on each side.

    So 0 at and beyond ``lo - ramp`` and ``hi + ramp`` (0.15 and 0.85 with SPEC 1.4's band). Raises
    ValueError unless ``lo <= hi``, ``ramp > 0`` and every argument is finite.
    """
    for name, value in (("win", win), ("lo", lo), ("hi", hi), ("ramp", ramp)):
        require_finite(value, name)
    check(lo <= hi, "lo", f"must be <= hi (lo={lo}, hi={hi})")
    check(ramp > 0, "ramp", f"must be > 0, got {ramp}")
    if win < lo:
        return max(0.0, 1.0 - (lo - win) / ramp)
    if win > hi:
        return max(0.0, 1.0 - (win - hi) / ramp)
    return 1.0


def hint_regret(hint_returns: Sequence[float], nohint_returns: Sequence[float]) -> float:
    """The raw hint regret of one environment at its generation step: ``mean(hint) - mean(no hint)``
    (not floored, not normalised). Both lists non-empty and finite (ValueError naming the list)."""
    return finite_mean(hint_returns, "hint_returns") - finite_mean(nohint_returns, "nohint_returns")


@dataclass(frozen=True)
class DesignerEvidence:
    """What is known about one environment when its window closes.

    ``hint_returns`` / ``nohint_returns``: the hinted and no-hint plays of the generation step
    ``s``; ``later_returns``: the no-hint plays of each later step ``s+1 .. s+k-1``, in order (a step
    without plays is an empty tuple). ``hint_failed``: the environment got no hint (every hint call
    failed) and is scored anyway, its hinted mean read as 0 (``RewardSettings.failed_hint``).
    ``step_timeout``: the environment's load, reset or step timed out in a play of step ``s``
    (either arm), read by ``RewardSettings.step_timeout_penalty``.
    """

    hint_returns: tuple[float, ...]
    nohint_returns: tuple[float, ...]
    later_returns: tuple[tuple[float, ...], ...] = ()
    hint_failed: bool = False  # no hint (failed_hint: hint_return_zero): hint_returns is empty
    step_timeout: bool = False

    @property
    def regret(self) -> float:
        """The raw hint regret; for a failed hint (kept by ``failed_hint: hint_return_zero``) the
        hinted mean counts as 0, as the released code reads it."""
        if self.hint_failed and not self.hint_returns:
            return 0.0 - finite_mean(self.nohint_returns, "nohint_returns")
        return hint_regret(self.hint_returns, self.nohint_returns)

    @property
    def window_returns(self) -> list[float]:
        """Every no-hint return of the window, step ``s`` first."""
        return list(self.nohint_returns) + [r for step in self.later_returns for r in step]

    @property
    def win(self) -> float:
        """The mean no-hint return over all plays of the window (the plateau's input)."""
        return finite_mean(self.window_returns, "window")


class DesignerReward(Protocol):
    """A designer reward: the evidence of one environment's window -> one number."""

    def __call__(self, evidence: DesignerEvidence) -> float: ...


@dataclass(frozen=True)
class RegretPlateauReward:
    """SPEC 1.4: ``regret_weight * clip(regret / regret_scale, 0, 1) + plateau_weight * plateau(win)``."""

    regret_scale: float
    regret_weight: float
    plateau_weight: float
    lo: float
    hi: float
    ramp: float

    def __post_init__(self) -> None:
        require_finite(self.regret_scale, "regret_scale")
        check(self.regret_scale > 0, "regret_scale", f"must be > 0, got {self.regret_scale}")

    @classmethod
    def from_settings(cls, settings: RewardSettings) -> "RegretPlateauReward":
        return cls(settings.regret_scale, settings.regret_weight, settings.plateau_weight, settings.plateau_lo,
                   settings.plateau_hi, settings.plateau_ramp)

    def blend(self, regret: float, win: float) -> float:
        regret_norm = min(1.0, max(0.0, require_finite(regret, "regret") / self.regret_scale))
        return self.regret_weight * regret_norm + self.plateau_weight * plateau(win, self.lo, self.hi, self.ramp)

    def __call__(self, evidence: DesignerEvidence) -> float:
        return self.blend(evidence.regret, evidence.win)


@dataclass(frozen=True)
class ReleasedRegretReward:
    """The released ``--spade-env-reward-variant regret_based`` (``regret_released``).

    ``max(0, mean(hinted returns of step s) - mean(every no-hint return of the window s .. s+k-1))``:
    no scale, no cap, no plateau. Released code (spade-rl/spade 9b2b813):
    ``spade/core/utils/delayed_env_rewards.py:343-348`` (``r_hint`` cached at the regeneration step,
    ``r_no_hint`` the mean of the accumulated plays, ``raw = max(0.0, regret)``); the plays are every
    agent play of the regeneration epoch, keyed by step (``spade/slime/spade_rollout.py:530-537``,
    popped whole at ``:589-592``, flattened at ``:634``); ``r_hint`` is the hinted plays' mean
    (``spade/core/orchestrator.py:1980``, cached at ``spade/slime/spade_rollout.py:540-546``). A
    negative regret is floored to 0 and the sample is kept (``delayed_env_rewards.py:347``: "floor it
    without dropping the sample"); ``proposer_masked``, which ``spade_rollout.py:660`` drops, is set
    only by the blend variant (``delayed_env_rewards.py:527``). ``--spade-use-solver-variance-reward``
    is not passed to this path (``spade_rollout.py:635-640``; only the learning-potential path reads
    it, ``:648``). Centring per skill and the advantage weight are :mod:`advantages` as for every
    reward (released: ``delayed_env_rewards.py:45-62`` and ``compute_env_reward_scale``). A missing
    hint reads as a hinted mean of 0 (``delayed_env_rewards.py:343``, ``failed_hint: hint_return_zero``).
    ``step_timeout_penalty`` (``RewardSettings``; released -0.5, ``delayed_env_rewards.py:336-340``):
    the reward of an environment whose load, reset or step timed out in a play of its generation
    step (``DesignerEvidence.step_timeout``), in place of its regret; None: no such case.
    """

    step_timeout_penalty: float | None = None

    @classmethod
    def from_settings(cls, settings: RewardSettings) -> "ReleasedRegretReward":
        return cls(settings.step_timeout_penalty)

    def __call__(self, evidence: DesignerEvidence) -> float:
        if evidence.step_timeout and self.step_timeout_penalty is not None:
            return float(self.step_timeout_penalty)
        if evidence.hint_failed and not evidence.hint_returns:
            hint_mean = 0.0
        else:
            hint_mean = finite_mean(evidence.hint_returns, "hint_returns")
        return max(0.0, hint_mean - evidence.win)


@dataclass(frozen=True)
class WindowProgressReward:
    """How fast the agent's results on one environment move over its window (``window_progress``).

    This project's per-environment variant of an EMA reward (called ``learning_potential`` before
    the paper's own definition, :class:`LearningPotentialReward`, was added). For one environment,
    take the per-step mean no-hint return over its window in step order, ``m_0`` (step ``s``),
    ``m_1``, ... (steps with no plays are skipped). Start two exponential moving averages at
    ``fast = slow = m_0`` and for every later mean ``m``::

        fast += fast_alpha * (m - fast)
        slow += slow_alpha * (m - slow)

    The reward is ``min(1, |fast - slow| / scale)``: how fast the agent's performance on the
    environment is moving (in either direction) at the end of the window, in [0, 1]. A window of
    one step gives 0. The settings' defaults (0.5, 0.1, scale 0.2) are this project's choice. The
    hinted plays do not enter it: this reward replaces the hint-based regret.
    """

    fast_alpha: float
    slow_alpha: float
    scale: float

    def __post_init__(self) -> None:
        for name in ("fast_alpha", "slow_alpha", "scale"):
            require_finite(getattr(self, name), name)
        if not 0 < self.slow_alpha < self.fast_alpha <= 1:
            raise ValueError(
                f"fast_alpha, slow_alpha: need 0 < slow_alpha < fast_alpha <= 1, "
                f"got {self.slow_alpha}, {self.fast_alpha}"
            )
        if self.scale <= 0:
            raise ValueError(f"scale: must be > 0, got {self.scale}")

    @classmethod
    def from_settings(cls, settings: RewardSettings) -> "WindowProgressReward":
        return cls(settings.wp_fast_alpha, settings.wp_slow_alpha, settings.wp_scale)

    def progress(self, step_means: Sequence[float]) -> float:
        """The reward from the per-step mean no-hint returns, in step order (non-empty)."""
        if len(step_means) == 0:
            raise ValueError("step_means: empty; at least one step is needed")
        first, *rest = (require_finite(m, "step_means") for m in step_means)
        fast = slow = first
        for m in rest:
            fast += self.fast_alpha * (m - fast)
            slow += self.slow_alpha * (m - slow)
        return min(1.0, abs(fast - slow) / self.scale)

    def __call__(self, evidence: DesignerEvidence) -> float:
        means = [finite_mean(evidence.nohint_returns, "nohint_returns")]
        means += [finite_mean(step, "later_returns") for step in evidence.later_returns if len(step)]
        return self.progress(means)


@dataclass(frozen=True)
class SolverVarianceReward:
    """SPICE's challenger reward applied to an environment (``solver_variance``).

    SPICE (Liu et al. 2025, "SPICE: Self-Play In Corpus Environments Improves Reasoning",
    arXiv 2510.24684, its Challenger reward) scores a generated task by a Gaussian-shaped
    function of the variance ``var`` of the Reasoner's 0/1 results over its attempts, highest
    when half the attempts are right (a variance of 0.25, the largest a 0/1 outcome can have).
    Here::

        r = exp(-(var - target)^2 / (2 * sigma^2))

    with ``target = 0.25`` and ``sigma = 0.1`` (config keys ``sv_target``, ``sv_sigma``); the
    width was written from memory of the paper and is not verified against its text
    (docs/fidelity.md, "SPICE").
    ``var`` is the population variance of every no-hint return of the environment's window (the
    plays the plateau reads); a window of identical returns gives ``exp(-target^2 / (2 sigma^2))``.
    Returns in [-1, 1] can have a variance above 0.25; it is scored by the same Gaussian. SPICE's
    penalty for invalid tasks is not this reward's: ``selfplay.env_source: spice`` hands a rejected
    question's call to the delay buffer with a fixed ``penalty`` (``selfplay.spice.invalid_penalty``),
    which the buffer leaves out of this reward's set.
    """

    target: float
    sigma: float

    def __post_init__(self) -> None:
        require_finite(self.target, "target")
        require_finite(self.sigma, "sigma")
        check(self.sigma > 0, "sigma", f"must be > 0, got {self.sigma}")

    @classmethod
    def from_settings(cls, settings: RewardSettings) -> "SolverVarianceReward":
        return cls(settings.sv_target, settings.sv_sigma)

    def of_variance(self, variance: float) -> float:
        return math.exp(-((require_finite(variance, "variance") - self.target) ** 2) / (2 * self.sigma ** 2))

    def __call__(self, evidence: DesignerEvidence) -> float:
        returns = evidence.window_returns
        mean = finite_mean(returns, "window")
        return self.of_variance(math.fsum((r - mean) ** 2 for r in returns) / len(returns))


class SetDesignerReward(Protocol):
    """A designer reward that scores the environments released together, with state that lasts
    across regenerations (and is checkpointed: :meth:`state_dict`, :meth:`load_state_dict`)."""

    def score_set(self, skills: Sequence[str], evidence: Sequence[DesignerEvidence]) -> list[float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class LearningPotentialReward:
    """The paper's learning-potential designer reward (its Eqs. 4-6; ``learning_potential``).

    Per skill ``c`` the run keeps a fast and a slow exponential moving average of the agent's
    return, updated once per released set (when the set's window closes, before its rewards are
    read)::

        mu_fast_c <- (1 - gamma_fast) * mu_fast_c + gamma_fast * r_c
        mu_slow_c <- (1 - gamma_slow) * mu_slow_c + gamma_slow * r_c        (Eq. 4)
        reward_e   = |R_e - mu_slow_c|   for environment e of skill c

    ``gamma`` weighs the NEW value, as the paper writes Eq. 4 and its released
    ``learning_potential.py`` computes it: with ``gamma_fast`` 0.98 > ``gamma_slow`` 0.85 a new
    set moves the fast average by 98% and the slow one by 85%. ``R_e`` is the environment's mean
    no-hint return over its window (the plateau's ``win``); ``r_c`` is the mean of every no-hint
    return of the window over the set's environments of skill ``c`` (the plays pooled, as the
    released code pools them, so an environment with fewer plays weighs less). A skill seen for
    the first time starts both averages at its ``r_c`` (so its first set is scored against its own
    mean). The reward is the raw distance; centring per skill and the advantage weight are
    :func:`designer_advantages`. The gap ``|mu_fast - mu_slow| / (2 (gamma_fast - gamma_slow))``
    (:meth:`potential`) is the released code's monitored learning potential: logged, not a reward.
    The hinted plays do not enter it.
    """

    def __init__(self, gamma_fast: float, gamma_slow: float) -> None:
        require_finite(gamma_fast, "gamma_fast")
        require_finite(gamma_slow, "gamma_slow")
        if not 0 < gamma_slow < gamma_fast <= 1:
            raise ValueError(f"gamma_fast, gamma_slow: need 0 < gamma_slow < gamma_fast <= 1 (gamma weighs the "
                             f"new value), got {gamma_fast}, {gamma_slow}")
        self.gamma_fast = float(gamma_fast)
        self.gamma_slow = float(gamma_slow)
        self.fast: dict[str, float] = {}
        self.slow: dict[str, float] = {}

    @classmethod
    def from_settings(cls, settings: RewardSettings) -> "LearningPotentialReward":
        return cls(settings.lp_gamma_fast, settings.lp_gamma_slow)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LearningPotentialReward):
            return NotImplemented
        return (self.gamma_fast, self.gamma_slow, self.fast, self.slow) == \
            (other.gamma_fast, other.gamma_slow, other.fast, other.slow)

    def __repr__(self) -> str:
        return (f"LearningPotentialReward(gamma_fast={self.gamma_fast}, gamma_slow={self.gamma_slow}, "
                f"fast={self.fast}, slow={self.slow})")

    def update(self, skill_returns: Mapping[str, float]) -> None:
        """Eq. 4 for each skill of one set, given its ``r_c``."""
        for skill, value in skill_returns.items():
            r = require_finite(value, "skill_returns")
            if skill not in self.slow:
                self.fast[skill] = self.slow[skill] = r
            else:
                self.fast[skill] = (1 - self.gamma_fast) * self.fast[skill] + self.gamma_fast * r
                self.slow[skill] = (1 - self.gamma_slow) * self.slow[skill] + self.gamma_slow * r

    def potential(self, skill: str) -> float:
        """The released code's monitored learning potential of ``skill`` (0 before its first set)."""
        if skill not in self.slow:
            return 0.0
        return abs(self.fast[skill] - self.slow[skill]) / (2 * (self.gamma_fast - self.gamma_slow))

    def score_returns(self, skills: Sequence[str], window_returns: Sequence[Sequence[float]]) -> list[float]:
        """Update with one set (``window_returns[i]``: every no-hint return of the window of an
        environment of ``skills[i]``, non-empty) and return each environment's ``|R_e - mu_slow_c|``."""
        if len(skills) != len(window_returns):
            raise ValueError(f"skills and window_returns differ in length ({len(skills)} vs {len(window_returns)})")
        means = [finite_mean(returns, "window_returns") for returns in window_returns]
        pooled: dict[str, list[float]] = {}
        for skill, returns in zip(skills, window_returns):
            pooled.setdefault(skill, []).extend(float(r) for r in returns)
        self.update({skill: math.fsum(plays) / len(plays) for skill, plays in pooled.items()})
        return [abs(mean - self.slow[skill]) for skill, mean in zip(skills, means)]

    def score_set(self, skills: Sequence[str], evidence: Sequence[DesignerEvidence]) -> list[float]:
        return self.score_returns(skills, [e.window_returns for e in evidence])

    def state_dict(self) -> dict[str, Any]:
        return {"fast": dict(self.fast), "slow": dict(self.slow)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The per-skill averages (a checkpoint written before issue 20, when gamma was read as a
        decay, has the same form: its averages are taken over and updated the paper's way on)."""
        fast = {str(k): require_finite(v, "fast") for k, v in dict(state.get("fast", {})).items()}
        slow = {str(k): require_finite(v, "slow") for k, v in dict(state.get("slow", {})).items()}
        if set(fast) != set(slow):
            raise ValueError(f"learning-potential state: the fast and slow averages name different skills "
                             f"({sorted(fast)} vs {sorted(slow)})")
        self.fast, self.slow = fast, slow


def score_released(reward: "DesignerReward | SetDesignerReward", skills: Sequence[str],
                   evidence: Sequence[DesignerEvidence]) -> list[float]:
    """The rewards of the environments of one released set, with either kind of designer reward."""
    if len(skills) != len(evidence):
        raise ValueError(f"skills and evidence differ in length ({len(skills)} vs {len(evidence)})")
    score_set = getattr(reward, "score_set", None)
    if score_set is not None:
        return list(score_set(skills, evidence))
    return [reward(e) for e in evidence]


_DESIGNER_REWARDS: dict[str, Callable[[RewardSettings], "DesignerReward | SetDesignerReward"]] = {
    "regret_plateau": RegretPlateauReward.from_settings,
    "regret_released": ReleasedRegretReward.from_settings,
    "learning_potential": LearningPotentialReward.from_settings,
    "window_progress": WindowProgressReward.from_settings,
    "solver_variance": SolverVarianceReward.from_settings,
}


def designer_reward_for(settings: RewardSettings) -> "DesignerReward | SetDesignerReward":
    """The designer reward ``settings.designer_reward`` names, built from ``settings`` (a new
    object each call: a :class:`SetDesignerReward` starts with empty state)."""
    return _DESIGNER_REWARDS[settings.designer_reward](settings)
