"""Designer and hint prompts carry every demand of SPEC section 5 and their inputs."""

from __future__ import annotations

import pytest

from spade.designer.prompts import DesignerRequest, clean_hint, designer_messages, hint_messages
from spade.designer.skills import GAME_SKILLS

SKILL = GAME_SKILLS[0]


def test_system_prompt_states_every_demand():
    system = designer_messages(DesignerRequest(SKILL, "doc"))[0]["content"]
    for demand in ("hidden state", "several turns", "random.Random(seed)", "standard library",
                   "[0, 1]", "1.0 only for full", "never the answer", "derivable from the interaction",
                   "ending in `Env`", "reset(self, seed=None)", "\\boxed{...}", "```python"):
        assert demand in system, demand


def test_user_prompt_includes_skill_document_memory_and_difficulty():
    request = DesignerRequest(SKILL, "Euclid's algorithm finds the gcd.", memory_block="## Memory\nan example",
                              difficulty="hard", max_turns=12)
    user = designer_messages(request)[1]["content"]
    assert SKILL.name in user and SKILL.description in user
    assert "<document>\nEuclid's algorithm finds the gcd.\n</document>" in user
    assert "## Memory\nan example" in user
    assert "occasionally" in user and "12 turns" in user


def test_no_corpus_and_no_memory_leave_their_sections_out():
    user = designer_messages(DesignerRequest(SKILL, None))[1]["content"]
    assert "<document>" not in user and "Memory" not in user


def test_unknown_difficulty_is_refused():
    with pytest.raises(ValueError, match="easy, medium, hard"):
        designer_messages(DesignerRequest(SKILL, "doc", difficulty="extreme"))


def test_hint_prompt_shows_the_source_and_forbids_the_answer():
    messages = hint_messages("class AEnv: pass")
    assert "Never state the secret answer" in messages[0]["content"]
    assert "```python\nclass AEnv: pass\n```" in messages[1]["content"]


def test_clean_hint():
    assert clean_hint("<think>the secret is 7</think>\n  Use   binary\nsearch. ") == "Use binary search."
    assert len(clean_hint("x" * 5000)) == 1000
