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
  per-skill EMAs across regenerations, ``lp_*`` keys);
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
from typing import Any, Callable, Literal, Protocol, get_args

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
    ``lp_fast_decay`` / ``lp_slow_decay``), ``"window_progress"`` (:class:`WindowProgressReward`,
    reads the ``wp_*`` fields) or ``"solver_variance"`` (SPICE, :class:`SolverVarianceReward`,
    reads ``sv_target`` / ``sv_sigma``).
    ``advantage_cap`` caps :func:`designer_advantage_scale`.
    """

    regret_scale: float = 0.15
    regret_weight: float = 0.4
    plateau_weight: float = 0.6
    plateau_lo: float = 0.4
    plateau_hi: float = 0.6
    plateau_ramp: float = 0.25
    advantage_cap: float = 50.0
    designer_reward: DesignerRewardName = "regret_plateau"
    # learning_potential (the paper's released values): ema <- decay * ema + (1 - decay) * x
    lp_fast_decay: float = 0.85
    lp_slow_decay: float = 0.98
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
            "plateau_ramp", "advantage_cap", "lp_fast_decay", "lp_slow_decay", "wp_fast_alpha",
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
        _check(0 <= self.lp_fast_decay < 1, "lp_fast_decay", "must be in [0, 1)")
        _check(0 <= self.lp_slow_decay < 1, "lp_slow_decay", "must be in [0, 1)")
        _check(self.lp_fast_decay < self.lp_slow_decay, "lp_fast_decay",
               "must be < lp_slow_decay (the slow average keeps more of its past)")
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

    Per skill ``c`` the run keeps two exponential moving averages of the agent's mean return,
    updated once per regeneration (here: once per released set, when the set's window closes)::

        fast_c <- fast_decay * fast_c + (1 - fast_decay) * R_c        (Eq. 4)
        slow_c <- slow_decay * slow_c + (1 - slow_decay) * R_c        (Eq. 5)
        reward_e = |R_e - slow_c|  for environment e of skill c      (Eq. 6)

    ``R_e`` is the environment's mean no-hint return over its window (the plateau's ``win``) and
    ``R_c`` the mean of ``R_e`` over the set's environments of skill ``c``. The released values are
    0.98 and 0.85. Which is the decay: an average called *slow* must keep more of its past than a
    *fast* one, so with ``ema <- beta * ema + (1 - beta) * x`` the slow average has ``beta = 0.98``
    (a new set moves it by 2%) and the fast one ``beta = 0.85`` (15%). Read as weights of the new
    value instead, both averages would be within 15% of the latest set and could not be told apart.

    Choices the description leaves open, made here: an average starts at the first ``R_c`` of
    its skill (no prior value); the averages are updated with the set before its rewards are read,
    so the first set of a skill is scored against its own skill mean. The reward is the raw
    distance; "centred per skill" is :func:`designer_advantages`, which subtracts the same-skill
    mean of the set, so nothing is centred here. The fast average does not enter Eq. 6; it is kept
    (and checkpointed) for logging. The hinted plays do not enter it.
    """

    def __init__(self, fast_decay: float = 0.85, slow_decay: float = 0.98) -> None:
        _require_finite(fast_decay, "fast_decay")
        _require_finite(slow_decay, "slow_decay")
        if not 0 <= fast_decay < slow_decay < 1:
            raise ValueError(f"fast_decay, slow_decay: need 0 <= fast_decay < slow_decay < 1, "
                             f"got {fast_decay}, {slow_decay}")
        self.fast_decay = float(fast_decay)
        self.slow_decay = float(slow_decay)
        self.fast: dict[str, float] = {}
        self.slow: dict[str, float] = {}

    @classmethod
    def from_settings(cls, settings: "RewardSettings") -> "LearningPotentialReward":
        return cls(settings.lp_fast_decay, settings.lp_slow_decay)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LearningPotentialReward):
            return NotImplemented
        return (self.fast_decay, self.slow_decay, self.fast, self.slow) == \
            (other.fast_decay, other.slow_decay, other.fast, other.slow)

    def __repr__(self) -> str:
        return (f"LearningPotentialReward(fast_decay={self.fast_decay}, slow_decay={self.slow_decay}, "
                f"fast={self.fast}, slow={self.slow})")

    def update(self, skill_means: Mapping[str, float]) -> None:
        """Eqs. 4 and 5 for each skill of one set (a skill seen for the first time starts at its mean)."""
        for skill, mean in skill_means.items():
            x = _require_finite(mean, "skill_means")
            if skill not in self.slow:
                self.fast[skill] = self.slow[skill] = x
            else:
                self.fast[skill] = self.fast_decay * self.fast[skill] + (1 - self.fast_decay) * x
                self.slow[skill] = self.slow_decay * self.slow[skill] + (1 - self.slow_decay) * x

    def score_means(self, skills: Sequence[str], env_means: Sequence[float]) -> list[float]:
        """Update with one set (``env_means[i]`` = ``R_e`` of an environment of ``skills[i]``) and
        return each environment's ``|R_e - slow_c|`` (Eq. 6)."""
        if len(skills) != len(env_means):
            raise ValueError(f"skills and env_means differ in length ({len(skills)} vs {len(env_means)})")
        values = [_require_finite(m, "env_means") for m in env_means]
        groups: dict[str, list[float]] = {}
        for skill, value in zip(skills, values):
            groups.setdefault(skill, []).append(value)
        self.update({skill: math.fsum(group) / len(group) for skill, group in groups.items()})
        return [abs(value - self.slow[skill]) for skill, value in zip(skills, values)]

    def score_set(self, skills: Sequence[str], evidence: Sequence[DesignerEvidence]) -> list[float]:
        return self.score_means(skills, [e.win for e in evidence])

    def state_dict(self) -> dict[str, Any]:
        return {"fast": dict(self.fast), "slow": dict(self.slow)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
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
    """A rewards mapping as written before issue 15, in today's names (others unchanged).

    Recognised by the old keys ``lp_fast_alpha``, ``lp_slow_alpha``, ``lp_scale``: they become
    ``wp_*``, and ``designer_reward: learning_potential`` (which then meant the per-environment
    reward) becomes ``window_progress``. Used to read a run's config snapshot and delay buffer
    written by an older spade."""
    if not set(_OLD_KEYS) & set(data):
        return dict(data)
    upgraded = {_OLD_KEYS.get(key, key): value for key, value in data.items()}
    if upgraded.get("designer_reward") == "learning_potential":
        upgraded["designer_reward"] = "window_progress"
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
    """``min(cap, n_agent_samples / n_designer_samples * k)`` (SPEC 1.4).

    Weighs the few designer samples (one per environment, once per ``k`` steps) like the many agent
    samples. The paper's settings: 192 agent samples per step and 24 environments give
    ``192 / 24 * 4 = 32`` for games (k = 4) and ``min(50, 192 / 24 * 8 = 64) = 50`` for tool use
    (k = 8). Raises ValueError unless ``n_designer_samples > 0``, ``n_agent_samples >= 0``,
    ``k >= 1`` and ``cap > 0``.
    """
    _check(n_designer_samples > 0, "n_designer_samples", f"must be > 0, got {n_designer_samples}")
    _check(n_agent_samples >= 0, "n_agent_samples", f"must be >= 0, got {n_agent_samples}")
    _check(k >= 1, "k", f"must be >= 1, got {k}")
    _require_finite(cap, "cap")
    _check(cap > 0, "cap", f"must be > 0, got {cap}")
    return min(float(cap), n_agent_samples / n_designer_samples * k)


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
