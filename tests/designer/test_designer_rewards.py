"""Designer rewards (SPEC 1.4 and the alternatives) and the reward settings, against values worked
out by hand."""

from __future__ import annotations

import inspect
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spade.selfplay.rewards.advantages import designer_advantage_scale, designer_advantages
from spade.selfplay.rewards.designer_rewards import (
    DesignerEvidence,
    LearningPotentialReward,
    RegretPlateauReward,
    ReleasedRegretReward,
    SolverVarianceReward,
    WindowProgressReward,
    designer_reward_for,
    plateau,
    score_released,
)
from spade.selfplay.rewards.reward_settings import RewardSettings, upgrade_reward_settings

approx = pytest.approx
LOGIC, MATH = "Logical Deduction", "Mathematical Reasoning"
SPEC_BAND = {"lo": 0.4, "hi": 0.6, "ramp": 0.25}  # SPEC 1.4
# SPEC 1.4: 0.4 * clip(regret / 0.15, 0, 1) + 0.6 * plateau(win) over the band above
SPEC_BLEND = RegretPlateauReward(regret_scale=0.15, regret_weight=0.4, plateau_weight=0.6, **SPEC_BAND)


def blend(hint, regen, later=(), reward=SPEC_BLEND) -> float:
    """The regret + plateau reward of an environment with hinted plays ``hint`` and no-hint plays
    ``regen`` at its generation step and no-hint plays ``later[i]`` at each later step."""
    return reward(DesignerEvidence(tuple(hint), tuple(regen), tuple(tuple(step) for step in later)))


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
    assert plateau(win, **SPEC_BAND) == approx(expected, abs=1e-12)


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
    args = {"win": 0.5, **SPEC_BAND, **kwargs}
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
        assert plateau(a, **SPEC_BAND) <= plateau(b, **SPEC_BAND)
    if a >= 0.6:
        assert plateau(a, **SPEC_BAND) >= plateau(b, **SPEC_BAND)


# ---------------------------------------------------------------------------- regret + plateau


def test_designer_reward_regret_and_plateau():
    # regret = 0.59 - 0.5 = 0.09 ; 0.09 / 0.15 = 0.6
    # win = (0.5 + 0.3 + 0.2 + 0.6) / 4 = 1.6 / 4 = 0.4 -> plateau 1
    # blend = 0.4 * 0.6 + 0.6 * 1 = 0.24 + 0.6 = 0.84
    assert blend([0.59], [0.5], [[0.3], [0.2], [0.6]]) == approx(0.84)


def test_designer_reward_regret_floored_at_zero():
    # regret = mean([0, 0]) - mean([1, 0]) = 0 - 0.5 = -0.5 -> clipped to 0
    # win = (1 + 0 + 1 + 1) / 4 = 0.75 -> plateau = 1 - (0.75 - 0.6) / 0.25 = 0.4
    # blend = 0.4 * 0 + 0.6 * 0.4 = 0.24
    assert blend([0.0, 0.0], [1.0, 0.0], [[1.0, 1.0]]) == approx(0.24)


def test_designer_reward_regret_capped_at_one():
    # regret = 1 - 0 = 1 ; 1 / 0.15 = 6.67 -> clipped to 1 ; win = 0 -> plateau 0 ; blend = 0.4
    assert blend([1.0, 1.0], [0.0, 0.0], [[0.0] * 3, [0.0] * 3]) == approx(0.4)


def test_designer_reward_win_over_all_window_plays():
    # 4 wins among the 16 no-hint plays of the window (2 at step s, 14 later, in any split):
    # win = 4 / 16 = 0.25 -> plateau = 1 - (0.4 - 0.25) / 0.25 = 0.4
    # regret = 0.5 - 0.5 = 0 ; blend = 0.6 * 0.4 = 0.24
    assert blend([1.0, 0.0], [1.0, 0.0], [[1.0] * 3 + [0.0] * 4, [0.0] * 7]) == approx(0.24)
    assert blend([1.0, 0.0], [1.0, 0.0], [[0.0] * 11, [], [1.0] * 3]) == approx(0.24)


def test_designer_reward_custom_numbers():
    # regret = mean([1, 0]) - mean([0, 0, 0, 1]) = 0.5 - 0.25 = 0.25 ; 0.25 / 0.5 = 0.5
    # win = (0 + 0 + 0 + 1 + 0 + 0) / 6 = 1/6 ; band [0.2, 0.3], ramp 0.1 -> 1 - (0.2 - 1/6) / 0.1 = 2/3
    # blend = 0.2 * 0.5 + 0.8 * 2/3 = 0.1 + 0.5333... = 0.6333...
    custom = RegretPlateauReward(regret_scale=0.5, regret_weight=0.2, plateau_weight=0.8, lo=0.2, hi=0.3, ramp=0.1)
    assert blend([1.0, 0.0], [0.0, 0.0, 0.0, 1.0], [[0.0, 0.0]], reward=custom) == approx(0.1 + 0.8 * 2 / 3)
    settings = RewardSettings(regret_scale=0.5, regret_weight=0.2, plateau_weight=0.8, plateau_lo=0.2,
                              plateau_hi=0.3, plateau_ramp=0.1)
    assert designer_reward_for(settings) == custom


@pytest.mark.parametrize("empty,named", [("hint", "hint_returns"), ("regen", "nohint_returns")])
def test_designer_reward_empty_names_argument(empty, named):
    args = {"hint": [1.0], "regen": [0.0], "later": [[0.5]]}
    args[empty] = []
    with pytest.raises(ValueError, match=named):
        blend(**args)


def test_designer_reward_rejects_non_finite_and_bad_scale():
    with pytest.raises(ValueError, match="window"):
        blend([1.0], [0.0], [[float("nan")]])
    with pytest.raises(ValueError, match="regret_scale"):
        RegretPlateauReward(regret_scale=0.0, regret_weight=0.4, plateau_weight=0.6, **SPEC_BAND)


@given(
    st.lists(st.floats(-1, 1), min_size=1, max_size=20),
    st.lists(st.floats(-1, 1), min_size=1, max_size=20),
    st.lists(st.floats(-1, 1), max_size=60),
)
def test_designer_reward_bounded(hint, regen, later):
    assert 0.0 <= blend(hint, regen, [later]) <= 1.0 + 1e-12


# --------------------------------------------------------------------------------- RewardSettings


def test_reward_settings_defaults_match_spec():
    settings = RewardSettings()
    assert (settings.regret_scale, settings.regret_weight, settings.plateau_weight) == (0.15, 0.4, 0.6)
    assert (settings.plateau_lo, settings.plateau_hi, settings.plateau_ramp) == (0.4, 0.6, 0.25)
    assert settings.advantage_cap == 50.0
    assert settings.designer_reward == "regret_plateau"
    assert (settings.lp_gamma_fast, settings.lp_gamma_slow) == (0.98, 0.85)  # paper Eq. 4 and its released values
    assert settings.advantage_agent_samples == 192  # the released global batch
    assert (settings.wp_fast_alpha, settings.wp_slow_alpha, settings.wp_scale) == (0.5, 0.1, 0.2)
    assert (settings.sv_target, settings.sv_sigma) == (0.25, 0.1)  # SPICE
    # the method's reward built from them: regret 0.09 -> 0.6 ; win 0.5 -> 1 ; 0.24 + 0.6 = 0.84
    assert designer_reward_for(settings) == SPEC_BLEND
    assert blend([0.59], [0.5], reward=designer_reward_for(settings)) == approx(0.84)


def test_reward_numbers_are_written_only_in_the_settings():
    """RewardSettings is the one source of the reward layer's numbers (issue 22: SPEC 1.4's were
    written in four places): the rewards and functions that use them have no defaults of their
    own, and the settings reach every designer reward whole."""
    for function in (plateau, designer_advantage_scale, RegretPlateauReward, WindowProgressReward,
                     SolverVarianceReward, LearningPotentialReward):
        defaults = {name: p.default for name, p in inspect.signature(function).parameters.items()
                    if p.default is not inspect.Parameter.empty}
        assert defaults == {}, function.__name__
    custom = RewardSettings(regret_scale=0.3, regret_weight=0.5, plateau_weight=0.5, plateau_lo=0.3,
                            plateau_hi=0.7, plateau_ramp=0.1, lp_gamma_fast=0.9, lp_gamma_slow=0.5,
                            wp_fast_alpha=0.7, wp_slow_alpha=0.3, wp_scale=0.4, sv_target=0.2, sv_sigma=0.2)
    assert designer_reward_for(custom) == RegretPlateauReward(0.3, 0.5, 0.5, 0.3, 0.7, 0.1)
    by_name = {name: designer_reward_for(RewardSettings(**{**custom.__dict__, "designer_reward": name}))
               for name in ("learning_potential", "window_progress", "solver_variance")}
    assert by_name == {"learning_potential": LearningPotentialReward(0.9, 0.5),
                       "window_progress": WindowProgressReward(0.7, 0.3, 0.4),
                       "solver_variance": SolverVarianceReward(0.2, 0.2)}


def test_reward_settings_is_frozen():
    with pytest.raises(AttributeError):
        RewardSettings().regret_scale = 0.2  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(designer_reward="ema"),
         "designer_reward.*regret_plateau, regret_released, learning_potential, window_progress, solver_variance"),
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
    evidence = DesignerEvidence((1.0,), nohint, later)  # the hinted plays do not enter it
    assert SolverVarianceReward(target=0.25, sigma=sigma)(evidence) == approx(expected)
    settings = RewardSettings(designer_reward="solver_variance", sv_sigma=sigma)
    assert designer_reward_for(settings) == SolverVarianceReward(0.25, sigma)
    assert designer_reward_for(settings)(evidence) == approx(expected)


def test_solver_variance_peak_and_validation():
    reward = SolverVarianceReward(target=0.25, sigma=0.1)
    assert reward.of_variance(0.25) == 1.0
    assert reward.of_variance(0.15) == approx(math.exp(-0.5))  # one sigma below the target
    assert reward.of_variance(0.35) == approx(math.exp(-0.5))
    assert SolverVarianceReward(target=0.1, sigma=0.1).of_variance(0.1) == 1.0
    with pytest.raises(ValueError, match="sigma"):
        SolverVarianceReward(target=0.25, sigma=0.0)


def test_upgrade_reward_settings_of_an_older_spade():
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




# ------------------------------------------------ regret_released: the released regret_based variant


def test_released_regret_reads_the_whole_window_with_no_scale_or_cap():
    # hinted mean 3/4; no-hint plays of the window: step s (0, 1, 0, 0), then (1, 1), (0, 1):
    # mean 4/8 = 0.5, so max(0, 0.75 - 0.5) = 0.25 (step s alone would give 0.75 - 0.25 = 0.5)
    evidence = DesignerEvidence((1.0, 1.0, 0.0, 1.0), (0.0, 1.0, 0.0, 0.0), ((1.0, 1.0), (0.0, 1.0)))
    reward = designer_reward_for(RewardSettings(designer_reward="regret_released"))
    assert reward == ReleasedRegretReward()
    assert reward(evidence) == approx(0.25)
    # the old approximation (regret weight 1, scale 1, plateau 0) reads step s only: 0.5
    assert RegretPlateauReward(1.0, 1.0, 0.0, **SPEC_BAND)(evidence) == approx(0.5)
    # no cap at 1 and no regret scale: hinted 1.0, window mean -0.5 -> 1.5
    assert reward(DesignerEvidence((1.0, 1.0), (-1.0,), ((0.0,),))) == approx(1.5)


def test_released_regret_floors_a_negative_regret_and_keeps_the_sample():
    reward = ReleasedRegretReward()
    # hinted mean 0.25, window mean 0.5: regret -0.25 -> 0, not masked
    negative = DesignerEvidence((0.0, 0.0, 1.0, 0.0), (1.0, 0.0), ((1.0, 0.0),))
    positive = DesignerEvidence((1.0,), (0.0, 0.0), ((1.0, 0.0),))  # 1 - 0.25 = 0.75
    rewards = score_released(reward, [LOGIC, LOGIC], [negative, positive])
    assert rewards == approx([0.0, 0.75])
    # both samples stay and are centred on their skill's mean 0.375 (released: every sample is kept)
    assert designer_advantages(rewards, [LOGIC, LOGIC], scale=2.0) == approx([-0.75, 0.75])


def test_released_regret_reads_a_missing_hint_as_zero():
    reward = ReleasedRegretReward()
    # failed_hint: hint_return_zero keeps the environment with no hinted plays: 0 - window mean
    assert reward(DesignerEvidence((), (-0.5, 0.0), ((),), hint_failed=True)) == approx(0.25)
    assert reward(DesignerEvidence((), (0.5,), (), hint_failed=True)) == 0.0


def test_default_designer_reward_is_still_regret_plateau():
    assert RewardSettings().designer_reward == "regret_plateau"
