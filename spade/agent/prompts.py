"""What the reasoning agent is told (SPEC section 4: games, and the opening of a tool episode)."""

from __future__ import annotations

GAME_INSTRUCTIONS = (
    "You are playing an interactive text game. Read the situation below, think it through, and "
    "reply with exactly one action per turn. Put the action inside \\boxed{...}; only the last box "
    "in your reply counts. The game answers each action with a new observation until it ends."
)


def first_user_message(observation: str, hint: str | None = None) -> str:
    """The opening user turn: instructions, the first observation, and the hint for the hinted arm."""
    text = f"{GAME_INSTRUCTIONS}\n\n{observation}"
    if hint:
        text += f"\n\nHINT: {hint}"
    return text


def later_user_message(observation: str) -> str:
    return observation


# Tool use has no instructions of its own: the released orchestrator opens a tool episode with the
# first instruction as the only user message (no system message; the tools go through the chat
# template's ``tools=``), and the hinted arm appends the hint in its games format.


def first_tool_message(instruction: str, hint: str | None = None) -> str:
    """The opening user turn of a tool episode: the first instruction, and for the hinted arm
    ``HINT: <hint>`` after a blank line (the released ``hint_injection_template``)."""
    return f"{instruction}\n\nHINT: {hint}" if hint else instruction
