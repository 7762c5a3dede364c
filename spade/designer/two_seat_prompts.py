"""The designer's prompt for a two-player zero-sum game (``selfplay.spiral.designed``, issue 44).

spade's extension of SPIRAL: instead of (or beside) TextArena's fixed games, the designer writes a
two-seat game that one model then plays on both seats. The prompt states the two-seat contract
(the same one :mod:`spade.envs.two_seat` checks; the wording here is this project's own), asks for
a game on a theme drawn for the attempt (:data:`THEMES`, so that a set is not the same game every
time) and for the module in one ```python block, which the ordinary code extraction
(:func:`spade.designer.extract.extract_code`) takes out of the reply.

Standard library only.
"""

from __future__ import annotations

import random

from .prompts import Message

TWO_SEAT_SYSTEM = ("You are a Python programmer who designs two-player zero-sum text games: two players take "
                   "turns, each sees only what its own seat may know, and one wins exactly when the other loses.")

THEMES = (
    "a race on a shared number line or counter where each move changes what the other may do next",
    "a game of placing marks on a small grid where lines or regions win",
    "a bidding or auction game over a few items with private budgets",
    "a hidden-information card game with a tiny deck, private hands and betting",
    "a take-away game over piles of tokens with a twist in the rules",
    "a territory game on a short path or ring of cells",
    "a guessing game where each player hides a value and asks the other questions",
    "a simple trading or negotiation game where the players exchange resources toward private goals",
)

CONTRACT = """## The two-seat contract (required)
Write one class whose name ends in `Env`, with `__init__(self, max_turns={max_turns})`, `reset` and `step`:

- `reset(self, seed=None) -> (observation, info)` starts a game. `info["player"]` is the seat to move \
(0 or 1); `observation` is the text that seat sees.
- `step(self, action) -> (observation, reward, terminated, truncated, info)` plays `action` for the seat \
to move. `action` is the move as the player wrote it: the content of its last \\boxed{{...}}, in square \
brackets, e.g. "[3]" or "[call]".
- While the game goes on: `terminated` and `truncated` are False, `reward` is 0.0, `info["player"]` is the \
seat to move next, and `observation` is what *that* seat sees.
- When the game ends: `terminated` is True and `info["rewards"]` is `[reward of seat 0, reward of seat 1]`: \
1 for the winner and -1 for the loser, or 0 and 0 for a draw. `reward` is the reward of the seat that just moved.
- An invalid or malformed move ends the game at once: the mover gets -1, the other seat 1, and \
`info["invalid_move"]` is True. Never raise on a bad move.
- If the game reaches `self.max_turns` moves with no winner, end it with `truncated` True: a draw.

Every observation the seat to move gets holds:
- the rules in short and which seat it plays (in the first observation of each seat at least);
- what it may know: the public state, its own private information, the other seat's last move when public;
- a line `Valid moves: [a], [b], ...` listing exactly the moves `step` accepts now, each in brackets;
- how to answer: put the chosen move in \\boxed{{...}}, e.g. \\boxed{{a}}.
Never show a seat the other seat's private information."""

RULES = """## Rules that keep it loadable and fair
- Python standard library only, import everything you use; no `input()`, no clock, files or network.
- Every random choice comes from `random.Random(seed)` created in `reset()`: the same seed and moves give the \
same observations.
- Every info dict holds only JSON-serialisable values (ints, floats, strings, lists, dicts).
- Both seats must be able to win by playing well; no move may win outright whatever the other seat does; \
the game must end within `max_turns` moves.
- In f-strings and `.format()` double a literal brace: write \\boxed{{...}} inside an f-string to show \\boxed{...}."""

CLOSING = "Write the complete module in one ```python block, after a short description of the game."


def draw_theme(rng: random.Random) -> str:
    """The theme of one designer attempt."""
    return rng.choice(THEMES)


def two_seat_designer_messages(theme: str, *, max_turns: int) -> list[Message]:
    """The designer's messages for one two-player game on ``theme``, lasting at most ``max_turns`` moves."""
    text = "\n\n".join((
        f"Design a new two-player zero-sum game: {theme}. Keep it small enough to finish in at most "
        f"{max_turns} moves of both players together, and make good play beat careless play.",
        CONTRACT.format(max_turns=max_turns),
        RULES,
        CLOSING,
    ))
    return [{"role": "system", "content": TWO_SEAT_SYSTEM}, {"role": "user", "content": text}]
