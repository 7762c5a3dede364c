"""Advantages of both roles (SPEC 1.3 and 1.4). Standard library only.

The agent's plays are compared with the other plays of the same environment in the same step
(:func:`agent_advantages`, a z-score of the episode returns of ``envs.protocol.episode_return``).
The designer's rewards (``designer_rewards.py``) are centred per skill and scaled up so that the
few designer samples weigh as much as the many agent samples (:func:`designer_advantages`,
:func:`designer_advantage_weight`, :func:`designer_advantage_scale`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from .reward_checks import check, require_finite
from .reward_settings import RewardSettings

# Added to the population standard deviation in the agent's z-score (SPEC 1.3).
STD_EPS = 1e-8


def agent_advantages(returns: Sequence[float]) -> list[float]:
    """Z-scores of one environment's plays in one step: ``(r - mean) / (std + 1e-8)``.

    ``std`` is the population standard deviation. Identical returns (including a single play)
    give zeros exactly; an empty list gives an empty list; a non-finite return raises ValueError.
    """
    values = [require_finite(r, "returns") for r in returns]
    if not values or all(v == values[0] for v in values):
        return [0.0] * len(values)
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    return [(v - mean) / (std + STD_EPS) for v in values]


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
    require_finite(scale, "scale")
    check(scale >= 0, "scale", f"must be >= 0, got {scale}")
    values = [require_finite(r, "rewards") for r in rewards]
    groups: dict[Hashable, list[float]] = {}
    for value, skill in zip(values, skills):
        groups.setdefault(skill, []).append(value)
    means = {skill: math.fsum(group) / len(group) for skill, group in groups.items()}
    return [scale * (value - means[skill]) for value, skill in zip(values, skills)]


def designer_advantage_scale(n_agent_samples: int, n_designer_samples: int, k: int, cap: float) -> float:
    """``min(cap, n_agent_samples / n_designer_samples * k)`` (SPEC 1.4; the released
    ``compute_env_reward_scale`` in ``spade/core/utils/rewards.py``).

    Weighs the few designer samples (one per environment, once per ``k`` steps) like the many agent
    samples. Raises ValueError unless ``n_designer_samples > 0``, ``n_agent_samples >= 0``,
    ``k >= 1`` and ``cap > 0`` (``RewardSettings.advantage_cap``, SPEC 50). Which agent count
    goes in: :func:`designer_advantage_weight`.
    """
    check(n_designer_samples > 0, "n_designer_samples", f"must be > 0, got {n_designer_samples}")
    check(n_agent_samples >= 0, "n_agent_samples", f"must be >= 0, got {n_agent_samples}")
    check(k >= 1, "k", f"must be >= 1, got {k}")
    require_finite(cap, "cap")
    check(cap > 0, "cap", f"must be > 0, got {cap}")
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

