"""What the reasoning agent is told (SPEC section 4: games, and the opening of a tool episode).

The games opening is ``selfplay.agent_game_prompt`` (:data:`GAME_PROMPTS`):

- ``spade`` (the default): :data:`GAME_INSTRUCTIONS`, a blank line, the observation, and for the
  hinted arm ``HINT: <hint>`` after another blank line, last.
- ``paper``: the structure the paper prints in its appendix and the released actor template
  ``qwen3_game`` runs (spade-rl/spade at 9b2b813, ``spade/core/orchestrator.py:256-267``, the same
  text as ``spade/core/prompts/template.py:60-67``), in our words and nothing added: a one-line
  task instruction, ``Observation:`` and the observation, then the request to reason step by step
  and put the final answer in ``\\boxed{}``. The hint goes inside the observation, after a blank
  line (the released ``hint_injection_template`` ``"{observation}\\n\\nHINT: {hint}"``,
  ``spade/core/types.py:157``, applied at ``orchestrator.py:1835``), so the request stays last.

Later turns are the plain observation in both.
"""

from __future__ import annotations

GAME_PROMPTS: tuple[str, ...] = ("spade", "paper")

GAME_INSTRUCTIONS = (
    "You are playing an interactive text game. Read the situation below, think it through, and "
    "reply with exactly one action per turn. Put the action inside \\boxed{...}; only the last box "
    "in your reply counts. The game answers each action with a new observation until it ends."
)


# selfplay.agent_game_prompt: paper (the appendix's structure, our words)
PAPER_GAME_TASK = "You are playing a text game. Take valid actions and win it."
PAPER_GAME_REQUEST = "Think it through step by step, and give your final answer inside \\boxed{}."


def first_user_message(observation: str, hint: str | None = None, prompt: str = "spade") -> str:
    """The opening user turn: instructions, the first observation, and the hint for the hinted arm,
    laid out as ``prompt`` says (:data:`GAME_PROMPTS`, see the module doc)."""
    if prompt == "paper":
        shown = f"{observation}\n\nHINT: {hint}" if hint else observation
        return f"{PAPER_GAME_TASK}\nObservation: {shown}\n{PAPER_GAME_REQUEST}"
    if prompt != "spade":
        raise ValueError(f"selfplay.agent_game_prompt: {prompt!r} is not allowed; choose one of: "
                         f"{', '.join(GAME_PROMPTS)}")
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
