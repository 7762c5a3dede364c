"""What the reasoning agent is told (SPEC section 4, games)."""

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


TOOL_INSTRUCTIONS = (
    "You are an assistant that carries out a user's requests with the tools provided. Requests "
    "arrive one at a time. Call tools to look things up and make changes; each result comes back "
    "to you. Ask nothing you can find out with a tool, and decline what the tools are not meant "
    "for. When every request has been completed, reply exactly <answer>done</answer>."
)


def first_tool_message(instruction: str, hint: str | None = None) -> str:
    """The opening user turn of a tool episode: the first instruction (and the hint, hinted arm)."""
    return f"{instruction}\n\nHINT: {hint}" if hint else instruction
