"""Rewards and advantages (SPEC 1.3, 1.4) against values worked out by hand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spade.envs import protocol
from spade.selfplay import rewards
from spade.selfplay.rewards import (
    DesignerEvidence,
    RewardSettings,
    agent_advantages,
    designer_advantage_scale,
    designer_advantages,
    designer_reward,
    designer_reward_for,
    episode_return,
    plateau,
    score_released,
)

approx = pytest.approx
LOGIC, MATH = "Logical Deduction", "Mathematical Reasoning"

# ---------------------------------------------------------------------------------- episode_return


def test_episode_return_is_the_protocol_definition():
    assert rewards.episode_return is protocol.episode_return


@pytest.mark.parametrize(
    "step_rewards, terminated, expected",
    [
        ([0.2, 0.5, 1.0], True, 1.0),  # last reward, not the sum 1.7
        ([0.2, 0.7], True, 0.7),  # not 0.9
        ([0.5, 2.0], True, 1.0),  # clipped to 1
        ([-3.0], True, -1.0),  # clipped to -1
        ([1.0], False, 0.0),  # not terminated (truncated / out of turns)
        ([], True, 0.0),  # empty
        ([1.0, float("nan")], True, 0.0),  # non-finite last reward
        ([1.0, float("inf")], True, 0.0),
    ],
)
def test_episode_return(step_rewards, terminated, expected):
    assert episode_return(step_rewards, terminated) == expected


# ------------------------------------------------------------------------------------------ plateau


@pytest.mark.parametrize(
    "win, expected",
    [
        (0.5, 1.0),  # inside [0.4, 0.6]
        (0.4, 1.0),  # edges are inside
        (0.6, 1.0),
        (0.3, 0.6),  # 1 - (0.4 - 0.3) / 0.25 = 1 - 0.4 = 0.6
        (0.7, 0.6),  # 1 - (0.7 - 0.6) / 0.25 = 0.6
        (0.2, 0.2),  # 1 - (0.4 - 0.2) / 0.25 = 1 - 0.8 = 0.2
        (0.8, 0.2),  # 1 - (0.8 - 0.6) / 0.25 = 0.2
        (0.15, 0.0),  # 0.4 - 0.25: the foot of the ramp
        (0.85, 0.0),  # 0.6 + 0.25
        (0.0, 0.0),
        (1.0, 0.0),
        (-1.0, 0.0),
    ],
)
def test_plateau_defaults(win, expected):
    assert plateau(win) == approx(expected, abs=1e-12)


def test_plateau_custom_band():
    # lo 0.2, hi 0.3, ramp 0.1: at 0.35 -> 1 - (0.35 - 0.3) / 0.1 = 0.5 ; at 0.1 -> 1 - 0.1/0.1 = 0
    assert plateau(0.35, lo=0.2, hi=0.3, ramp=0.1) == approx(0.5)
    assert plateau(0.1, lo=0.2, hi=0.3, ramp=0.1) == approx(0.0, abs=1e-12)
    # lo == hi is allowed: a peak. 0.45 with lo = hi = 0.5, ramp 0.2 -> 1 - 0.05/0.2 = 0.75
    assert plateau(0.45, lo=0.5, hi=0.5, ramp=0.2) == approx(0.75)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(lo=0.7, hi=0.6), "lo"),
        (dict(ramp=0.0), "ramp"),
        (dict(ramp=-0.1), "ramp"),
        (dict(win=float("nan")), "win"),
        (dict(hi=float("inf")), "hi"),
    ],
)
def test_plateau_rejects(kwargs, name):
    args = {"win": 0.5, **kwargs}
    with pytest.raises(ValueError, match=name):
        plateau(**args)


@given(st.floats(-2, 3), st.floats(0, 1), st.floats(0, 0.5), st.floats(0.01, 1))
def test_plateau_in_unit_interval(win, lo, width, ramp):
    assert 0.0 <= plateau(win, lo, lo + width, ramp) <= 1.0


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 0.5), st.floats(0.01, 1))
def test_plateau_symmetric(distance, lo, width, ramp):
    hi = lo + width
    assert plateau(lo - distance, lo, hi, ramp) == approx(plateau(hi + distance, lo, hi, ramp), abs=1e-9)


@given(st.floats(-1, 2), st.floats(-1, 2))
def test_plateau_monotone_below_and_above(a, b):
    a, b = sorted((a, b))
    if b <= 0.4:
        assert plateau(a) <= plateau(b)
    if a >= 0.6:
        assert plateau(a) >= plateau(b)


# ---------------------------------------------------------------------------------- designer_reward


def test_designer_reward_regret_and_plateau():
    # regret = 0.59 - 0.5 = 0.09 ; 0.09 / 0.15 = 0.6
    # win = (0.5 + 0.3 + 0.2 + 0.6) / 4 = 1.6 / 4 = 0.4 -> plateau 1
    # blend = 0.4 * 0.6 + 0.6 * 1 = 0.24 + 0.6 = 0.84
    assert designer_reward([0.59], [0.5], [0.5, 0.3, 0.2, 0.6]) == approx(0.84)


def test_designer_reward_regret_floored_at_zero():
    # regret = mean([0, 0]) - mean([1, 0]) = 0 - 0.5 = -0.5 -> clipped to 0
    # win = 3 / 4 = 0.75 -> plateau = 1 - (0.75 - 0.6) / 0.25 = 0.4
    # blend = 0.4 * 0 + 0.6 * 0.4 = 0.24
    assert designer_reward([0.0, 0.0], [1.0, 0.0], [1.0, 1.0, 1.0, 0.0]) == approx(0.24)


def test_designer_reward_regret_capped_at_one():
    # regret = 1 - 0 = 1 ; 1 / 0.15 = 6.67 -> clipped to 1 ; win = 0 -> plateau 0 ; blend = 0.4
    assert designer_reward([1.0, 1.0], [0.0, 0.0], [0.0] * 8) == approx(0.4)


def test_designer_reward_win_over_all_window_plays():
    # 4 wins among 16 plays of the window (16 no-hint plays at step s, none later, or any split):
    # win = 4 / 16 = 0.25 -> plateau = 1 - (0.4 - 0.25) / 0.25 = 0.4
    # regret = 0.5 - 0.5 = 0 ; blend = 0.6 * 0.4 = 0.24
    window = [1.0] * 4 + [0.0] * 12
    assert designer_reward([1.0, 0.0], [1.0, 0.0], window) == approx(0.24)


def test_designer_reward_custom_numbers():
    # regret = mean([1, 0]) - mean([0, 0, 0, 1]) = 0.5 - 0.25 = 0.25 ; 0.25 / 0.5 = 0.5
    # win = (0 + 0 + 1) / 3 = 1/3 ; band [0.2, 0.3], ramp 0.1 -> 1 - (1/3 - 0.3) / 0.1 = 2/3
    # blend = 0.2 * 0.5 + 0.8 * 2/3 = 0.1 + 0.5333... = 0.6333...
    value = designer_reward(
        [1.0, 0.0], [0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0],
        regret_scale=0.5, regret_weight=0.2, plateau_weight=0.8, lo=0.2, hi=0.3, ramp=0.1,
    )
    assert value == approx(0.1 + 0.8 * 2 / 3)


@pytest.mark.parametrize("empty,named", [("hint_returns", "hint_returns"), ("nohint_returns_regen", "nohint_returns"),
                                         ("nohint_returns_window", "nohint_returns_window")])
def test_designer_reward_empty_names_argument(empty, named):
    args = {"hint_returns": [1.0], "nohint_returns_regen": [0.0], "nohint_returns_window": [0.5]}
    args[empty] = []
    with pytest.raises(ValueError, match=named):
        designer_reward(**args)


def test_designer_reward_rejects_non_finite_and_bad_scale():
    with pytest.raises(ValueError, match="nohint_returns_window"):
        designer_reward([1.0], [0.0], [float("nan")])
    with pytest.raises(ValueError, match="regret_scale"):
        designer_reward([1.0], [0.0], [0.5], regret_scale=0.0)


@given(
    st.lists(st.floats(-1, 1), min_size=1, max_size=20),
    st.lists(st.floats(-1, 1), min_size=1, max_size=20),
    st.lists(st.floats(-1, 1), min_size=1, max_size=60),
)
def test_designer_reward_bounded(hint, regen, window):
    assert 0.0 <= designer_reward(hint, regen, window) <= 1.0 + 1e-12


# -------------------------------------------------------------------------------- agent_advantages


def test_agent_advantages_two_wins_two_losses():
    # mean = 0.5 ; population std = sqrt(4 * 0.25 / 4) = 0.5
    # (1 - 0.5) / (0.5 + 1e-8) = 0.99999998 ; (0 - 0.5) / (0.5 + 1e-8) = -0.99999998
    expected = 0.5 / (0.5 + 1e-8)
    assert agent_advantages([1.0, 0.0, 0.0, 1.0]) == approx([expected, -expected, -expected, expected], rel=1e-12)
    assert expected == approx(0.99999998, rel=1e-12)


def test_agent_advantages_one_win():
    # mean = 0.25 ; variance = (0.75^2 + 3 * 0.25^2) / 4 = (0.5625 + 0.1875) / 4 = 0.1875
    # std = 0.4330127 ; 0.75 / 0.4330127 = 1.7320508 ; -0.25 / 0.4330127 = -0.5773503
    assert agent_advantages([1.0, 0.0, 0.0, 0.0]) == approx([1.7320508, -0.5773503, -0.5773503, -0.5773503], rel=1e-6)


def test_agent_advantages_degenerate():
    assert agent_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]  # exactly, despite 0.3's rounding
    assert agent_advantages([1.0]) == [0.0]
    assert agent_advantages([]) == []
    with pytest.raises(ValueError, match="returns"):
        agent_advantages([1.0, float("nan")])


@given(st.lists(st.floats(-1, 1), min_size=2, max_size=32))
def test_agent_advantages_centred_and_scaled(returns):
    advantages = agent_advantages(returns)
    assert math.fsum(advantages) == approx(0.0, abs=1e-6)
    mean = math.fsum(returns) / len(returns)
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in returns) / len(returns))
    if std > 1e-3:
        second_moment = math.fsum(a * a for a in advantages) / len(advantages)
        assert second_moment == approx(1.0, rel=1e-4)


# ----------------------------------------------------------------------------- designer_advantages


def test_designer_advantages_by_skill():
    # skill A: rewards 0.8, 0.4 -> mean 0.6 -> +0.2, -0.2 -> times 32 -> +6.4, -6.4
    # skill B: rewards 0.6, 0.2 -> mean 0.4 -> +0.2, -0.2 -> +6.4, -6.4
    # skill C: one environment -> 0
    result = designer_advantages([0.8, 0.4, 0.6, 0.2, 0.5], ["A", "A", "B", "B", "C"], 32.0)
    assert result == approx([6.4, -6.4, 6.4, -6.4, 0.0], abs=1e-12)


def test_designer_advantages_interleaved_and_no_std():
    # skill X: 1.0, 0.0, 0.5 -> mean 0.5 -> 0.5, -0.5, 0 ; skill Y: 0.3, 0.1 -> mean 0.2 -> 0.1, -0.1
    # scale 2 -> 1.0, -1.0, 0.0 ; 0.2, -0.2 (not divided by a std: Y stays smaller than X)
    result = designer_advantages([1.0, 0.3, 0.0, 0.1, 0.5], ["X", "Y", "X", "Y", "X"], 2.0)
    assert result == approx([1.0, 0.2, -1.0, -0.2, 0.0], abs=1e-12)


def test_designer_advantages_errors():
    assert designer_advantages([], [], 32.0) == []
    with pytest.raises(ValueError, match="length"):
        designer_advantages([1.0, 0.5], ["A"], 1.0)
    with pytest.raises(ValueError, match="scale"):
        designer_advantages([1.0], ["A"], float("nan"))
    with pytest.raises(ValueError, match="scale"):
        designer_advantages([1.0], ["A"], -1.0)


@given(
    st.lists(st.tuples(st.floats(0, 1), st.sampled_from("ABCD")), max_size=30),
    st.floats(0, 64),
)
def test_designer_advantages_sum_to_zero_per_skill(pairs, scale):
    result = designer_advantages([r for r, _ in pairs], [s for _, s in pairs], scale)
    for skill in "ABCD":
        assert math.fsum(a for a, (_, s) in zip(result, pairs) if s == skill) == approx(0.0, abs=1e-9)


# ------------------------------------------------------------------------ designer_advantage_scale


def test_designer_advantage_scale():
    assert designer_advantage_scale(192, 24, 4) == 32.0  # games: 192 / 24 * 4 = 32
    assert designer_advantage_scale(192, 24, 8) == 50.0  # tool use: 192 / 24 * 8 = 64 -> cap 50
    assert designer_advantage_scale(384, 24, 4) == 50.0  # 16 plays/env: 384 / 24 * 4 = 64 -> cap 50
    assert designer_advantage_scale(96, 24, 4) == 16.0  # 96 / 24 * 4 = 16
    assert designer_advantage_scale(192, 24, 4, cap=10.0) == 10.0  # 32 -> cap 10
    assert designer_advantage_scale(0, 24, 4) == 0.0


@pytest.mark.parametrize(
    "args, name",
    [((192, 0, 4), "n_designer_samples"), ((-1, 24, 4), "n_agent_samples"), ((192, 24, 0), "k"), ((192, 24, 4, 0.0), "cap")],
)
def test_designer_advantage_scale_rejects(args, name):
    with pytest.raises(ValueError, match=name):
        designer_advantage_scale(*args)


# --------------------------------------------------------------------------------- RewardSettings


def test_reward_settings_defaults_match_spec():
    settings = RewardSettings()
    assert settings.blend_kwargs() == {
        "regret_scale": 0.15, "regret_weight": 0.4, "plateau_weight": 0.6, "lo": 0.4, "hi": 0.6, "ramp": 0.25,
    }
    assert settings.advantage_cap == 50.0
    assert settings.designer_reward == "regret_plateau"
    assert (settings.lp_gamma_fast, settings.lp_gamma_slow) == (0.98, 0.85)  # paper Eq. 4 and its released values
    assert settings.advantage_agent_samples == 192  # the released global batch
    assert (settings.wp_fast_alpha, settings.wp_slow_alpha, settings.wp_scale) == (0.5, 0.1, 0.2)
    assert (settings.sv_target, settings.sv_sigma) == (0.25, 0.1)  # SPICE
    # the kwargs feed designer_reward: regret 0.09 -> 0.6 ; win 0.5 -> 1 ; 0.24 + 0.6 = 0.84
    assert designer_reward([0.59], [0.5], [0.5], **settings.blend_kwargs()) == approx(0.84)


def test_reward_settings_is_frozen():
    with pytest.raises(AttributeError):
        RewardSettings().regret_scale = 0.2  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(designer_reward="ema"), "regret_plateau, learning_potential, window_progress, solver_variance"),
        (dict(plateau_lo=0.7), "plateau_lo"),
        (dict(plateau_ramp=0.0), "plateau_ramp"),
        (dict(regret_scale=-1.0), "regret_scale"),
        (dict(wp_slow_alpha=0.6), "wp_slow_alpha"),
        (dict(wp_scale=float("nan")), "wp_scale"),
        (dict(lp_gamma_fast=0.85, lp_gamma_slow=0.98), "lp_gamma_fast"),
        (dict(lp_gamma_slow=-0.1), "lp_gamma_slow"),
        (dict(lp_gamma_fast=1.5), "lp_gamma_fast"),
        (dict(advantage_agent_samples=0), "advantage_agent_samples"),
        (dict(sv_sigma=0.0), "sv_sigma"),
        (dict(sv_target=float("inf")), "sv_target"),
        (dict(advantage_cap=0.0), "advantage_cap"),
    ],
)
def test_reward_settings_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardSettings(**kwargs)


def test_reward_settings_from_config_mapping():
    from spade.config import ConfigError, from_mapping

    settings = from_mapping(RewardSettings, {"designer_reward": "learning_potential", "regret_scale": 1}, where="rewards")
    assert settings.designer_reward == "learning_potential" and settings.regret_scale == 1.0
    with pytest.raises(ConfigError, match="rewards.designer_reward.*learning_potential"):
        from_mapping(RewardSettings, {"designer_reward": "bogus"}, where="rewards")
    with pytest.raises(ConfigError, match="plateau_lo"):
        from_mapping(RewardSettings, {"plateau_lo": 0.9}, where="rewards")


def test_reward_settings_old_key_names_are_unknown():
    """The per-environment variant's keys were renamed lp_* -> wp_* (issue 15): an old key is an
    unknown key whose message lists the new ones."""
    from spade.config import ConfigError, from_mapping

    with pytest.raises(ConfigError, match="rewards.lp_fast_alpha: unknown key.*wp_fast_alpha"):
        from_mapping(RewardSettings, {"lp_fast_alpha": 0.5}, where="rewards")


# ------------------------------------------------------------------- solver variance (SPICE)


@pytest.mark.parametrize(
    "nohint, later, sigma, expected",
    [
        # var(0, 1) = 0.25 = the target: the peak
        ((0.0,), ((1.0,),), 0.1, 1.0),
        # 0, 0, 0, 1: mean 0.25, var (3 * 0.0625 + 0.5625) / 4 = 0.1875 ; (0.1875 - 0.25)^2 = 0.00390625
        ((0.0, 0.0), ((0.0,), (1.0,)), 0.1, math.exp(-0.00390625 / 0.02)),  # 0.82258
        ((0.0, 0.0), ((0.0,), (1.0,)), 0.2, math.exp(-0.00390625 / 0.08)),  # 0.95235
        # identical returns: var 0 -> exp(-0.0625 / 0.02) = exp(-3.125)
        ((0.5, 0.5), ((0.5,),), 0.1, math.exp(-3.125)),
        # returns -1 and 1: var 1 -> exp(-0.5625 / 0.02)
        ((-1.0,), ((1.0,),), 0.1, math.exp(-28.125)),
    ],
)
def test_solver_variance_by_hand(nohint, later, sigma, expected):
    from spade.selfplay.rewards import DesignerEvidence, SolverVarianceReward, designer_reward_for

    evidence = DesignerEvidence((1.0,), nohint, later)  # the hinted plays do not enter it
    assert SolverVarianceReward(sigma=sigma)(evidence) == approx(expected)
    settings = RewardSettings(designer_reward="solver_variance", sv_sigma=sigma)
    assert designer_reward_for(settings) == SolverVarianceReward(0.25, sigma)
    assert designer_reward_for(settings)(evidence) == approx(expected)


def test_solver_variance_peak_and_validation():
    from spade.selfplay.rewards import SolverVarianceReward

    reward = SolverVarianceReward()
    assert reward.of_variance(0.25) == 1.0
    assert reward.of_variance(0.15) == approx(math.exp(-0.5))  # one sigma below the target
    assert reward.of_variance(0.35) == approx(math.exp(-0.5))
    assert SolverVarianceReward(target=0.1).of_variance(0.1) == 1.0
    with pytest.raises(ValueError, match="sigma"):
        SolverVarianceReward(sigma=0.0)


def test_upgrade_reward_settings_of_an_older_spade():
    from spade.selfplay.rewards import upgrade_reward_settings

    old = {"designer_reward": "learning_potential", "lp_fast_alpha": 0.6, "lp_slow_alpha": 0.2, "lp_scale": 0.5,
           "regret_scale": 0.15}
    assert upgrade_reward_settings(old) == {"designer_reward": "window_progress", "wp_fast_alpha": 0.6,
                                            "wp_slow_alpha": 0.2, "wp_scale": 0.5, "regret_scale": 0.15}
    assert upgrade_reward_settings({**old, "designer_reward": "regret_plateau"})["designer_reward"] == "regret_plateau"
    # issues 15-19 read gamma as a decay: the same numbers, the paper's way (the fast average moves more)
    decays = {"designer_reward": "learning_potential", "lp_fast_decay": 0.85, "lp_slow_decay": 0.98}
    assert upgrade_reward_settings(decays) == {"designer_reward": "learning_potential",
                                               "lp_gamma_fast": 0.98, "lp_gamma_slow": 0.85}
    # today's names are left alone
    new = {"designer_reward": "learning_potential", "lp_gamma_fast": 0.98, "lp_gamma_slow": 0.85}
    assert upgrade_reward_settings(new) == new


@pytest.mark.parametrize("key", ["lp_fast_decay", "lp_slow_decay"])
def test_retired_learning_potential_keys_name_the_new_ones(key):
    """A config that still sets a decay gets an error naming the key and the keys that replace it."""
    from spade.config import ConfigError, from_mapping

    with pytest.raises(ConfigError, match=f"rewards.{key}: retired.*lp_gamma_fast.*0.98.*lp_gamma_slow.*0.85"):
        from_mapping(RewardSettings, {"designer_reward": "learning_potential", key: 0.9}, where="rewards")


# --------------------------------------------------------- learning potential (paper Eqs. 4-6)


def _evidence(*window: list[float]) -> DesignerEvidence:
    """An environment whose window had the no-hint plays ``window[0]`` at step s, then the rest."""
    return DesignerEvidence((1.0,), tuple(window[0]), tuple(tuple(step) for step in window[1:]))


def test_learning_potential_by_hand_gamma_weighs_the_new_value():
    """Three sets of one skill. gamma_fast 0.98, gamma_slow 0.85; mu <- (1 - gamma) mu + gamma r.

    set 1: e1 plays 1,0 | 1,1 (R 0.75), e2 0,0 | 0,1 (R 0.25): r = 4/8 = 0.5 -> fast = slow = 0.5;
           rewards |0.75 - 0.5| = 0.25, |0.25 - 0.5| = 0.25
    set 2: e1 R 1.0, e2 R 0.75: r = 7/8 = 0.875 -> fast = 0.02 * 0.5 + 0.98 * 0.875 = 0.8675,
           slow = 0.15 * 0.5 + 0.85 * 0.875 = 0.81875; rewards 0.18125, 0.06875
    set 3: e1 R 0, e2 R 0.5: r = 0.25 -> fast = 0.02 * 0.8675 + 0.98 * 0.25 = 0.26235,
           slow = 0.15 * 0.81875 + 0.85 * 0.25 = 0.3353125; rewards 0.3353125, 0.1646875
    (Read as decays, set 2 would give slow = 0.98 * 0.5 + 0.02 * 0.875 = 0.5075.)
    """
    from spade.selfplay.rewards import LearningPotentialReward

    reward = designer_reward_for(RewardSettings(designer_reward="learning_potential"))
    assert isinstance(reward, LearningPotentialReward)
    skills = [LOGIC, LOGIC]
    sets = [([1, 0], [1, 1]), ([0, 0], [0, 1])], [([1, 1], [1, 1]), ([1, 0], [1, 1])], [([0], [0]), ([0], [1])]
    expected = [([0.25, 0.25], 0.5, 0.5), ([0.18125, 0.06875], 0.8675, 0.81875),
                ([0.3353125, 0.1646875], 0.26235, 0.3353125)]
    for envs, (rewards, fast, slow) in zip(sets, expected):
        assert score_released(reward, skills, [_evidence(*env) for env in envs]) == approx(rewards)
        assert reward.state_dict()["fast"] == approx({LOGIC: fast})
        assert reward.state_dict()["slow"] == approx({LOGIC: slow})
    # the released code's monitored potential: |fast - slow| / (2 (0.98 - 0.85))
    assert reward.potential(LOGIC) == approx(abs(0.26235 - 0.3353125) / 0.26)
    assert reward.potential("never seen") == 0.0


def test_learning_potential_skill_return_pools_the_plays():
    """r_c is the mean of all plays of the skill's environments (the released code extends one list):
    e1 one play 1.0, e2 three plays 0 -> r = 1/4 (a mean of the means would be 0.5); rewards
    |1 - 0.25| = 0.75 and |0 - 0.25| = 0.25. A second skill keeps averages of its own."""
    reward = designer_reward_for(RewardSettings(designer_reward="learning_potential"))
    got = score_released(reward, [LOGIC, LOGIC, MATH], [_evidence([1.0]), _evidence([0.0, 0.0], [0.0]),
                                                         _evidence([0.5])])
    assert got == approx([0.75, 0.25, 0.0])
    assert reward.state_dict()["fast"] == approx({LOGIC: 0.25, MATH: 0.5})
    assert reward.state_dict()["slow"] == approx({LOGIC: 0.25, MATH: 0.5})


# ------------------------------------------------------------ designer advantage weight (issue 20)


@pytest.mark.parametrize(
    "recipe, k, expected",
    [
        # games: 16 plays x 24 envs = 384 agent samples this step; the released code's 192 / 24 * 4 = 32
        ("examples/recipes/qwen3_30b_a3b_games_8gpu.yaml", 4, 32.0),
        # tool use: 192 / 24 * 8 = 64 -> the cap 50
        ("examples/recipes/tool_use_qwen3_30b_a3b_8gpu.yaml", 8, 50.0),
    ],
)
def test_designer_advantage_weight_of_the_recipes(recipe, k, expected):
    from pathlib import Path

    from spade.train_config import load_train_config

    config = load_train_config(Path(__file__).resolve().parents[1] / recipe)
    sp = config.selfplay
    assert (sp.k, sp.envs_per_set, sp.g_nohint) == (k, 24, 16)
    assert rewards.designer_advantage_weight(sp.rewards, sp.envs_per_set * sp.g_nohint, sp.envs_per_set, sp.k) == expected


def test_designer_advantage_weight_counts_this_step_when_asked():
    counted = RewardSettings(advantage_agent_samples=None)
    assert rewards.designer_advantage_weight(counted, 384, 24, 4) == 50.0   # 384 / 24 * 4 = 64 -> 50
    assert rewards.designer_advantage_weight(counted, 96, 24, 4) == 16.0    # 96 / 24 * 4
    assert rewards.designer_advantage_weight(RewardSettings(), 96, 20, 4) == approx(38.4)  # 192 / 20 * 4
