"""Rewards and advantages of both roles (SPEC 1.3 and 1.4). Standard library only.

The agent is scored by the return of each episode and compared with the other plays of the same
environment in the same step (:func:`agent_advantages`). The designer is scored, ``k`` steps after
it wrote an environment, by a blend of how much the hint helped (regret) and how close the no-hint
win rate over the environment's window sits to the learnable middle band (:func:`plateau`); its
advantages are centred per skill and scaled up so that the few designer samples weigh as much as
the many agent samples (:func:`designer_advantages`, :func:`designer_advantage_scale`).

The designer's reward is one small interface, :class:`DesignerReward`: a callable from the
evidence of one environment's window (:class:`DesignerEvidence`: hinted and no-hint returns of the
generation step, no-hint returns of each later step) to a number. Two implementations, chosen by
``RewardSettings.designer_reward`` through :func:`designer_reward_for`: :class:`RegretPlateauReward`
(SPEC 1.4, the method) and :class:`LearningPotentialReward` (the paper's EMA ablation). The raw
hint regret is computed in one place, :func:`hint_regret`.

All numbers default to the SPEC values and are gathered in :class:`RewardSettings`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Sequence
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
    "designer_reward_for",
    "hint_regret",
    "RewardSettings",
    "agent_advantages",
    "designer_advantage_scale",
    "designer_advantages",
    "designer_reward",
    "episode_return",
    "plateau",
]

DesignerRewardName = Literal["regret_plateau", "learning_potential"]
DESIGNER_REWARDS: tuple[str, ...] = get_args(DesignerRewardName)

# Added to the population standard deviation in the agent's z-score (SPEC 1.3).
_STD_EPS = 1e-8


@dataclass(frozen=True)
class RewardSettings:
    """Every number of the reward layer, with the SPEC defaults.

    ``designer_reward`` picks the designer's reward: ``"regret_plateau"`` (SPEC 1.4, the method) or
    ``"learning_potential"`` (the paper's EMA ablation, see :class:`LearningPotentialReward`, which
    reads the ``lp_*`` fields).
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
    lp_fast_alpha: float = 0.5
    lp_slow_alpha: float = 0.1
    lp_scale: float = 0.2

    def __post_init__(self) -> None:
        if self.designer_reward not in DESIGNER_REWARDS:
            raise ValueError(
                f"designer_reward: {self.designer_reward!r} is not allowed; "
                f"choose one of: {', '.join(DESIGNER_REWARDS)}"
            )
        for name in (
            "regret_scale", "regret_weight", "plateau_weight", "plateau_lo", "plateau_hi",
            "plateau_ramp", "advantage_cap", "lp_fast_alpha", "lp_slow_alpha", "lp_scale",
        ):
            value = getattr(self, name)
            _require_finite(value, name)
        _check(self.regret_scale > 0, "regret_scale", "must be > 0")
        _check(self.regret_weight >= 0, "regret_weight", "must be >= 0")
        _check(self.plateau_weight >= 0, "plateau_weight", "must be >= 0")
        _check(self.plateau_lo <= self.plateau_hi, "plateau_lo", "must be <= plateau_hi")
        _check(self.plateau_ramp > 0, "plateau_ramp", "must be > 0")
        _check(self.advantage_cap > 0, "advantage_cap", "must be > 0")
        _check(0 < self.lp_slow_alpha <= 1, "lp_slow_alpha", "must be in (0, 1]")
        _check(0 < self.lp_fast_alpha <= 1, "lp_fast_alpha", "must be in (0, 1]")
        _check(self.lp_slow_alpha < self.lp_fast_alpha, "lp_slow_alpha", "must be < lp_fast_alpha")
        _check(self.lp_scale > 0, "lp_scale", "must be > 0")

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
class LearningPotentialReward:
    """The EMA learning-potential designer reward (the paper's ablation), as defined here.

    For one environment, take the per-step mean no-hint return over its window in step order,
    ``m_0`` (step ``s``), ``m_1``, ... (steps with no plays are skipped). Start two exponential
    moving averages at ``fast = slow = m_0`` and for every later mean ``m``::

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
    def from_settings(cls, settings: "RewardSettings") -> "LearningPotentialReward":
        return cls(settings.lp_fast_alpha, settings.lp_slow_alpha, settings.lp_scale)

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


_DESIGNER_REWARDS: dict[str, Callable[["RewardSettings"], DesignerReward]] = {
    "regret_plateau": RegretPlateauReward.from_settings,
    "learning_potential": LearningPotentialReward.from_settings,
}


def designer_reward_for(settings: "RewardSettings") -> DesignerReward:
    """The designer reward ``settings.designer_reward`` names, built from ``settings``."""
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
