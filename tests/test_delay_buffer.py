"""The delayed designer buffer and the learning-potential reward (SPEC 1.4, 1.5)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spade.selfplay.delay_buffer import DesignerBuffer, ReleasedDesignerSample
from spade.selfplay.rewards import DesignerEvidence, LearningPotentialReward, designer_reward_for
from spade.selfplay.rewards import RewardSettings

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


# ------------------------------------------------------------------------ learning-potential reward


def test_learning_potential_by_hand():
    lp = LearningPotentialReward()  # alphas 0.5 / 0.1, scale 0.2
    # means 0.2, 0.4, 0.4:
    #   fast: 0.2 -> 0.2 + 0.5 * 0.2 = 0.3 -> 0.3 + 0.5 * 0.1 = 0.35
    #   slow: 0.2 -> 0.2 + 0.1 * 0.2 = 0.22 -> 0.22 + 0.1 * 0.18 = 0.238
    #   |0.35 - 0.238| = 0.112 ; / 0.2 = 0.56
    assert lp.progress([0.2, 0.4, 0.4]) == approx(0.56)
    # falling: 0.8, 0.6: fast 0.7, slow 0.78 -> |0.7 - 0.78| / 0.2 = 0.4 (absolute change)
    assert lp.progress([0.8, 0.6]) == approx(0.4)
    # steep: 0, 1, 1: fast 0.5 -> 0.75, slow 0.1 -> 0.19 -> 0.56 / 0.2 = 2.8 -> capped at 1
    assert lp.progress([0.0, 1.0, 1.0]) == 1.0
    # flat or one step: no progress
    assert lp.progress([0.5]) == 0.0
    assert lp.progress([0.3, 0.3, 0.3, 0.3]) == approx(0.0, abs=1e-15)
    # other numbers: alphas 1.0 / 0.5, scale 1: means 0, 1 -> fast 1, slow 0.5 -> 0.5
    assert LearningPotentialReward(fast_alpha=1.0, slow_alpha=0.5, scale=1.0).progress([0.0, 1.0]) == approx(0.5)


def test_learning_potential_call_shape():
    lp = LearningPotentialReward()
    # step s: mean(0.1, 0.3) = 0.2 ; later steps: mean 0.4, (empty step skipped), mean 0.4 -> 0.56
    assert lp(DesignerEvidence((1.0,), (0.1, 0.3), ((0.4, 0.4), (), (0.3, 0.5)))) == approx(0.56)
    with pytest.raises(ValueError, match="nohint_returns"):
        lp(DesignerEvidence((1.0,), (), ((0.4,),)))
    with pytest.raises(ValueError, match="step_means"):
        lp.progress([])


def test_learning_potential_validation_and_settings():
    with pytest.raises(ValueError, match="slow_alpha"):
        LearningPotentialReward(fast_alpha=0.1, slow_alpha=0.5)
    with pytest.raises(ValueError, match="scale"):
        LearningPotentialReward(scale=0.0)
    settings = RewardSettings(designer_reward="learning_potential", lp_fast_alpha=0.6, lp_slow_alpha=0.2, lp_scale=0.5)
    assert LearningPotentialReward.from_settings(settings) == LearningPotentialReward(0.6, 0.2, 0.5)
    assert designer_reward_for(settings) == LearningPotentialReward(0.6, 0.2, 0.5)


def test_buffer_with_learning_potential_reward():
    buffer = DesignerBuffer(4, RewardSettings(designer_reward="learning_potential"))
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
