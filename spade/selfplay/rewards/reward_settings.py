"""The reward layer's settings (config section ``selfplay.rewards``): every number of both roles'
rewards and advantages, and the one place their defaults are written.

The defaults are the SPEC values: the designer's regret + plateau blend and its advantage weight
(SPEC 1.4: regret scale 0.15, weights 0.4 / 0.6, plateau band [0.4, 0.6] with a ramp of 0.25,
weight cap 50), the released code's agent-sample count for that weight, and the numbers of the
other designer rewards (the paper's learning-potential ablation, this project's window progress,
SPICE's solver variance). The reward classes and functions take their numbers from these settings
(``from_settings``) and have no defaults of their own. ``upgrade_reward_settings`` reads the
settings an older spade wrote.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

from .reward_checks import check, require_finite

DesignerRewardName = Literal["regret_plateau", "regret_released", "learning_potential", "window_progress",
                             "solver_variance"]
DESIGNER_REWARDS: tuple[str, ...] = get_args(DesignerRewardName)
FailedHint = Literal["drop", "hint_return_zero"]
FAILED_HINTS: tuple[str, ...] = get_args(FailedHint)


@dataclass(frozen=True)
class RewardSettings:
    """Every number of the reward layer, with the SPEC defaults.

    ``designer_reward`` picks the designer's reward (``designer_rewards.py``): ``"regret_plateau"``
    (SPEC 1.4, the method), ``"regret_released"`` (the released ``regret_based`` variant,
    ``ReleasedRegretReward``: ``max(0, hinted mean - window no-hint mean)``, reads no number),
    ``"learning_potential"`` (the paper's EMA ablation,
    ``LearningPotentialReward``, reads ``lp_gamma_fast`` / ``lp_gamma_slow``),
    ``"window_progress"`` (``WindowProgressReward``, reads the ``wp_*`` fields) or
    ``"solver_variance"`` (SPICE, ``SolverVarianceReward``, reads ``sv_target`` / ``sv_sigma``).
    ``advantage_cap`` caps the designer advantage weight; ``advantage_agent_samples`` is the
    agent-sample count that weight uses (``advantages.designer_advantage_weight``).
    ``failed_hint``: what becomes of an environment without a hint (every hint call failed, or its
    hinted plays did): ``"drop"`` (spade) leaves its designer sample out; ``"hint_return_zero"``
    (the released code: ``slime/spade_rollout.py:544-546`` caches no hinted return and
    ``core/utils/delayed_env_rewards.py:462`` reads the missing one as 0.0) keeps it, with the
    hinted mean taken as 0, so ``regret = -mean no-hint return`` (0 after the blend's floor when
    that mean is >= 0) and the sample is trained on its plateau term.
    ``step_timeout_penalty`` (``regret_released`` only): the raw reward, before centring, of an
    environment whose load, reset or step timed out in a play (either arm) of its generation step;
    None (spade) scores it like any other. The released ``regret_based`` variant: -0.5
    (``STEP_TIMEOUT_PENALTY``, ``core/utils/rewards.py:8``; applied at
    ``core/utils/delayed_env_rewards.py:336-340`` to the games stamped at
    ``core/orchestrator.py:2410-2419``).
    """

    # Keys of older spades that a config may not use any more, with what replaces them.
    RETIRED_KEYS: ClassVar[dict[str, str]] = {
        "lp_fast_decay": "retired in issue 20: the learning potential reads gamma as the weight of the new "
                         "value (paper Eq. 4); set lp_gamma_fast (paper 0.98) and lp_gamma_slow (paper 0.85)",
        "lp_slow_decay": "retired in issue 20: the learning potential reads gamma as the weight of the new "
                         "value (paper Eq. 4); set lp_gamma_fast (paper 0.98) and lp_gamma_slow (paper 0.85)",
    }

    # SPEC 1.4: blend = regret_weight * clip(regret / regret_scale, 0, 1) + plateau_weight * plateau(win),
    # plateau 1 inside [plateau_lo, plateau_hi] falling to 0 over plateau_ramp on each side
    regret_scale: float = 0.15
    regret_weight: float = 0.4
    plateau_weight: float = 0.6
    plateau_lo: float = 0.4
    plateau_hi: float = 0.6
    plateau_ramp: float = 0.25
    # SPEC 1.4: designer advantage weight min(advantage_cap, agent samples / designer samples * k)
    advantage_cap: float = 50.0
    # The released code's agent samples per step (its global batch); null: this step's agent samples
    advantage_agent_samples: int | None = 192
    designer_reward: DesignerRewardName = "regret_plateau"
    failed_hint: FailedHint = "drop"
    step_timeout_penalty: float | None = None
    # learning_potential (paper Eq. 4 and its released values): mu <- (1 - gamma) * mu + gamma * r
    lp_gamma_fast: float = 0.98
    lp_gamma_slow: float = 0.85
    # window_progress (this project's choice)
    wp_fast_alpha: float = 0.5
    wp_slow_alpha: float = 0.1
    wp_scale: float = 0.2
    # solver_variance (SPICE: a Gaussian of the variance, peak 0.25 = half right; sigma 0.1 not verified)
    sv_target: float = 0.25
    sv_sigma: float = 0.1

    def __post_init__(self) -> None:
        if self.designer_reward not in DESIGNER_REWARDS:
            raise ValueError(
                f"designer_reward: {self.designer_reward!r} is not allowed; "
                f"choose one of: {', '.join(DESIGNER_REWARDS)}"
            )
        check(self.failed_hint in FAILED_HINTS, "failed_hint",
              f"{self.failed_hint!r} is not allowed; choose one of: {', '.join(FAILED_HINTS)}")
        for name in (
            "regret_scale", "regret_weight", "plateau_weight", "plateau_lo", "plateau_hi",
            "plateau_ramp", "advantage_cap", "lp_gamma_fast", "lp_gamma_slow", "wp_fast_alpha",
            "wp_slow_alpha", "wp_scale", "sv_target", "sv_sigma",
        ):
            value = getattr(self, name)
            require_finite(value, name)
        check(self.regret_scale > 0, "regret_scale", "must be > 0")
        check(self.regret_weight >= 0, "regret_weight", "must be >= 0")
        check(self.plateau_weight >= 0, "plateau_weight", "must be >= 0")
        check(self.plateau_lo <= self.plateau_hi, "plateau_lo", "must be <= plateau_hi")
        check(self.plateau_ramp > 0, "plateau_ramp", "must be > 0")
        check(self.advantage_cap > 0, "advantage_cap", "must be > 0")
        check(0 < self.lp_gamma_fast <= 1, "lp_gamma_fast", "must be in (0, 1]")
        check(0 < self.lp_gamma_slow <= 1, "lp_gamma_slow", "must be in (0, 1]")
        check(self.lp_gamma_slow < self.lp_gamma_fast, "lp_gamma_fast",
              "must be > lp_gamma_slow (gamma weighs the new value: the fast average takes more of it)")
        check(self.advantage_agent_samples is None or (
            isinstance(self.advantage_agent_samples, int) and not isinstance(self.advantage_agent_samples, bool)
            and self.advantage_agent_samples >= 1), "advantage_agent_samples",
            f"must be an integer >= 1 or null (count this step's agent samples), got {self.advantage_agent_samples!r}")
        check(0 < self.wp_slow_alpha <= 1, "wp_slow_alpha", "must be in (0, 1]")
        check(0 < self.wp_fast_alpha <= 1, "wp_fast_alpha", "must be in (0, 1]")
        check(self.wp_slow_alpha < self.wp_fast_alpha, "wp_slow_alpha", "must be < wp_fast_alpha")
        check(self.wp_scale > 0, "wp_scale", "must be > 0")
        check(self.sv_sigma > 0, "sv_sigma", "must be > 0")
        if self.step_timeout_penalty is not None:
            check(isinstance(self.step_timeout_penalty, (int, float)) and not isinstance(self.step_timeout_penalty, bool)
                  and math.isfinite(self.step_timeout_penalty), "step_timeout_penalty",
                  f"must be a number or null, got {self.step_timeout_penalty!r}")
            check(self.designer_reward == "regret_released", "step_timeout_penalty",
                  f"applies to designer_reward regret_released only (the released regret_based variant), "
                  f"got designer_reward {self.designer_reward!r}; leave it null")


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

