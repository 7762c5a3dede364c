"""RLVE's difficulty rule (spade.selfplay.sources.rlve_source.DifficultyController) against sequences
worked out by hand from the rule in RLVE's slime data source: count plays at the current level
only, check once per batch when the count reaches ``accuracy_samples``, raise by one at accuracy
>= threshold, restart the count after every check. No worker processes here.
"""

from __future__ import annotations

import json

import pytest

from spade.config import ConfigError, from_mapping
from spade.selfplay.sources.rlve_settings import RLVESettings
from spade.selfplay.sources.rlve_source import DifficultyController, accurate
from spade.selfplay.settings import SelfPlaySettings

T, F = True, False


def controller(**overrides) -> DifficultyController:
    return DifficultyController(RLVESettings(**{"accuracy_samples": 4, "accuracy_threshold": 0.75, **overrides}))


def test_the_defaults_are_rlves_released_settings():
    s = RLVESettings()
    assert (s.initial_difficulty, s.difficulty_window, s.accuracy_samples, s.accuracy_threshold) == (0, 4, 128, 0.9)
    assert s.environments == "official16"  # the released baseline launcher's default set
    assert s.reward == "verifier"  # RLVE's own reward (the released adapter's 0/1: reward accuracy)


# The released launcher's official16 set (cmd/games/train_fixed_rlve_*.sh), which is RLVE's own
# 16-environment list (scripts/training/*/rlve/num-environment=16.sh), copied from there.
RELEASED_OFFICIAL16 = ("Division EuclidGame GCDOne_Counting HamiltonianPath LampChanging LargestConvexPolygon "
                       "Multiplication PCPPermutation Path_NoGoingBack_Counting SAT ShortestPath Sorting SpiralMatrix "
                       "SubsequenceReversalLNDS UndamagedSubmatrixCounting WYRLevelingGround").split()


def test_named_environment_sets():
    known = ["Zeta", *RELEASED_OFFICIAL16, "Alpha"]  # what rlve-gym lists (400 of them in 0.0.1)
    assert RLVESettings().environment_names(known) == RELEASED_OFFICIAL16
    assert RLVESettings(environments="all").environment_names(known) == known
    assert RLVESettings(environments=None).environments == "all"  # an older run's snapshot: null meant all
    assert RLVESettings(environments=("Sudoku",)).environment_names(known) == ["Sudoku"]
    loaded = from_mapping(SelfPlaySettings, {"env_source": "rlve", "rlve": {"environments": "all"}}, where="selfplay")
    assert loaded.rlve.environments == "all"
    with pytest.raises(ConfigError, match=r"selfplay\.rlve\.environments: 'official' is not allowed; "
                                          r"choose one of: official16, all"):
        from_mapping(SelfPlaySettings, {"env_source": "rlve", "rlve": {"environments": "official"}},
                     where="selfplay")


def test_slots_get_every_environment_of_a_small_set_and_a_sample_of_a_large_one():
    """The released sliding-window controller: all environments when they do not outnumber the
    slots (16 environments, 16 slots: each once a step), else a sample without replacement."""
    import random

    from spade.selfplay.sources.rlve_source import slot_environments

    assert slot_environments(RELEASED_OFFICIAL16, 16, random.Random(0)) == RELEASED_OFFICIAL16
    assert slot_environments(["A", "B", "C"], 7, random.Random(0)) == ["A", "B", "C", "A", "B", "C", "A"]
    many = [f"E{i}" for i in range(400)]
    for seed in range(5):
        chosen = slot_environments(many, 16, random.Random(seed))
        assert len(chosen) == len(set(chosen)) == 16 and set(chosen) <= set(many)


def test_window_fills_then_raises_at_exactly_the_threshold_and_restarts():
    c = controller()
    c.record("A", 0, [T, T, T])
    assert c.check() == {} and c.level("A") == 0          # 3 < 4 plays: no check yet
    assert c.state_dict()["tallies"] == {"A": [3, 3]}
    c.record("A", 0, [F])
    assert c.check() == {"A": 0.75} and c.level("A") == 1  # 3/4 = 0.75 >= 0.75: raised
    assert c.state_dict()["tallies"] == {}                 # and the count restarts
    c.record("A", 0, [T, T, T, T])                          # a problem below the new level: not counted
    assert c.check() == {} and c.state_dict()["tallies"] == {}
    c.record("A", 1, [T, F, F, T])
    assert c.check() == {"A": 0.5} and c.level("A") == 1   # 2/4 < 0.75: kept, count restarts anyway
    assert c.state_dict()["tallies"] == {}


def test_one_check_per_batch_over_everything_counted():
    c = controller()
    c.record("A", 0, [T, T, T])
    c.record("A", 0, [T, T, F])                              # one batch of 6 plays
    assert c.check() == {"A": 5 / 6} and c.level("A") == 1   # one raise, not one per 4 plays
    c.record("B", 0, [T, F])
    assert c.check() == {} and c.level("B") == 0 and c.state_dict()["tallies"] == {"B": [2, 1]}


def test_the_released_threshold_over_128_plays():
    c = DifficultyController(RLVESettings())
    c.record("A", 0, [T] * 115 + [F] * 13)   # 115/128 = 0.8984
    assert c.check() == {"A": 115 / 128} and c.level("A") == 0
    c.record("A", 0, [T] * 116 + [F] * 12)   # 116/128 = 0.9062
    assert c.level("A") == 0 and c.check() == {"A": 116 / 128} and c.level("A") == 1
    c.record("A", 1, [T] * 127)
    assert c.check() == {} and c.level("A") == 1


def test_initial_difficulty_and_state_round_trip():
    c = controller(initial_difficulty=3)
    c.record("A", 3, [T, T, T, T])
    c.record("B", 3, [T])
    c.check()
    state = json.loads(json.dumps(c.state_dict()))
    assert state == {"difficulty": {"A": 4}, "tallies": {"B": [1, 1]}}
    d = controller(initial_difficulty=3)
    d.load_state_dict(state)
    assert (d.level("A"), d.level("B"), d.level("C")) == (4, 3, 3)
    d.record("B", 3, [T, T, T])
    assert d.check() == {"B": 1.0} and d.level("B") == 4


def test_accuracy_is_rlves_passing_threshold():
    assert accurate(1.0, 1.0) and accurate(1.0 - 1e-7, 1.0)
    assert not accurate(0.99, 1.0) and not accurate(0.0, 1.0) and not accurate(-1.0, 1.0)
    assert accurate(0.95, 0.945259490504749) and not accurate(0.94, 0.945259490504749)


@pytest.mark.parametrize("key, value, message", [
    ("accuracy_samples", 0, "selfplay.rlve.accuracy_samples: must be an integer >= 1"),
    ("accuracy_threshold", 1.5, "selfplay.rlve.accuracy_threshold: must be in (0, 1]"),
    ("difficulty_window", 0, "selfplay.rlve.difficulty_window: must be an integer >= 1"),
    ("environments", [], "selfplay.rlve.environments: must be a non-empty list"),
    ("environments", "every", "selfplay.rlve.environments: 'every' is not allowed; choose one of: official16, all"),
    ("reward", "binary", "selfplay.rlve.reward: 'binary' is not allowed; choose one of: verifier, accuracy"),
    ("environments", ["Sudoku", "Sudoku"], "selfplay.rlve.environments: lists an environment twice"),
    ("request_timeout_s", 5.0, "selfplay.rlve.request_timeout_s: must exceed generation_timeout_s"),
])
def test_bad_settings_name_the_key(key, value, message):
    with pytest.raises(ConfigError) as err:
        from_mapping(SelfPlaySettings, {"env_source": "rlve", "rlve": {key: value}}, where="selfplay")
    assert message in str(err.value)


def test_the_section_loads_from_a_mapping():
    s = from_mapping(SelfPlaySettings, {"env_source": "rlve", "rlve": {"environments": ["Sudoku"], "workers": 2}},
                     where="selfplay")
    assert s.rlve == RLVESettings(environments=("Sudoku",), workers=2) and not s.designer_enabled
