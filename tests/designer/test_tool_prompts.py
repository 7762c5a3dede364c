"""Tool-use designer, hint and screen prompts (SPEC 5), and the 3:2:1:1 task-variant draw.

The structure is checked against the paper's tool-use prompt (App. C.1, Sec. 5.3) as the released
code runs it (``spare/core/prompts/tool_use_template.py``, the multi-turn template the tool-use
launchers select with ``SPARE_MULTITURN_ENV_GEN=1``; ``spare/core/hint_generator.py``;
``spare/core/env_validator.py``): which sections exist, in which order, and what each requires.
"""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from spade.designer.prompts import DesignerRequest
from spade.designer.skills import TOOL_USE_SKILLS, SkillSettings, skill_by_name
from spade.designer.tool_prompts import (TOOL_APP_DOMAINS, TOOL_DESIGNER_SYSTEM, TOOL_HINT_SYSTEM,
                                         TOOL_SCREEN_SYSTEM, draw_tool_variant, parse_screen_verdict,
                                         screen_messages, tool_designer_messages, tool_hint_messages)

DOCUMENT = "def charge(card, cents):\n    return gateway.post(card, cents)"
MEMORY = "## Environments from your memory\nearlier environments"


def _user(variant=("execute", "run it"), *, document: str | None = DOCUMENT, memory: str = MEMORY,
          skill: str = "Data Retrieval", difficulty: str = "medium") -> str:
    request = DesignerRequest(skill=skill_by_name(skill), document=document, memory_block=memory,
                              difficulty=difficulty, max_turns=25)
    messages = tool_designer_messages(request, "banking", variant)
    assert [m["role"] for m in messages] == ["system", "user"]
    return messages[1]["content"]


def _variant(name: str) -> str:
    for seed in range(200):
        drawn = draw_tool_variant(random.Random(seed))
        if drawn[0] == name:
            return drawn[1]
    raise AssertionError(f"variant {name} never drawn")


def test_ten_domains_and_weighted_variants():
    assert len(TOOL_APP_DOMAINS) == 10 and "project tracker" in TOOL_APP_DOMAINS
    counts = Counter(draw_tool_variant(random.Random(i))[0] for i in range(7000))
    assert set(counts) == {"execute", "read_then_write", "missing_value", "decline"}
    assert abs(counts["execute"] / 7000 - 3 / 7) < 0.03 and abs(counts["read_then_write"] / 7000 - 2 / 7) < 0.03
    assert abs(counts["decline"] / 7000 - 1 / 7) < 0.03


def test_all_six_tool_skills_active():
    active = SkillSettings().active("tool_use", 3)
    assert len(active) == 6 and {s.name for s in active} == {s.name for s in TOOL_USE_SKILLS}


# -------------------------------------------------------------------------- the designer prompt


def test_user_prompt_order_is_the_released_one():
    """Released multi-turn template: skill first, then difficulty, domain, task variant, skill focus
    and example tasks, then the document, and the memory block appended at the very end."""
    user = _user()
    marks = ["## Skill to train: Data Retrieval", "## Difficulty", "## Application domain\nbanking",
             "## Task variant: execute", "## Skill focus", "## Source code document", DOCUMENT, MEMORY]
    positions = [user.index(mark) for mark in marks]
    assert positions == sorted(positions), list(zip(marks, positions))
    assert user.rstrip().endswith("earlier environments")  # the memory block is the last thing


def test_the_document_is_optional_surface_flavour():
    """Released: the document may lend names, numbers or entities; the domain stays fixed, the task
    is not about the document and no instruction mentions it. Not 'borrow its data model'."""
    user = _user()
    section = user.split("## Source code document", 1)[1].split(DOCUMENT, 1)[0].lower()
    assert "optional" in section and "names" in section and "domain" in section
    assert "data model" not in section and "must" not in section.split("domain")[0]
    assert "never" in section and "instruction" in section  # the instructions never refer to it
    assert "## Source code document" not in _user(document=None)


def test_difficulty_line_is_the_word_alone():
    """The paper's tool-use difficulty is 'medium', as released prints it: no win-rate targets, no turn count."""
    user = _user()
    section = user.split("## Difficulty\n", 1)[1].split("\n\n", 1)[0]
    assert section.strip() == "medium"
    assert "%" not in user.split("## Source code document", 1)[0] and "win " not in section
    with pytest.raises(ValueError, match="difficulty 'extreme'"):
        _user(difficulty="extreme")


def test_domain_block_is_a_realistic_user_goal():
    section = _user().split("## Application domain\n", 1)[1].split("\n\n", 1)[0]
    first, rest = section.split("\n", 1)
    assert first == "banking"  # the first line names the domain alone
    assert "accounts" in rest and "transfer" in rest  # its objects and operations
    assert "quiz" in rest or "exam" in rest  # not a test about a document


def test_skill_category_and_example_task_shapes():
    """Released shows the skill's category ('SKILL FOCUS') and its four example task shapes."""
    for skill in TOOL_USE_SKILLS:
        user = _user(skill=skill.name)
        focus = user.split("## Skill focus", 1)[1].split("\n\n", 1)[0]
        bullets = [line for line in focus.splitlines() if line.startswith("- ")]
        assert len(bullets) == 4, (skill.name, focus)
        assert focus.splitlines()[0].startswith(": ") and len(focus.splitlines()[0]) > 3  # the category


def test_missing_value_is_found_with_a_read_tool():
    """Paper / released: the agent must find the value with a read tool, and the write tool
    rejects a wrong or guessed value. Not: no tool reveals it and the agent asks the user."""
    text = _variant("missing_value").lower()
    assert "read tool" in text and "guess" in text and "error" in text
    assert "ask" not in text and "no tool" not in text


def test_read_then_write_branches_on_what_was_read():
    text = _variant("read_then_write").lower()
    assert "read tool" in text and "condition" in text
    assert "not only that" in text  # the criterion checks the conditional writes, not merely a call


def test_decline_variant_names_its_tool_and_parameter():
    text = _variant("decline")
    assert "exactly one" in text.lower() and "`decline_request`" in text and "`reason`" in text
    assert "no other tool" in text.lower()


def test_execute_variant_is_the_happy_path():
    text = _variant("execute").lower()
    assert "in order" in text and "state" in text


def test_system_prompt_states_the_class_contract():
    system = TOOL_DESIGNER_SYSTEM
    for attribute in ("self._state", "self._tools", "self._user_messages", "self._message_criteria",
                      "self._current_msg = 0", "solution(self)", "tool_<name>", "random.Random(seed)"):
        assert attribute in system, attribute
    # the protocol: the next instruction arrives inside the tool result, written by _advance_if_done
    assert "self._advance_if_done()" in system
    assert "[STEP n COMPLETE — NEW INSTRUCTION]" in system and "[ALL STEPS COMPLETE]" in system
    assert "<answer>done</answer>" in system
    assert "do not import" in system.lower() and "ToolUseBaseEnv" in system


def test_system_prompt_instruction_rules():
    system = TOOL_DESIGNER_SYSTEM.lower()
    assert "4 to 8 tool calls" in system  # per instruction
    assert "never name a tool" in system  # user messages use natural-language goals only
    assert "one at a time" in system and "3 to 5" in system and "3 to 8 tools" in system
    assert "enum" in system and "required" in system and "distractor" in system


def test_system_prompt_criterion_rules():
    """The released template's six soundness rules for success criteria."""
    system = TOOL_DESIGNER_SYSTEM.lower()
    for needle in ("false on the state that reset", "same shape", "derivable", "can succeed",
                   "exactly what its criterion checks", "trace"):
        assert needle in system, needle


def test_the_example_in_the_system_prompt_runs_on_the_base_class():
    """The prompt's example module is a working environment: every criterion false at reset, the
    solution's calls meet them in order, and the last result says that all steps are complete."""
    from spade.envs.tool_use import ToolUseBaseEnv

    code = re.search(r"```python\n(.*?)```", TOOL_DESIGNER_SYSTEM, re.DOTALL).group(1)
    namespace = {"ToolUseBaseEnv": ToolUseBaseEnv}
    exec(compile(code, "<prompt example>", "exec"), namespace)  # noqa: S102 - our own prompt's example
    [cls] = [v for k, v in namespace.items() if k.endswith("Env") and k != "ToolUseBaseEnv"]
    env = cls()
    first = env.reset(seed=3)
    first_text = first[0] if isinstance(first, tuple) else first
    assert first_text == env._user_messages[0] and 3 <= len(env._user_messages) <= 5
    assert not any(criterion(env._state) for criterion in env._message_criteria)
    calls = re.findall(r"(\w+)\((.*?)\)", env.solution())
    outputs = []
    for name, args in calls:
        arguments = dict(re.findall(r"(\w+)=['\"]?([^,'\"]+)['\"]?", args))
        result = env.execute_tool(name, arguments)
        assert result["returncode"] == 0, result
        outputs.append(result["output"])
    assert env._current_msg == len(env._user_messages)
    # the notices the base class writes are the ones the prompt quotes
    assert outputs[0].endswith(f"[STEP 1 COMPLETE — NEW INSTRUCTION] {env._user_messages[1]}")
    assert "`[STEP n COMPLETE — NEW INSTRUCTION] <the next instruction>`" in TOOL_DESIGNER_SYSTEM
    quoted = re.search(r"after the last one with\s+`([^`]*)`", TOOL_DESIGNER_SYSTEM).group(1)
    assert outputs[-1].endswith(quoted) and outputs[-1].count("[ALL STEPS COMPLETE]") == 1
    assert "<answer>done</answer>" in env.solution()


# -------------------------------------------------------------------------- hint


def test_hint_prompt_asks_for_tool_roles_without_values():
    """Paper / released: a short plan in terms of tool roles and phases, with placeholders, never
    concrete values or a filled-in call sequence (ours listed up to six named calls in order)."""
    hint = TOOL_HINT_SYSTEM.lower()
    assert "role" in hint and "placeholder" in hint and "phase" in hint
    assert "never" in hint and "value" in hint and "copying" in hint
    assert "naming which tools" not in hint and "six steps" not in hint
    assert "2 or 3 sentences" in hint and "100 words" in hint
    assert "<answer>done</answer>" in hint and "decline" in hint
    user = tool_hint_messages("x = 1")[1]["content"]
    assert "```python\nx = 1\n```" in user


# -------------------------------------------------------------------------- model screen


def test_screen_prompt_checks_what_the_released_validator_checks():
    system, user = screen_messages("class AEnv(ToolUseBaseEnv): pass", '[{"type": "function"}]')
    assert system["content"] == TOOL_SCREEN_SYSTEM
    text = user["content"]
    assert "class AEnv" in text and "Tools:\n[" in text
    lowered = text.lower()
    for needle in ("type mismatch", "underivable", "majority", "pre-satisfied", "never succeed",
                   "random", "do not reject for difficulty"):
        assert needle in lowered, needle
    assert text.rstrip().endswith("\\boxed{yes}.") and "\\boxed{no}" in text
    # the source comes before the checks, as released
    assert text.index("class AEnv") < text.lower().index("type mismatch")
    assert "Tools:" not in screen_messages("x = 1")[1]["content"]


def test_screen_verdicts():
    assert parse_screen_verdict("Trace...\n\\boxed{yes}") is True
    assert parse_screen_verdict("criterion 2 is never reached\n\\boxed{no}") is False
    assert parse_screen_verdict("\\boxed{ Yes }") is True and parse_screen_verdict("\\boxed{true}") is True
    assert parse_screen_verdict("\\boxed{unclear}") is False  # released: any other boxed word rejects
    assert parse_screen_verdict("\\boxed{\\text{yes}}") is True
    assert parse_screen_verdict("\\boxed{\\textbf{no}}") is False
    assert parse_screen_verdict("<think>maybe \\boxed{no}</think>\nAll fine. \\boxed{yes}") is True
    assert parse_screen_verdict("I would answer \\boxed{no} if... but it is fine: \\boxed{yes}") is True
    # the older line form still reads
    assert parse_screen_verdict("<think>hmm</think>\nVERDICT: yes") is True
    assert parse_screen_verdict("Reasoning...\nVerdict: NO.") is False
    assert parse_screen_verdict("I am not sure") is None
    assert parse_screen_verdict("<think>\\boxed{no}</think>") is None
