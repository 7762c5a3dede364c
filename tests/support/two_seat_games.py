"""Hand-written designed two-seat games (the contract of ``spade.envs.two_seat``) for the admission
and SPIRAL tests: TicTacToe as an honest game, and variants that admission must reject.

``tic_tac_toe(variant)``: ``honest``; ``one_sided`` (only seat 0's lines count); ``always_draw``
(no line ever wins); ``degenerate_win`` (the move ``[0]`` wins outright); ``no_player`` (reset
leaves out ``info["player"]``).
"""

from __future__ import annotations

TIC_TAC_TOE = '''
import random


class TicTacToeEnv:
    """Three in a row on a 3x3 grid; the cells are 1-9; the first mover is drawn from the seed."""

    LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]

    def __init__(self, max_turns=20):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.board = [" "] * 9
        self.player = self.rng.randrange(2)
        self.moves = 0
        return self._observation(), PLAYER_INFO

    def _observation(self):
        rows = "\\n".join("|".join(self.board[r * 3:r * 3 + 3]) for r in range(3))
        valid = ", ".join(f"[{i + 1}]" for i in range(9) if self.board[i] == " ")
        mark = "XO"[self.player]
        return (f"Tic-tac-toe. You are seat {self.player} ({mark}). Board:\\n{rows}\\n"
                f"Answer with \\\\boxed{{cell}}.\\nValid moves: {valid}")

    def _end(self, rewards, **extra):
        return "Game over.", float(rewards[self.player]), True, False, {"rewards": rewards, **extra}

    def _won_by(self, mover):
        rewards = [0, 0]
        rewards[mover], rewards[1 - mover] = 1, -1
        return rewards

    def step(self, action):
        mover = self.player
        cell = action.strip("[] ")
        SHORTCUT
        if not cell.isdigit() or not 1 <= int(cell) <= 9 or self.board[int(cell) - 1] != " ":
            return self._end(self._won_by(1 - mover), invalid_move=True)
        self.board[int(cell) - 1] = "XO"[mover]
        self.moves += 1
        if WIN_CHECK:
            return self._end(self._won_by(mover))
        if " " not in self.board or self.moves >= self.max_turns:
            return self._end([0, 0])
        self.player = 1 - mover
        return self._observation(), 0.0, False, False, {"player": self.player}
'''

_LINE = 'any(all(self.board[i] == "XO"[mover] for i in line) for line in self.LINES)'
VARIANTS = {
    "honest": {},
    "one_sided": {"WIN_CHECK": "mover == 0 and " + _LINE},
    "always_draw": {"WIN_CHECK": "False"},
    "degenerate_win": {"SHORTCUT": 'if cell == "0":\n            return self._end(self._won_by(mover))'},
    "no_player": {"PLAYER_INFO": "{}"},
}


def tic_tac_toe(variant: str = "honest") -> str:
    """The TicTacToe source with ``variant``'s change."""
    parts = {"WIN_CHECK": _LINE, "SHORTCUT": "pass", "PLAYER_INFO": '{"player": self.player}', **VARIANTS[variant]}
    source = TIC_TAC_TOE
    for marker, text in parts.items():
        source = source.replace(marker, text)
    return source
