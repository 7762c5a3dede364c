"""The delayed designer buffer and the EMA designer rewards (SPEC 1.4, 1.5; issue 15)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spade.selfplay.rewards.delay_buffer import DesignerBuffer, ReleasedDesignerSample
from spade.selfplay.rewards.designer_rewards import (DesignerEvidence, LearningPotentialReward, WindowProgressReward,
                                             designer_reward_for)
from spade.selfplay.rewards.reward_settings import RewardSettings

approx = pytest.approx


def _add(buffer: DesignerBuffer, step: int, env_id: str, skill: str = "Logical Deduction", **kw) -> None:
    buffer.add(
        step, env_id, skill, kw.get("ref", f"samples/{step}/{env_id}"),
        kw.get("hint", [1.0, 0.0]), kw.get("nohint", [0.0, 0.0]),
    )


# ---------------------------------------------------------------------------------- release timing


def test_release_timing_k4():
    buffer = DesignerBuffer(4)
    _add(buffer, 0, "a")
    _add(buffer, 0, "b")
    for step in (0, 1, 2, 3):  # 0 + 4 > step: still held
        assert buffer.release(step) == []
        assert len(buffer) == 2
    released = buffer.release(4)  # 0 + 4 <= 4
    assert [(r.env_id, r.generated_step) for r in released] == [("a", 0), ("b", 0)]
    assert len(buffer) == 0
    assert buffer.release(4) == []  # released once only

    _add(buffer, 4, "a")  # the same slot id in the next set is fine: windows do not overlap
    for step in (5, 6, 7):
        assert buffer.release(step) == []
    assert [r.generated_step for r in buffer.release(8)] == [4]


def test_late_release_takes_everything_due_in_order():
    buffer = DesignerBuffer(2)
    _add(buffer, 2, "x")
    _add(buffer, 0, "y")
    _add(buffer, 4, "z")
    released = buffer.release(5)  # due: 0 + 2 and 2 + 2 <= 5 ; 4 + 2 > 5 stays
    assert [(r.env_id, r.generated_step) for r in released] == [("y", 0), ("x", 2)]
    assert [p.env_id for p in buffer.pending] == ["z"]


# ------------------------------------------------------------------------------ window accumulation


def test_window_accumulation_and_reward():
    buffer = DesignerBuffer(4)
    buffer.add(0, "e", "Optimization", {"path": "designer/0/e.json", "index": 3}, [0.5, 0.2], [0.2, 0.3])
    buffer.record_window_returns(1, "e", [0.9, 0.9])
    buffer.record_window_returns(3, "e", [0.9])
    buffer.record_window_returns(3, "e", [0.8])  # a second batch of step 3 accumulates
    (released,) = buffer.release(4)
    # regret = mean(0.5, 0.2) - mean(0.2, 0.3) = 0.35 - 0.25 = 0.1 ; 0.1 / 0.15 = 2/3
    # window = [0.2, 0.3] + [0.9, 0.9] + [0.9, 0.8] -> 4.0 / 6 = 2/3
    # plateau(2/3) = 1 - (2/3 - 0.6) / 0.25 = 1 - 0.2667 = 0.7333
    # reward = 0.4 * 2/3 + 0.6 * 0.7333 = 0.26667 + 0.44 = 0.70667
    assert released == ReleasedDesignerSample(
        env_id="e", skill="Optimization", generated_step=0, reward=approx(0.4 * 2 / 3 + 0.6 * (1 - (2 / 3 - 0.6) / 0.25)),
        win=approx(2 / 3), regret=approx(0.1), sample_ref={"path": "designer/0/e.json", "index": 3},
        n_window_plays=6, window_steps=(0, 1, 3),
    )
    assert released.reward == approx(0.706667, abs=1e-6)


def test_regret_is_raw_and_window_only_no_hint():
    buffer = DesignerBuffer(2)
    # hint mean 0 ; no-hint at s mean 1 -> raw regret -1 (reported unfloored), regret_norm 0
    buffer.add(10, "e", "Causal Inference", "ref", [0.0, 0.0], [1.0, 1.0])
    buffer.record_window_returns(11, "e", [0.0, 0.0])
    (released,) = buffer.release(12)
    # win = (1 + 1 + 0 + 0) / 4 = 0.5 -> plateau 1 ; reward = 0.4 * 0 + 0.6 * 1 = 0.6
    assert released.regret == approx(-1.0)
    assert released.win == approx(0.5)
    assert released.reward == approx(0.6)


def test_record_outside_window_is_refused():
    buffer = DesignerBuffer(4)
    _add(buffer, 4, "e")
    with pytest.raises(KeyError):
        buffer.record_window_returns(4, "e", [1.0])  # step s itself goes through add()
    with pytest.raises(KeyError):
        buffer.record_window_returns(8, "e", [1.0])  # s + k is past the window
    with pytest.raises(KeyError):
        buffer.record_window_returns(5, "other", [1.0])
    with pytest.raises(ValueError, match="returns"):
        buffer.record_window_returns(5, "e", [float("nan")])


def test_add_validation():
    buffer = DesignerBuffer(4)
    _add(buffer, 0, "e")
    with pytest.raises(ValueError, match="overlap"):
        _add(buffer, 3, "e")
    with pytest.raises(ValueError, match="hint_returns"):
        buffer.add(0, "f", "Optimization", "ref", [], [0.0])
    with pytest.raises(ValueError, match="nohint_returns"):
        buffer.add(0, "f", "Optimization", "ref", [1.0], [])
    with pytest.raises(ValueError, match="sample_ref"):
        buffer.add(0, "f", "Optimization", ("a", 1), [1.0], [0.0])  # a tuple comes back as a list
    with pytest.raises(ValueError, match="sample_ref"):
        buffer.add(0, "f", "Optimization", object(), [1.0], [0.0])
    with pytest.raises(ValueError, match="step"):
        buffer.add(-1, "f", "Optimization", "ref", [1.0], [0.0])
    with pytest.raises(ValueError, match="k"):
        DesignerBuffer(0)
    assert len(buffer) == 1


# ---------------------------------------------------------------------------------------- JSON


def _filled_buffer() -> DesignerBuffer:
    buffer = DesignerBuffer(4, RewardSettings(regret_scale=0.2, plateau_lo=0.3))
    buffer.add(0, "a", "Optimization", {"path": "d/0/a", "tokens": 812}, [1.0, 0.0, 1.0], [0.0, 0.1])
    buffer.add(0, "b", "Spatial Reasoning", "d/0/b", [0.1 + 0.2], [1 / 3])  # floats that must survive exactly
    buffer.record_window_returns(1, "a", [0.7, 0.25])
    buffer.record_window_returns(2, "b", [])
    buffer.record_window_returns(3, "b", [0.123456789012345678, -1.0])
    buffer.add(4, "c", "Optimization", None, [1.0], [0.0])
    return buffer


def test_json_round_trip():
    buffer = _filled_buffer()
    text = json.dumps(buffer.to_json())
    restored = DesignerBuffer.from_json(json.loads(text))
    assert restored == buffer
    assert restored.to_json() == buffer.to_json()
    assert restored.k == 4 and restored.settings == RewardSettings(regret_scale=0.2, plateau_lo=0.3)
    # the resumed buffer behaves exactly like the original from here on
    for b in (buffer, restored):
        b.record_window_returns(5, "c", [0.5])
    assert restored.release(4) == buffer.release(4)
    assert restored.release(8) == buffer.release(8)
    assert restored == buffer and len(buffer) == 0


def test_json_rejects_unknown_version():
    data = _filled_buffer().to_json()
    data["version"] = 99
    with pytest.raises(ValueError, match="version"):
        DesignerBuffer.from_json(data)


@given(
    st.lists(
        st.tuples(
            st.lists(st.floats(-1, 1), min_size=1, max_size=4),
            st.lists(st.floats(-1, 1), min_size=1, max_size=4),
            st.lists(st.lists(st.floats(-1, 1), max_size=3), min_size=3, max_size=3),
        ),
        max_size=5,
    )
)
def test_json_round_trip_property(envs):
    buffer = DesignerBuffer(4)
    for i, (hint, nohint, later) in enumerate(envs):
        buffer.add(0, f"env{i}", "Logical Deduction", [i, "ref"], hint, nohint)
        for step, returns in enumerate(later, start=1):
            buffer.record_window_returns(step, f"env{i}", returns)
    restored = DesignerBuffer.from_json(json.loads(json.dumps(buffer.to_json())))
    assert restored == buffer
    assert restored.release(4) == buffer.release(4)





# --------------------------------------------------------------------------- window-progress reward


def test_window_progress_by_hand():
    wp = WindowProgressReward(fast_alpha=0.5, slow_alpha=0.1, scale=0.2)
    # means 0.2, 0.4, 0.4:
    #   fast: 0.2 -> 0.2 + 0.5 * 0.2 = 0.3 -> 0.3 + 0.5 * 0.1 = 0.35
    #   slow: 0.2 -> 0.2 + 0.1 * 0.2 = 0.22 -> 0.22 + 0.1 * 0.18 = 0.238
    #   |0.35 - 0.238| = 0.112 ; / 0.2 = 0.56
    assert wp.progress([0.2, 0.4, 0.4]) == approx(0.56)
    # falling: 0.8, 0.6: fast 0.7, slow 0.78 -> |0.7 - 0.78| / 0.2 = 0.4 (absolute change)
    assert wp.progress([0.8, 0.6]) == approx(0.4)
    # steep: 0, 1, 1: fast 0.5 -> 0.75, slow 0.1 -> 0.19 -> 0.56 / 0.2 = 2.8 -> capped at 1
    assert wp.progress([0.0, 1.0, 1.0]) == 1.0
    # flat or one step: no progress
    assert wp.progress([0.5]) == 0.0
    assert wp.progress([0.3, 0.3, 0.3, 0.3]) == approx(0.0, abs=1e-15)
    # other numbers: alphas 1.0 / 0.5, scale 1: means 0, 1 -> fast 1, slow 0.5 -> 0.5
    assert WindowProgressReward(fast_alpha=1.0, slow_alpha=0.5, scale=1.0).progress([0.0, 1.0]) == approx(0.5)


def test_window_progress_call_shape():
    wp = WindowProgressReward(fast_alpha=0.5, slow_alpha=0.1, scale=0.2)
    # step s: mean(0.1, 0.3) = 0.2 ; later steps: mean 0.4, (empty step skipped), mean 0.4 -> 0.56
    assert wp(DesignerEvidence((1.0,), (0.1, 0.3), ((0.4, 0.4), (), (0.3, 0.5)))) == approx(0.56)
    with pytest.raises(ValueError, match="nohint_returns"):
        wp(DesignerEvidence((1.0,), (), ((0.4,),)))
    with pytest.raises(ValueError, match="step_means"):
        wp.progress([])


def test_window_progress_validation_and_settings():
    with pytest.raises(ValueError, match="slow_alpha"):
        WindowProgressReward(fast_alpha=0.1, slow_alpha=0.5, scale=0.2)
    with pytest.raises(ValueError, match="scale"):
        WindowProgressReward(fast_alpha=0.5, slow_alpha=0.1, scale=0.0)
    settings = RewardSettings(designer_reward="window_progress", wp_fast_alpha=0.6, wp_slow_alpha=0.2, wp_scale=0.5)
    assert WindowProgressReward.from_settings(settings) == WindowProgressReward(0.6, 0.2, 0.5)
    assert designer_reward_for(settings) == WindowProgressReward(0.6, 0.2, 0.5)


def test_buffer_with_window_progress_reward():
    buffer = DesignerBuffer(4, RewardSettings(designer_reward="window_progress"))
    buffer.add(0, "e", "Pattern Recognition", "ref", [1.0, 1.0], [0.2, 0.2])
    buffer.record_window_returns(1, "e", [0.4, 0.4])
    buffer.record_window_returns(3, "e", [0.3, 0.5])  # step 2 had no plays
    (released,) = buffer.release(4)
    # step means 0.2, 0.4, 0.4 -> 0.56 (as above)
    assert released.reward == approx(0.56)
    # win = (0.2 + 0.2 + 0.4 + 0.4 + 0.3 + 0.5) / 6 = 2.0 / 6 ; regret = 1.0 - 0.2 = 0.8 (logged only)
    assert released.win == approx(1 / 3)
    assert released.regret == approx(0.8)
    assert released.window_steps == (0, 1, 3)


# ---------------------------------------------------- learning-potential reward (the paper, Eqs. 4-6)

A, B = "Mathematical Reasoning", "Pattern Recognition"


def _regeneration(buffer: DesignerBuffer, step: int, envs: dict[str, tuple[str, list[float], list[float]]]) -> None:
    """One set generated at ``step``: env -> (skill, no-hint returns of ``step``, of ``step + 1``)."""
    for env_id, (skill, first, later) in envs.items():
        buffer.add(step, env_id, skill, env_id, [1.0], first)
        buffer.record_window_returns(step + 1, env_id, later)


# Three regenerations, two skills. R_e = mean of the window's no-hint returns.
SETS = [
    {"a1": (A, [0.0, 0.2], [0.4]),      # R = 0.2
     "a2": (A, [0.6, 0.6], [0.6]),      # R = 0.6
     "b1": (B, [0.5], [0.5])},          # R = 0.5
    {"a1": (A, [0.8], [0.8]),           # R = 0.8
     "a2": (A, [1.0], [1.0]),           # R = 1.0
     "b1": (B, [0.0, 0.0], [0.0])},     # R = 0.0
    {"a1": (A, [0.5], [0.5]),           # R = 0.5
     "b1": (B, [1.0], [1.0])},          # R = 1.0
]
# paper Eq. 4, gamma_fast 0.98, gamma_slow 0.85 ; mu <- (1 - gamma) * mu + gamma * R_skill
#   set 1: R_A = 0.4 -> fast_A = slow_A = 0.4 (first value) ; R_B = 0.5 -> fast_B = slow_B = 0.5
#          rewards |0.2 - 0.4| = 0.2, |0.6 - 0.4| = 0.2, |0.5 - 0.5| = 0
#   set 2: R_A = 0.9 -> fast_A = 0.02 * 0.4 + 0.98 * 0.9 = 0.89 ; slow_A = 0.15 * 0.4 + 0.85 * 0.9 = 0.825
#          R_B = 0.0 -> fast_B = 0.02 * 0.5 = 0.01 ; slow_B = 0.15 * 0.5 = 0.075
#          rewards |0.8 - 0.825| = 0.025, |1.0 - 0.825| = 0.175, |0.0 - 0.075| = 0.075
#   set 3: R_A = 0.5 -> fast_A = 0.02 * 0.89 + 0.49 = 0.5078 ; slow_A = 0.15 * 0.825 + 0.425 = 0.54875
#          R_B = 1.0 -> fast_B = 0.02 * 0.01 + 0.98 = 0.9802 ; slow_B = 0.15 * 0.075 + 0.85 = 0.86125
#          rewards |0.5 - 0.54875| = 0.04875, |1.0 - 0.86125| = 0.13875
EXPECTED = [[0.2, 0.2, 0.0], [0.025, 0.175, 0.075], [0.04875, 0.13875]]
EXPECTED_EMAS = [({A: 0.4, B: 0.5}, {A: 0.4, B: 0.5}),
                 ({A: 0.89, B: 0.01}, {A: 0.825, B: 0.075}),
                 ({A: 0.5078, B: 0.9802}, {A: 0.54875, B: 0.86125})]


def _lp_buffer() -> DesignerBuffer:
    return DesignerBuffer(4, RewardSettings(designer_reward="learning_potential"))


def test_learning_potential_ema_sequence_by_hand():
    buffer = _lp_buffer()
    assert buffer.reward_state == {"fast": {}, "slow": {}}
    for index, envs in enumerate(SETS):
        _regeneration(buffer, 4 * index, envs)
        released = buffer.release(4 * index + 4)
        assert [r.env_id for r in released] == list(envs)
        assert [r.reward for r in released] == approx(EXPECTED[index])
        fast, slow = EXPECTED_EMAS[index]
        assert buffer.reward_state["fast"] == approx(fast)
        assert buffer.reward_state["slow"] == approx(slow)


def test_learning_potential_reward_is_not_centred_twice():
    """The reward is the raw distance; the per-skill centring is designer_advantages' alone."""
    from spade.selfplay.rewards.advantages import designer_advantages

    buffer = _lp_buffer()
    for index, envs in enumerate(SETS[:2]):
        _regeneration(buffer, 4 * index, envs)
        released = buffer.release(4 * index + 4)
    assert all(r.reward >= 0 for r in released)
    # set 2, skill A: 0.025 and 0.175 -> mean 0.1 -> -0.075, +0.075 ; B alone -> 0 ; scale 32
    advantages = designer_advantages([r.reward for r in released], [r.skill for r in released], 32.0)
    assert advantages == approx([-2.4, 2.4, 0.0])


def test_learning_potential_released_together_is_one_update_per_generation_step():
    """A late release of two sets updates the averages twice, in generation order."""
    late = _lp_buffer()
    _regeneration(late, 0, SETS[0])
    _regeneration(late, 4, SETS[1])
    released = late.release(8)
    assert [r.reward for r in released] == approx(EXPECTED[0] + EXPECTED[1])
    assert late.reward_state["slow"] == approx(EXPECTED_EMAS[1][1])


def test_learning_potential_resume_round_trip_gives_identical_rewards():
    straight = _lp_buffer()
    _regeneration(straight, 0, SETS[0])
    straight.release(4)
    _regeneration(straight, 4, SETS[1])  # pending across the checkpoint
    saved = json.loads(json.dumps(straight.to_json()))
    assert saved["version"] == 2 and saved["reward_state"]["slow"] == approx(EXPECTED_EMAS[0][1])
    resumed = DesignerBuffer.from_json(saved, RewardSettings(designer_reward="learning_potential"))
    assert resumed == straight
    released = {}
    for name, buffer in (("straight", straight), ("resumed", resumed)):
        first = buffer.release(8)
        _regeneration(buffer, 8, SETS[2])
        released[name] = (first, buffer.release(12))
    assert released["resumed"] == released["straight"]
    assert [r.reward for r in released["resumed"][1]] == approx(EXPECTED[2])
    assert resumed.reward_state == straight.reward_state


def test_learning_potential_validation_and_settings():
    settings = RewardSettings(designer_reward="learning_potential")
    assert (settings.lp_gamma_fast, settings.lp_gamma_slow) == (0.98, 0.85)  # paper Eq. 4, released values
    assert designer_reward_for(settings) == LearningPotentialReward(0.98, 0.85)
    assert designer_reward_for(settings) is not designer_reward_for(settings)  # fresh state each time
    with pytest.raises(ValueError, match="lp_gamma_fast"):
        RewardSettings(lp_gamma_fast=0.8)  # the fast average must take more of the new value than the slow one
    with pytest.raises(ValueError, match="lp_gamma_slow"):
        RewardSettings(lp_gamma_slow=0.0)
    with pytest.raises(ValueError, match="gamma_fast"):
        LearningPotentialReward(0.5, 0.9)
    with pytest.raises(ValueError, match="fast and slow"):
        LearningPotentialReward(0.98, 0.85).load_state_dict({"fast": {A: 0.1}, "slow": {}})


def test_learning_potential_checkpoint_written_before_issue_20_resumes():
    """A version-2 buffer written when gamma was read as a decay (settings lp_fast_decay 0.85 /
    lp_slow_decay 0.98): its settings are read back as the paper's gammas, its averages are taken
    over and updated the paper's way."""
    old = {"version": 2, "k": 4, "pending": [],
           "settings": {**{k: v for k, v in dataclasses.asdict(RewardSettings()).items()
                           if k not in ("lp_gamma_fast", "lp_gamma_slow", "advantage_agent_samples")},
                        "designer_reward": "learning_potential", "lp_fast_decay": 0.85, "lp_slow_decay": 0.98},
           "reward_state": {"fast": {A: 0.4}, "slow": {A: 0.4}}}
    for settings in (None, RewardSettings(designer_reward="learning_potential")):
        buffer = DesignerBuffer.from_json(old, settings)
        assert (buffer.settings.lp_gamma_fast, buffer.settings.lp_gamma_slow) == (0.98, 0.85)
        _regeneration(buffer, 4, {"a1": (A, [0.8], [0.8]), "a2": (A, [1.0], [1.0])})
        assert [r.reward for r in buffer.release(8)] == approx([0.025, 0.175])  # as set 2 above
        assert buffer.reward_state["fast"] == approx({A: 0.89})
        assert buffer.reward_state["slow"] == approx({A: 0.825})


def test_resume_uses_the_new_band_and_keeps_the_reward():
    """A later phase changes the plateau band on resume: the restored buffer scores with the new
    settings; changing the designer reward itself is refused."""
    buffer = DesignerBuffer(4)
    buffer.add(0, "e", A, "e", [0.3], [0.3])
    saved = json.loads(json.dumps(buffer.to_json()))
    phase2 = RewardSettings(plateau_lo=0.2, plateau_hi=0.4, plateau_ramp=0.2)
    resumed = DesignerBuffer.from_json(saved, phase2)
    assert resumed.settings == phase2
    # regret 0 ; win 0.3: old band plateau(0.3) = 1 - 0.1 / 0.25 = 0.6 -> 0.36 ; new band: inside -> 0.6
    assert DesignerBuffer.from_json(saved).release(4)[0].reward == approx(0.36)
    assert resumed.release(4)[0].reward == approx(0.6)
    with pytest.raises(ValueError, match="selfplay.rewards.designer_reward"):
        DesignerBuffer.from_json(saved, RewardSettings(designer_reward="learning_potential"))


def test_version_1_is_read_back_as_window_progress():
    """Before issue 15 the per-environment reward was called learning_potential, keys lp_*."""
    v1 = {"version": 1, "k": 4,
          "settings": {**{k: v for k, v in dataclasses.asdict(RewardSettings()).items()
                          if not k.startswith(("lp_", "wp_", "sv_"))},
                       "designer_reward": "learning_potential",
                       "lp_fast_alpha": 0.6, "lp_slow_alpha": 0.2, "lp_scale": 0.5},
          "pending": [{"env_id": "e", "skill": A, "generated_step": 0, "sample_ref": "e",
                       "hint_returns": [1.0], "nohint_returns": [0.2], "later_returns": [[1, [0.4]]]}]}
    buffer = DesignerBuffer.from_json(v1)
    assert buffer.settings.designer_reward == "window_progress"
    assert (buffer.settings.wp_fast_alpha, buffer.settings.wp_slow_alpha, buffer.settings.wp_scale) == (0.6, 0.2, 0.5)
    (released,) = buffer.release(4)
    # means 0.2, 0.4: fast 0.2 + 0.6 * 0.2 = 0.32, slow 0.2 + 0.2 * 0.2 = 0.24 -> 0.08 / 0.5 = 0.16
    assert released.reward == approx(0.16)
