"""Rewards and advantages of both roles (SPEC 1.3 and 1.4). Standard library only.

The agent is scored by the return of each episode and compared with the other plays of the same
environment in the same step (:func:`agent_advantages`). The designer is scored, ``k`` steps after
it wrote an environment, by a blend of how much the hint helped (regret) and how close the no-hint
win rate over the environment's window sits to the learnable middle band (:func:`plateau`); its
advantages are centred per skill and scaled up so that the few designer samples weigh as much as
the many agent samples (:func:`designer_advantages`, :func:`designer_advantage_scale`).

The designer's reward is one small interface, :class:`DesignerReward`: a callable from the
evidence of one environment's window (:class:`DesignerEvidence`: hinted and no-hint returns of the
generation step, no-hint returns of each later step) to a number. A reward that needs the whole
released set and state across regenerations (the paper's learning potential) implements
:class:`SetDesignerReward` instead; :func:`score_released` scores a set with either kind. Four
implementations, chosen by ``RewardSettings.designer_reward`` through :func:`designer_reward_for`:

* ``regret_plateau``: :class:`RegretPlateauReward` (SPEC 1.4, the method);
* ``learning_potential``: :class:`LearningPotentialReward` (the paper's EMA ablation, Eqs. 4-6:
  per-skill EMAs across regenerations, ``lp_gamma_fast`` / ``lp_gamma_slow``; before issue 20 it
  read gamma as a decay, keys ``lp_fast_decay`` / ``lp_slow_decay``);
* ``window_progress``: :class:`WindowProgressReward` (this project's per-environment variant: fast
  and slow EMAs over the steps of one environment's window, ``wp_*`` keys; before issue 15 it was
  called ``learning_potential`` with keys ``lp_fast_alpha``, ``lp_slow_alpha``, ``lp_scale``);
* ``solver_variance``: :class:`SolverVarianceReward` (SPICE's Gaussian of the agent's return
  variance, ``sv_*`` keys).

The raw hint regret is computed in one place, :func:`hint_regret`.

All numbers default to the SPEC values and are gathered in :class:`RewardSettings`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Protocol, get_args

from ..envs.protocol import episode_return

__all__ = [
    "DesignerEvidence",
    "DesignerReward",
    "DesignerRewardName",
    "DESIGNER_REWARDS",
    "LearningPotentialReward",
    "RegretPlateauReward",
    "SetDesignerReward",
    "SolverVarianceReward",
    "WindowProgressReward",
    "designer_reward_for",
    "score_released",
    "upgrade_reward_settings",
    "hint_regret",
    "RewardSettings",
    "agent_advantages",
    "designer_advantage_scale",
    "designer_advantage_weight",
    "designer_advantages",
    "designer_reward",
    "episode_return",
    "plateau",
]

DesignerRewardName = Literal["regret_plateau", "learning_potential", "window_progress", "solver_variance"]
DESIGNER_REWARDS: tuple[str, ...] = get_args(DesignerRewardName)

# Added to the population standard deviation in the agent's z-score (SPEC 1.3).
_STD_EPS = 1e-8


@dataclass(frozen=True)
class RewardSettings:
    """Every number of the reward layer, with the SPEC defaults.

    ``designer_reward`` picks the designer's reward: ``"regret_plateau"`` (SPEC 1.4, the method),
    ``"learning_potential"`` (the paper's EMA ablation, :class:`LearningPotentialReward`, reads
    ``lp_gamma_fast`` / ``lp_gamma_slow``), ``"window_progress"`` (:class:`WindowProgressReward`,
    reads the ``wp_*`` fields) or ``"solver_variance"`` (SPICE, :class:`SolverVarianceReward`,
    reads ``sv_target`` / ``sv_sigma``).
    ``advantage_cap`` caps :func:`designer_advantage_scale`; ``advantage_agent_samples`` is the
    agent-sample count that weight uses (:func:`designer_advantage_weight`).
    """

    # Keys of older spades that a config may not use any more, with what replaces them.
    RETIRED_KEYS: ClassVar[dict[str, str]] = {
        "lp_fast_decay": "retired in issue 20: the learning potential reads gamma as the weight of the new "
                         "value (paper Eq. 4); set lp_gamma_fast (paper 0.98) and lp_gamma_slow (paper 0.85)",
        "lp_slow_decay": "retired in issue 20: the learning potential reads gamma as the weight of the new "
                         "value (paper Eq. 4); set lp_gamma_fast (paper 0.98) and lp_gamma_slow (paper 0.85)",
    }

    regret_scale: float = 0.15
    regret_weight: float = 0.4
    plateau_weight: float = 0.6
    plateau_lo: float = 0.4
    plateau_hi: float = 0.6
    plateau_ramp: float = 0.25
    advantage_cap: float = 50.0
    # The released code's agent samples per step (its global batch); null: this step's agent samples
    advantage_agent_samples: int | None = 192
    designer_reward: DesignerRewardName = "regret_plateau"
    # learning_potential (paper Eq. 4 and its released values): mu <- (1 - gamma) * mu + gamma * r
    lp_gamma_fast: float = 0.98
    lp_gamma_slow: float = 0.85
    # window_progress (this project's choice)
    wp_fast_alpha: float = 0.5
    wp_slow_alpha: float = 0.1
    wp_scale: float = 0.2
    # solver_variance (SPICE: target 0.25, 2 * sigma^2 = 2 * 0.01)
    sv_target: float = 0.25
    sv_sigma: float = 0.1

    def __post_init__(self) -> None:
        if self.designer_reward not in DESIGNER_REWARDS:
            raise ValueError(
                f"designer_reward: {self.designer_reward!r} is not allowed; "
                f"choose one of: {', '.join(DESIGNER_REWARDS)}"
            )
        for name in (
            "regret_scale", "regret_weight", "plateau_weight", "plateau_lo", "plateau_hi",
            "plateau_ramp", "advantage_cap", "lp_gamma_fast", "lp_gamma_slow", "wp_fast_alpha",
            "wp_slow_alpha", "wp_scale", "sv_target", "sv_sigma",
        ):
            value = getattr(self, name)
            _require_finite(value, name)
        _check(self.regret_scale > 0, "regret_scale", "must be > 0")
        _check(self.regret_weight >= 0, "regret_weight", "must be >= 0")
        _check(self.plateau_weight >= 0, "plateau_weight", "must be >= 0")
        _check(self.plateau_lo <= self.plateau_hi, "plateau_lo", "must be <= plateau_hi")
        _check(self.plateau_ramp > 0, "plateau_ramp", "must be > 0")
        _check(self.advantage_cap > 0, "advantage_cap", "must be > 0")
        _check(0 < self.lp_gamma_fast <= 1, "lp_gamma_fast", "must be in (0, 1]")
        _check(0 < self.lp_gamma_slow <= 1, "lp_gamma_slow", "must be in (0, 1]")
        _check(self.lp_gamma_slow < self.lp_gamma_fast, "lp_gamma_fast",
               "must be > lp_gamma_slow (gamma weighs the new value: the fast average takes more of it)")
        _check(self.advantage_agent_samples is None or (
            isinstance(self.advantage_agent_samples, int) and not isinstance(self.advantage_agent_samples, bool)
            and self.advantage_agent_samples >= 1), "advantage_agent_samples",
            f"must be an integer >= 1 or null (count this step's agent samples), got {self.advantage_agent_samples!r}")
        _check(0 < self.wp_slow_alpha <= 1, "wp_slow_alpha", "must be in (0, 1]")
        _check(0 < self.wp_fast_alpha <= 1, "wp_fast_alpha", "must be in (0, 1]")
        _check(self.wp_slow_alpha < self.wp_fast_alpha, "wp_slow_alpha", "must be < wp_fast_alpha")
        _check(self.wp_scale > 0, "wp_scale", "must be > 0")
        _check(self.sv_sigma > 0, "sv_sigma", "must be > 0")

    def blend_kwargs(self) -> dict[str, float]:
        """The keyword arguments of :func:`designer_reward` taken from these settings."""
        return {
            "regret_scale": self.regret_scale,
            "regret_weight": self.regret_weight,
            "plateau_weight": self.plateau_weight,
            "lo": self.plateau_lo,
            "hi": self.plateau_hi,
            "ramp": self.plateau_ramp,
        }


def plateau(win: float, lo: float = 0.4, hi: float = 0.6, ramp: float = 0.25) -> float:
    """1 for ``lo <= win <= hi``, falling linearly to 0 over ``ramp`` on each side.

    So 0 at and beyond ``lo - ramp`` and ``hi + ramp`` (0.15 and 0.85 with the defaults). Raises
    ValueError unless ``lo <= hi``, ``ramp > 0`` and every argument is finite.
    """
    for name, value in (("win", win), ("lo", lo), ("hi", hi), ("ramp", ramp)):
        _require_finite(value, name)
    _check(lo <= hi, "lo", f"must be <= hi (lo={lo}, hi={hi})")
    _check(ramp > 0, "ramp", f"must be > 0, got {ramp}")
    if win < lo:
        return max(0.0, 1.0 - (lo - win) / ramp)
    if win > hi:
        return max(0.0, 1.0 - (win - hi) / ramp)
    return 1.0


def hint_regret(hint_returns: Sequence[float], nohint_returns: Sequence[float]) -> float:
    """The raw hint regret of one environment at its generation step: ``mean(hint) - mean(no hint)``
    (not floored, not normalised). Both lists non-empty and finite (ValueError naming the list)."""
    return _mean(hint_returns, "hint_returns") - _mean(nohint_returns, "nohint_returns")


@dataclass(frozen=True)
class DesignerEvidence:
    """What is known about one environment when its window closes.

    ``hint_returns`` / ``nohint_returns``: the hinted and no-hint plays of the generation step
    ``s``; ``later_returns``: the no-hint plays of each later step ``s+1 .. s+k-1``, in order (a step
    without plays is an empty tuple).
    """

    hint_returns: tuple[float, ...]
    nohint_returns: tuple[float, ...]
    later_returns: tuple[tuple[float, ...], ...] = ()

    @property
    def regret(self) -> float:
        return hint_regret(self.hint_returns, self.nohint_returns)

    @property
    def window_returns(self) -> list[float]:
        """Every no-hint return of the window, step ``s`` first."""
        return list(self.nohint_returns) + [r for step in self.later_returns for r in step]

    @property
    def win(self) -> float:
        """The mean no-hint return over all plays of the window (the plateau's input)."""
        return _mean(self.window_returns, "window")


class DesignerReward(Protocol):
    """A designer reward: the evidence of one environment's window -> one number."""

    def __call__(self, evidence: DesignerEvidence) -> float: ...


@dataclass(frozen=True)
class RegretPlateauReward:
    """SPEC 1.4: ``regret_weight * clip(regret / regret_scale, 0, 1) + plateau_weight * plateau(win)``."""

    regret_scale: float = 0.15
    regret_weight: float = 0.4
    plateau_weight: float = 0.6
    lo: float = 0.4
    hi: float = 0.6
    ramp: float = 0.25

    def __post_init__(self) -> None:
        _require_finite(self.regret_scale, "regret_scale")
        _check(self.regret_scale > 0, "regret_scale", f"must be > 0, got {self.regret_scale}")

    @classmethod
    def from_settings(cls, settings: "RewardSettings") -> "RegretPlateauReward":
        return cls(**settings.blend_kwargs())

    def blend(self, regret: float, win: float) -> float:
        regret_norm = min(1.0, max(0.0, _require_finite(regret, "regret") / self.regret_scale))
        return self.regret_weight * regret_norm + self.plateau_weight * plateau(win, self.lo, self.hi, self.ramp)

    def __call__(self, evidence: DesignerEvidence) -> float:
        return self.blend(evidence.regret, evidence.win)


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
    one step gives 0. The defaults (0.5, 0.1, scale 0.2) are this project's choice. The hinted
    plays do not enter it: this reward replaces the hint-based regret.
    """

    fast_alpha: float = 0.5
    slow_alpha: float = 0.1
    scale: float = 0.2

    def __post_init__(self) -> None:
        for name in ("fast_alpha", "slow_alpha", "scale"):
            _require_finite(getattr(self, name), name)
        if not 0 < self.slow_alpha < self.fast_alpha <= 1:
            raise ValueError(
                f"fast_alpha, slow_alpha: need 0 < slow_alpha < fast_alpha <= 1, "
                f"got {self.slow_alpha}, {self.fast_alpha}"
            )
        if self.scale <= 0:
            raise ValueError(f"scale: must be > 0, got {self.scale}")

    @classmethod
    def from_settings(cls, settings: "RewardSettings") -> "WindowProgressReward":
        return cls(settings.wp_fast_alpha, settings.wp_slow_alpha, settings.wp_scale)

    def progress(self, step_means: Sequence[float]) -> float:
        """The reward from the per-step mean no-hint returns, in step order (non-empty)."""
        if len(step_means) == 0:
            raise ValueError("step_means: empty; at least one step is needed")
        first, *rest = (_require_finite(m, "step_means") for m in step_means)
        fast = slow = first
        for m in rest:
            fast += self.fast_alpha * (m - fast)
            slow += self.slow_alpha * (m - slow)
        return min(1.0, abs(fast - slow) / self.scale)

    def __call__(self, evidence: DesignerEvidence) -> float:
        means = [_mean(evidence.nohint_returns, "nohint_returns")]
        means += [_mean(step, "later_returns") for step in evidence.later_returns if len(step)]
        return self.progress(means)


@dataclass(frozen=True)
class SolverVarianceReward:
    """SPICE's challenger reward applied to an environment (``solver_variance``).

    SPICE (Liu et al. 2025, "SPICE: Self-Play In Corpus Environments Improves Reasoning",
    arXiv 2510.24684, its Challenger reward) scores a generated task by the variance ``var`` of
    the Reasoner's 0/1 results over its attempts with a Gaussian centred on 0.25, the largest
    variance a 0/1 outcome can have (half the attempts right)::

        r = exp(-(var - 0.25)^2 / (2 * 0.01))

    so ``target = 0.25`` and ``sigma = 0.1`` here (both config keys: ``sv_target``, ``sv_sigma``).
    ``var`` is the population variance of every no-hint return of the environment's window (the
    plays the plateau reads); a window of identical returns gives ``exp(-target^2 / (2 sigma^2))``.
    Returns in [-1, 1] can have a variance above 0.25; it is scored by the same Gaussian. SPICE's
    penalty for invalid tasks has no counterpart: only admitted environments are scored.
    """

    target: float = 0.25
    sigma: float = 0.1

    def __post_init__(self) -> None:
        _require_finite(self.target, "target")
        _require_finite(self.sigma, "sigma")
        _check(self.sigma > 0, "sigma", f"must be > 0, got {self.sigma}")

    @classmethod
    def from_settings(cls, settings: "RewardSettings") -> "SolverVarianceReward":
        return cls(settings.sv_target, settings.sv_sigma)

    def of_variance(self, variance: float) -> float:
        return math.exp(-((_require_finite(variance, "variance") - self.target) ** 2) / (2 * self.sigma ** 2))

    def __call__(self, evidence: DesignerEvidence) -> float:
        returns = evidence.window_returns
        mean = _mean(returns, "window")
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

    def __init__(self, gamma_fast: float = 0.98, gamma_slow: float = 0.85) -> None:
        _require_finite(gamma_fast, "gamma_fast")
        _require_finite(gamma_slow, "gamma_slow")
        if not 0 < gamma_slow < gamma_fast <= 1:
            raise ValueError(f"gamma_fast, gamma_slow: need 0 < gamma_slow < gamma_fast <= 1 (gamma weighs the "
                             f"new value), got {gamma_fast}, {gamma_slow}")
        self.gamma_fast = float(gamma_fast)
        self.gamma_slow = float(gamma_slow)
        self.fast: dict[str, float] = {}
        self.slow: dict[str, float] = {}

    @classmethod
    def from_settings(cls, settings: "RewardSettings") -> "LearningPotentialReward":
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
            r = _require_finite(value, "skill_returns")
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
        means = [_mean(returns, "window_returns") for returns in window_returns]
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
        fast = {str(k): _require_finite(v, "fast") for k, v in dict(state.get("fast", {})).items()}
        slow = {str(k): _require_finite(v, "slow") for k, v in dict(state.get("slow", {})).items()}
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


_DESIGNER_REWARDS: dict[str, Callable[["RewardSettings"], "DesignerReward | SetDesignerReward"]] = {
    "regret_plateau": RegretPlateauReward.from_settings,
    "learning_potential": LearningPotentialReward.from_settings,
    "window_progress": WindowProgressReward.from_settings,
    "solver_variance": SolverVarianceReward.from_settings,
}


# Before issue 15 the per-environment EMA reward was called learning_potential, with these keys.
_OLD_KEYS = {"lp_fast_alpha": "wp_fast_alpha", "lp_slow_alpha": "wp_slow_alpha", "lp_scale": "wp_scale"}


def upgrade_reward_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    """A rewards mapping written by an older spade, in today's names (others unchanged).

    Before issue 15 (old keys ``lp_fast_alpha``, ``lp_slow_alpha``, ``lp_scale``): they become
    ``wp_*``, and ``designer_reward: learning_potential`` (which then meant the per-environment
    reward) becomes ``window_progress``. Issues 15-19 (keys ``lp_fast_decay``, ``lp_slow_decay``,
    gamma read as a decay): the same numbers read the paper's way, so that the fast average is
    still the one that moves more: ``lp_gamma_fast`` takes the old ``lp_slow_decay`` (0.98 in
    every recipe) and ``lp_gamma_slow`` the old ``lp_fast_decay`` (0.85). Used to read a run's
    config snapshot and delay buffer when it resumes; a config a user writes gets the
    :attr:`RewardSettings.RETIRED_KEYS` error instead."""
    upgraded = dict(data)
    if set(_OLD_KEYS) & set(upgraded):
        upgraded = {_OLD_KEYS.get(key, key): value for key, value in upgraded.items()}
        if upgraded.get("designer_reward") == "learning_potential":
            upgraded["designer_reward"] = "window_progress"
    if "lp_slow_decay" in upgraded:
        upgraded["lp_gamma_fast"] = upgraded.pop("lp_slow_decay")
    if "lp_fast_decay" in upgraded:
        upgraded["lp_gamma_slow"] = upgraded.pop("lp_fast_decay")
    return upgraded


def designer_reward_for(settings: "RewardSettings") -> "DesignerReward | SetDesignerReward":
    """The designer reward ``settings.designer_reward`` names, built from ``settings`` (a new
    object each call: a :class:`SetDesignerReward` starts with empty state)."""
    return _DESIGNER_REWARDS[settings.designer_reward](settings)


def designer_reward(
    hint_returns: Sequence[float],
    nohint_returns_regen: Sequence[float],
    nohint_returns_window: Sequence[float],
    *,
    regret_scale: float = 0.15,
    regret_weight: float = 0.4,
    plateau_weight: float = 0.6,
    lo: float = 0.4,
    hi: float = 0.6,
    ramp: float = 0.25,
) -> float:
    """The SPEC 1.4 blend for one environment from plain lists (:class:`RegretPlateauReward`).

    ``hint_returns`` / ``nohint_returns_regen``: the plays at the regeneration step ``s``;
    ``nohint_returns_window``: ALL no-hint plays of the window ``s .. s+k-1`` (step ``s`` included).
    Every list must be non-empty and finite: ValueError naming the argument otherwise.
    """
    regret = hint_regret(hint_returns, nohint_returns_regen)
    win = _mean(nohint_returns_window, "nohint_returns_window")
    return RegretPlateauReward(regret_scale, regret_weight, plateau_weight, lo, hi, ramp).blend(regret, win)


def agent_advantages(returns: Sequence[float]) -> list[float]:
    """Z-scores of one environment's plays in one step: ``(r - mean) / (std + 1e-8)``.

    ``std`` is the population standard deviation. Identical returns (including a single play)
    give zeros exactly; an empty list gives an empty list; a non-finite return raises ValueError.
    """
    values = [_require_finite(r, "returns") for r in returns]
    if not values or all(v == values[0] for v in values):
        return [0.0] * len(values)
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    return [(v - mean) / (std + _STD_EPS) for v in values]


def designer_advantages(
    rewards: Sequence[float], skills: Sequence[Hashable], scale: float
) -> list[float]:
    """``scale * (reward - mean reward of the same skill)``, no division by a std (SPEC 1.4).

    ``rewards[i]`` belongs to an environment of skill ``skills[i]``; pass the environments of one
    set (those released together). A skill with one environment gets 0. Lengths must match and
    ``scale`` must be finite and >= 0 (ValueError otherwise).
    """
    if len(rewards) != len(skills):
        raise ValueError(f"rewards and skills differ in length ({len(rewards)} vs {len(skills)})")
    _require_finite(scale, "scale")
    _check(scale >= 0, "scale", f"must be >= 0, got {scale}")
    values = [_require_finite(r, "rewards") for r in rewards]
    groups: dict[Hashable, list[float]] = {}
    for value, skill in zip(values, skills):
        groups.setdefault(skill, []).append(value)
    means = {skill: math.fsum(group) / len(group) for skill, group in groups.items()}
    return [scale * (value - means[skill]) for value, skill in zip(values, skills)]


def designer_advantage_scale(
    n_agent_samples: int, n_designer_samples: int, k: int, cap: float = 50.0
) -> float:
    """``min(cap, n_agent_samples / n_designer_samples * k)`` (SPEC 1.4; the released
    ``compute_env_reward_scale`` in ``spade/core/utils/rewards.py``).

    Weighs the few designer samples (one per environment, once per ``k`` steps) like the many agent
    samples. Raises ValueError unless ``n_designer_samples > 0``, ``n_agent_samples >= 0``,
    ``k >= 1`` and ``cap > 0``. Which agent count goes in: :func:`designer_advantage_weight`.
    """
    _check(n_designer_samples > 0, "n_designer_samples", f"must be > 0, got {n_designer_samples}")
    _check(n_agent_samples >= 0, "n_agent_samples", f"must be >= 0, got {n_agent_samples}")
    _check(k >= 1, "k", f"must be >= 1, got {k}")
    _require_finite(cap, "cap")
    _check(cap > 0, "cap", f"must be > 0, got {cap}")
    return min(float(cap), n_agent_samples / n_designer_samples * k)


def designer_advantage_weight(settings: RewardSettings, n_agent_samples: int, n_designer_samples: int,
                              k: int) -> float:
    """The weight of the designer advantages of one released set (:func:`designer_advantage_scale`).

    The released code divides the number of agent samples of the step by the number of designer
    samples released in it, times ``k``, capped at 50. Its agent samples per step are its global
    batch: it plays every environment ``ceil(192 / 24) = 8`` times (and tops the batch up to 192),
    so the weight is ``192 / 24 * 4 = 32`` for games and ``min(50, 192 / 24 * 8) = 50`` for tool
    use. The paper's text says 16 no-hint plays per environment per step, which is this project's
    default ``g_nohint``; counting those (384 a step) would give ``min(50, 64) = 50`` for games.
    So the agent count is ``settings.advantage_agent_samples``, default 192 (the released global
    batch, whatever ``g_nohint`` is); null counts ``n_agent_samples``, this step's agent samples.
    ``n_designer_samples``: the designer samples released in the step (the set's admitted
    environments), as the released code counts them.
    """
    agents = settings.advantage_agent_samples if settings.advantage_agent_samples is not None else n_agent_samples
    return designer_advantage_scale(agents, n_designer_samples, k, settings.advantage_cap)


def _check(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ValueError(f"{name}: {message}")


def _require_finite(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name}: expected finite numbers, got {value!r}")
    return float(value)


def _mean(values: Sequence[float], name: str) -> float:
    if len(values) == 0:
        raise ValueError(f"{name}: empty; at least one return is needed")
    return math.fsum(_require_finite(v, name) for v in values) / len(values)
