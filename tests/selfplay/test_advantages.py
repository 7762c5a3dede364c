"""Advantages of both roles (SPEC 1.3, 1.4) and the episode returns they read, against values
worked out by hand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spade.envs.protocol import episode_return
from spade.selfplay.rewards.advantages import (
    agent_advantages,
    designer_advantage_scale,
    designer_advantage_weight,
    designer_advantages,
)
from spade.selfplay.rewards.reward_settings import RewardSettings

approx = pytest.approx

# ---------------------------------------------------------------------------------- episode_return


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
    assert designer_advantage_scale(192, 24, 4, 50.0) == 32.0  # games: 192 / 24 * 4 = 32
    assert designer_advantage_scale(192, 24, 8, 50.0) == 50.0  # tool use: 192 / 24 * 8 = 64 -> cap 50
    assert designer_advantage_scale(384, 24, 4, 50.0) == 50.0  # 16 plays/env: 384 / 24 * 4 = 64 -> cap 50
    assert designer_advantage_scale(96, 24, 4, 50.0) == 16.0  # 96 / 24 * 4 = 16
    assert designer_advantage_scale(192, 24, 4, cap=10.0) == 10.0  # 32 -> cap 10
    assert designer_advantage_scale(0, 24, 4, 50.0) == 0.0


@pytest.mark.parametrize(
    "args, name",
    [((192, 0, 4, 50.0), "n_designer_samples"), ((-1, 24, 4, 50.0), "n_agent_samples"), ((192, 24, 0, 50.0), "k"),
     ((192, 24, 4, 0.0), "cap")],
)
def test_designer_advantage_scale_rejects(args, name):
    with pytest.raises(ValueError, match=name):
        designer_advantage_scale(*args)


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

    config = load_train_config(Path(__file__).resolve().parents[2] / recipe)
    sp = config.selfplay
    assert (sp.k, sp.envs_per_set, sp.g_nohint) == (k, 24, 16)
    assert designer_advantage_weight(sp.rewards, sp.envs_per_set * sp.g_nohint, sp.envs_per_set, sp.k) == expected


def test_designer_advantage_weight_counts_this_step_when_asked():
    counted = RewardSettings(advantage_agent_samples=None)
    assert designer_advantage_weight(counted, 384, 24, 4) == 50.0   # 384 / 24 * 4 = 64 -> 50
    assert designer_advantage_weight(counted, 96, 24, 4) == 16.0    # 96 / 24 * 4
    assert designer_advantage_weight(RewardSettings(), 96, 20, 4) == approx(38.4)  # 192 / 20 * 4
