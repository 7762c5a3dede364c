"""The agent's games opening (SPEC 4): spade's layout and the paper's (``selfplay.agent_game_prompt``, issue 39)."""

from __future__ import annotations

import pytest

from spade.agent.prompts import GAME_INSTRUCTIONS, PAPER_GAME_REQUEST, PAPER_GAME_TASK, first_user_message


def test_spade_opening_is_unchanged():
    assert first_user_message("A door.") == f"{GAME_INSTRUCTIONS}\n\nA door."
    assert first_user_message("A door.", "Knock twice.") == f"{GAME_INSTRUCTIONS}\n\nA door.\n\nHINT: Knock twice."
    assert first_user_message("A door.", "Knock twice.", "spade") == first_user_message("A door.", "Knock twice.")


def test_paper_opening_is_task_line_observation_label_and_request_last():
    assert first_user_message("A door.", prompt="paper") == (
        "You are playing a text game. Take valid actions and win it.\n"
        "Observation: A door.\n"
        "Think it through step by step, and give your final answer inside \\boxed{}.")


def test_paper_opening_puts_the_hint_inside_the_observation():
    # the released hint_injection_template "{observation}\n\nHINT: {hint}" fills the Observation: slot
    assert first_user_message("A door.", "Knock twice.", "paper") == (
        f"{PAPER_GAME_TASK}\nObservation: A door.\n\nHINT: Knock twice.\n{PAPER_GAME_REQUEST}")
    assert first_user_message("A door.", "", "paper") == first_user_message("A door.", None, "paper")


def test_paper_opening_adds_nothing_else():
    text = first_user_message("OBS", prompt="paper")
    assert text.count("\n") == 2 and "\\boxed{}" in text and "step by step" in text
    assert "only the last box" not in text  # spade's own sentence on which box counts is not in it


def test_unknown_opening_is_refused():
    with pytest.raises(ValueError, match="selfplay.agent_game_prompt: 'appendix'.*spade, paper"):
        first_user_message("x", prompt="appendix")


@pytest.mark.parametrize(("name", "default", "other"), [("agent_game_prompt", "spade", "paper"),
                                                        ("action_extraction", "last_box", "first_flat_box")])
def test_agent_keys_default_to_spade_and_name_their_values(name, default, other):
    from spade.config import ConfigError, from_mapping
    from spade.selfplay.settings import SelfPlaySettings

    assert getattr(SelfPlaySettings(), name) == default
    assert getattr(from_mapping(SelfPlaySettings, {name: other}, where="selfplay"), name) == other
    with pytest.raises(ConfigError, match=f"selfplay.{name}: 'x' is not allowed; choose one of: {default}, {other}"):
        from_mapping(SelfPlaySettings, {name: "x"}, where="selfplay")
