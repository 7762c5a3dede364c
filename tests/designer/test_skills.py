"""Designer skills and the skill curriculum (SPEC 1.1, 5)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spade.designer.skills import (
    GAME_SKILLS,
    TOOL_USE_SKILLS,
    SkillSettings,
    active_skills,
    domain_skills,
    skill_by_name,
    slot_skills,
)

GAMES = [
    "Mathematical Reasoning", "Logical Deduction", "Spatial Reasoning",
    "Pattern Recognition", "Optimization", "Causal Inference",
]
TOOLS = [
    "API Orchestration", "Data Retrieval", "State Modification",
    "Error Recovery", "Tool Selection", "Multi-Step Workflows",
]


def names(skills) -> list[str]:
    return [skill.name for skill in skills]


def test_skill_lists_match_spec():
    assert names(GAME_SKILLS) == GAMES
    assert names(TOOL_USE_SKILLS) == TOOLS
    assert domain_skills("games") is GAME_SKILLS and domain_skills("tool_use") is TOOL_USE_SKILLS
    for skill in GAME_SKILLS + TOOL_USE_SKILLS:
        assert 40 < len(skill.description) < 300 and skill.description.endswith(".")
    assert len({s.description for s in GAME_SKILLS + TOOL_USE_SKILLS}) == 12
    assert skill_by_name("Optimization") is GAME_SKILLS[4]
    with pytest.raises(ValueError, match="known skills"):
        skill_by_name("Juggling")


def test_games_rotation_over_regenerations():
    # window 3 moving by 3 over 6 skills: first half, second half, first half, ...
    first, second = GAMES[:3], GAMES[3:]
    assert [names(active_skills("games", r)) for r in range(5)] == [first, second, first, second, first]
    # with k = 4 the regeneration index of step 8 is 8 // 4 = 2
    assert names(active_skills("games", 8 // 4)) == first


def test_games_rotation_other_windows():
    # window 4: starts (r * 4) % 6 = 0, 4, 2, 0 -> wraps around the list
    expected = [
        [GAMES[0], GAMES[1], GAMES[2], GAMES[3]],
        [GAMES[4], GAMES[5], GAMES[0], GAMES[1]],
        [GAMES[2], GAMES[3], GAMES[4], GAMES[5]],
        [GAMES[0], GAMES[1], GAMES[2], GAMES[3]],
    ]
    assert [names(active_skills("games", r, 4)) for r in range(4)] == expected
    # window 2: starts 0, 2, 4, 0
    assert [names(active_skills("games", r, 2)) for r in range(4)] == [GAMES[0:2], GAMES[2:4], GAMES[4:6], GAMES[0:2]]
    # window 6: everything, every time
    assert names(active_skills("games", 7, 6)) == GAMES


def test_tool_use_all_six_every_regeneration():
    for r in range(6):
        assert names(active_skills("tool_use", r)) == TOOLS
    # a window can still be configured for tool use: window 3 -> halves alternate
    assert names(active_skills("tool_use", 1, 3)) == TOOLS[3:]


def test_two_skill_curriculum():
    for r in range(5):
        assert names(active_skills("games", r, curriculum="two_skill")) == ["Mathematical Reasoning",
                                                                            "Pattern Recognition"]
        assert names(active_skills("tool_use", r, curriculum="two_skill")) == TOOLS[:2]
    assert names(active_skills("games", 3, 2, curriculum="two_skill")) == [GAMES[0], GAMES[3]]
    with pytest.raises(ValueError, match="window"):
        active_skills("games", 0, 3, curriculum="two_skill")


def test_custom_skill_list():
    custom = [skill_by_name(n) for n in ("Optimization", "Causal Inference", "Logical Deduction", "Spatial Reasoning")]
    # 4 skills, window 3: starts 0, 3, 6 % 4 = 2
    assert [names(active_skills("games", r, skills=custom)) for r in range(3)] == [
        ["Optimization", "Causal Inference", "Logical Deduction"],
        ["Spatial Reasoning", "Optimization", "Causal Inference"],
        ["Logical Deduction", "Spatial Reasoning", "Optimization"],
    ]
    assert names(active_skills("games", 4, skills=custom, curriculum="two_skill")) == ["Optimization", "Causal Inference"]


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (("chess", 0), {}, "domain"),
        (("games", -1), {}, "regeneration_index"),
        (("games", 0, 0), {}, "window"),
        (("games", 0, 7), {}, "window"),
        (("games", 0), {"curriculum": "three_skill"}, "curriculum"),
        (("games", 0), {"skills": []}, "skills"),
    ],
)
def test_active_skills_rejects(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        active_skills(*args, **kwargs)


@given(st.integers(0, 1000), st.integers(1, 6))
def test_rotation_is_contiguous(r, window):
    # each regeneration continues where the previous one stopped, wrapping around
    now, after = active_skills("games", r, window), active_skills("games", r + 1, window)
    assert len(set(now)) == window
    assert GAME_SKILLS.index(after[0]) == (GAME_SKILLS.index(now[-1]) + 1) % 6


def test_slot_assignment():
    active = active_skills("games", 0)
    slots = slot_skills(active, 24)
    # slot i gets active[i % 3]: 0, 1, 2, 0, 1, 2, ...
    assert names(slots[:7]) == [GAMES[0], GAMES[1], GAMES[2], GAMES[0], GAMES[1], GAMES[2], GAMES[0]]
    assert all(slots.count(skill) == 8 for skill in active)  # 24 / 3
    tool_slots = slot_skills(active_skills("tool_use", 0), 24)
    assert names(tool_slots[5:8]) == [TOOLS[5], TOOLS[0], TOOLS[1]]
    assert all(tool_slots.count(skill) == 4 for skill in TOOL_USE_SKILLS)  # 24 / 6
    assert slot_skills(["x", "y"], 5) == ["x", "y", "x", "y", "x"]  # 5 slots, 2 skills: uneven is fine
    assert slot_skills(active, 0) == []
    with pytest.raises(ValueError, match="active"):
        slot_skills([], 3)
    with pytest.raises(ValueError, match="n_slots"):
        slot_skills(active, -1)


def test_skill_settings():
    assert names(SkillSettings().active("games", 1)) == GAMES[3:]
    assert names(SkillSettings().active("tool_use", 1)) == TOOLS
    assert names(SkillSettings(curriculum="two_skill").active("games", 9)) == [GAMES[0], GAMES[3]]
    custom = SkillSettings(skills=("Causal Inference", "Optimization"), window=1)
    assert [names(custom.active("games", r)) for r in range(3)] == [["Causal Inference"], ["Optimization"], ["Causal Inference"]]
    assert names(custom.skill_list("games")) == ["Causal Inference", "Optimization"]
    with pytest.raises(ValueError, match="known skills"):
        SkillSettings(skills=("Juggling",))
    with pytest.raises(ValueError, match="duplicate"):
        SkillSettings(skills=("Optimization", "Optimization"))
    with pytest.raises(ValueError, match="window"):
        SkillSettings(window=0)
    with pytest.raises(ValueError, match="window"):
        SkillSettings(curriculum="two_skill", window=3)
    with pytest.raises(ValueError, match="window"):
        SkillSettings(window=7).active("games", 0)  # more than the six skills


def test_skill_settings_from_config_mapping():
    from spade.config import ConfigError, from_mapping

    settings = from_mapping(SkillSettings, {"skills": ["Optimization", "Logical Deduction"], "window": 2}, where="skills")
    assert settings == SkillSettings(skills=("Optimization", "Logical Deduction"), window=2)
    assert from_mapping(SkillSettings, {}, where="skills") == SkillSettings()
    with pytest.raises(ConfigError, match="skills.curriculum.*full, two_skill"):
        from_mapping(SkillSettings, {"curriculum": "ten_skill"}, where="skills")


# -- selfplay.skills.descriptions (issue 39) ------------------------------------------------------

def test_skill_descriptions_default_is_unchanged():
    from spade.designer.skills import GAME_SKILLS, TOOL_USE_SKILLS, SkillSettings

    assert SkillSettings().descriptions == "spade"
    assert SkillSettings().skill_list("games") == GAME_SKILLS
    assert SkillSettings().skill_list("tool_use") == TOOL_USE_SKILLS
    assert SkillSettings().active("games", 1) == GAME_SKILLS[3:6]


def test_released_descriptions_are_the_one_liners_with_the_same_rotation():
    from spade.designer.skills import GAME_SKILLS, RELEASED_DESCRIPTIONS, TOOL_USE_SKILLS, SkillSettings

    released = SkillSettings(descriptions="released")
    assert [s.name for s in released.active("games", 1)] == [s.name for s in GAME_SKILLS[3:6]]
    assert released.active("games", 0)[2].description == "Grasping how things sit in space and turning them in the mind"
    assert [s.description for s in released.skill_list("tool_use")] == [
        RELEASED_DESCRIPTIONS[s.name] for s in TOOL_USE_SKILLS]
    for skill in released.skill_list("games") + released.skill_list("tool_use"):
        assert "\n" not in skill.description and len(skill.description.split()) <= 12
    # the two-skill ablation keeps the paper's pair, a custom list its own order
    pair = SkillSettings(curriculum="two_skill", descriptions="released").active("games", 0)
    assert [s.name for s in pair] == ["Mathematical Reasoning", "Pattern Recognition"]
    assert pair[1].description == "Spotting regularities in sequences, numbers or text"
    custom = SkillSettings(skills=("Optimization", "Causal Inference"), window=1, descriptions="released")
    assert custom.active("games", 1)[0].description == "Understanding how causes lead to effects"


def test_unknown_description_set_is_refused():
    from spade.config import ConfigError, from_mapping
    from spade.selfplay.settings import SelfPlaySettings

    with pytest.raises(ConfigError, match="selfplay.skills.descriptions: 'short' is not allowed; choose one of: "
                                          "spade, released"):
        from_mapping(SelfPlaySettings, {"skills": {"descriptions": "short"}}, where="selfplay")
