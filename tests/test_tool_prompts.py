"""Tool-use designer, hint and screen prompts (SPEC 5), and the 3:2:1:1 task-variant draw."""

from __future__ import annotations

import random
from collections import Counter

from spade.designer.prompts import DesignerRequest
from spade.designer.tool_prompts import (TOOL_APP_DOMAINS, draw_tool_variant, parse_screen_verdict,
                                         tool_designer_messages, tool_hint_messages)
from spade.designer.skills import TOOL_USE_SKILLS, SkillSettings


def test_ten_domains_and_weighted_variants():
    assert len(TOOL_APP_DOMAINS) == 10 and "project tracker" in TOOL_APP_DOMAINS
    counts = Counter(draw_tool_variant(random.Random(i))[0] for i in range(7000))
    assert set(counts) == {"execute", "read_then_write", "missing_value", "decline"}
    assert abs(counts["execute"] / 7000 - 3 / 7) < 0.03 and abs(counts["read_then_write"] / 7000 - 2 / 7) < 0.03
    assert abs(counts["decline"] / 7000 - 1 / 7) < 0.03


def test_designer_prompt_carries_the_rules():
    request = DesignerRequest(skill=TOOL_USE_SKILLS[0], document="def charge(card): ...", max_turns=25)
    system, user = tool_designer_messages(request, "banking", ("decline", "use decline_request"))
    for needle in ("ToolUseBaseEnv", "3 to 8 tools", "enum", "False on the freshly reset state", "random.Random(seed)"):
        assert needle in system["content"]
    assert "banking" in user["content"] and "decline_request" in user["content"] and "def charge" in user["content"]
    assert "<answer>done</answer>" in tool_hint_messages("x = 1")[0]["content"]


def test_all_six_tool_skills_active():
    active = SkillSettings().active("tool_use", 3)
    assert len(active) == 6 and {s.name for s in active} == {s.name for s in TOOL_USE_SKILLS}


def test_screen_verdicts():
    assert parse_screen_verdict("<think>hmm</think>\nVERDICT: yes") is True
    assert parse_screen_verdict("Reasoning...\nVerdict: NO.") is False
    assert parse_screen_verdict("I am not sure") is None
