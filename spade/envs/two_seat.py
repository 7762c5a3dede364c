"""Designed two-player games: the contract generated code follows, and one game of it played in the sandbox.

spade's extension of SPIRAL (``selfplay.spiral.designed.enabled``, issue 44): the designer writes a
two-player zero-sum game that the model then plays on both seats, as it plays TextArena's. The
generated code is an ordinary sandboxed environment (a class whose name ends in ``Env``, loaded,
reset and stepped by :mod:`spade.envs.sandbox` exactly as a one-player game is); what makes it a
two-seat game is what its returns mean:

* ``reset(seed=None) -> (observation, info)`` starts a game. ``info["player"]`` is the seat to move
  (0 or 1) and ``observation`` is what that seat sees: the rules, its own private information, the
  public state, and a line ``Valid moves: [a], [b], ...`` listing the moves it may make now.
* ``step(action) -> (observation, reward, terminated, truncated, info)`` plays ``action`` for the
  seat to move. ``action`` is the move as the player wrote it: the content of the last ``\\boxed{}``
  of its reply, in square brackets (``"[3]"``, ``"[raise]"``; :func:`action_of`). While the game
  goes on, ``terminated`` is false, ``reward`` 0, ``info["player"]`` the seat to move next and the
  observation what *that* seat sees (its own view: nothing private to the other seat).
* When the game ends, ``terminated`` is true and ``info["rewards"]`` is ``[seat 0's, seat 1's]``:
  1 for a win, 0 for a draw, -1 for a loss, summing to 0; ``reward`` is the mover's. An invalid move
  ends the game: the mover loses (-1, the other seat +1) and ``info["invalid_move"]`` is true.
  ``truncated`` true ends the game as a draw (the game's own turn limit).
* Everything random is drawn from ``random.Random(seed)``: a seed and the same moves give the
  same observations.

:class:`TwoSeatGame` plays one game through any :class:`~spade.envs.protocol.EnvInstance` (the
sandboxed environment), checks every return against the contract (a break is a ``bad_return``
:class:`~spade.envs.protocol.EnvFault`), and cuts a game at ``max_turns`` moves as a draw. The
admission checks are :mod:`spade.envs.two_seat_admission`; the policies that probe a candidate
:mod:`spade.envs.two_seat_probes`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..agent.actions import boxed_contents
from .protocol import EnvError, EnvFault, EnvInstance, ErrorKind, Stage
from .sandbox.client import ActionRefused

SEATS = (0, 1)
SHORT_ACTION_WORDS = 5  # an answer of at most this many words without brackets gets them
OUTCOMES = (-1.0, 0.0, 1.0)
_MOVES_LINE = re.compile(r"(?:valid|legal|available)\s+(?:moves|actions)[^\n]*", re.IGNORECASE)
_BRACKETED = re.compile(r"\[([^\[\]\n]{1,60})\]")


def action_of(reply: str) -> str:
    r"""The move in ``reply``: its last ``\boxed{}`` (``\text{}`` unwrapped), else the whole reply,
    in ``[move]`` form when it is a short answer without brackets (SPIRAL's ``extract_action``)."""
    boxes = boxed_contents(reply)
    text = boxes[-1].strip() if boxes else reply.strip()
    if text.startswith("\\text{") and text.endswith("}"):
        text = text[len("\\text{"):-1]
    if "[" not in text and "]" not in text and len(text.split()) <= SHORT_ACTION_WORDS:
        text = f"[{text}]"
    return " ".join(text.split())


def valid_moves(observation: str) -> tuple[str, ...]:
    """The moves the observation's ``Valid moves:`` line lists, without their brackets (the last
    such line; () when there is none)."""
    lines = _MOVES_LINE.findall(observation)
    return tuple(m.strip() for m in _BRACKETED.findall(lines[-1])) if lines else ()


@dataclass(frozen=True)
class GameEnd:
    """How a game ended: each seat's reward and why: ``terminated`` (the rules), ``invalid_move``
    (``invalid_mover`` lost by it), ``truncated`` (the game's own limit, a draw) or ``turn_limit``
    (cut at ``max_turns`` moves, a draw)."""

    rewards: tuple[float, float]
    reason: str
    invalid_mover: int | None = None

    def winner(self) -> int | None:
        return None if self.rewards[0] == self.rewards[1] else (0 if self.rewards[0] > self.rewards[1] else 1)


def _bad(stage: Stage, message: str) -> EnvFault:
    return EnvFault(EnvError(ErrorKind.BAD_RETURN, stage, message))


def _seat(info: dict[str, Any], call: str, stage: Stage) -> int:
    seat = info.get("player")
    if isinstance(seat, bool) or seat not in SEATS:
        raise _bad(stage, f"{call}() must say the seat to move as info['player'] (0 or 1), got {seat!r}")
    return int(seat)


def _rewards(info: dict[str, Any]) -> tuple[float, float]:
    rewards = info.get("rewards")
    if (not isinstance(rewards, (list, tuple)) or len(rewards) != 2
            or any(isinstance(r, bool) or not isinstance(r, (int, float)) or float(r) not in OUTCOMES for r in rewards)
            or float(rewards[0]) + float(rewards[1]) != 0.0):
        raise _bad(Stage.STEP, "a game that ends must give info['rewards'] = [seat 0's, seat 1's], each 1, 0 or -1 "
                               f"and summing to 0, got {rewards!r}")
    return float(rewards[0]), float(rewards[1])


class TwoSeatGame:
    """One game of a designed two-seat environment: :meth:`start`, then :meth:`move` for
    :attr:`seat` until :attr:`end` is set. Contract breaks raise ``bad_return`` EnvFaults; the
    environment's own faults pass through."""

    def __init__(self, env: EnvInstance, max_turns: int):
        self.env = env
        self.max_turns = max_turns
        self.seat = 0
        self.observation = ""
        self.turns = 0
        self.end: GameEnd | None = None

    async def start(self, seed: int) -> "TwoSeatGame":
        first = await self.env.reset(seed=seed)
        self.seat, self.observation = _seat(first.info, "reset", Stage.RESET), first.observation
        self.turns, self.end = 0, None
        return self

    async def move(self, action: str) -> bool:
        """The seat to move plays ``action``; True when the game is over (:attr:`end` says how)."""
        mover = self.seat
        self.turns += 1
        try:
            result = await self.env.step(action)
        except ActionRefused:  # too long for the sandbox to send: an invalid move
            self.end = GameEnd((-1.0, 1.0) if mover == 0 else (1.0, -1.0), "invalid_move", mover)
            return True
        info = result.info
        if result.terminated:
            rewards = _rewards(info)
            if info.get("invalid_move") is True:
                self.end = GameEnd(rewards, "invalid_move", mover)
            else:
                self.end = GameEnd(rewards, "terminated")
        elif result.truncated:
            self.end = GameEnd((0.0, 0.0), "truncated")
        else:
            if result.reward != 0.0:
                raise _bad(Stage.STEP, f"step() gave reward {result.reward:g} before the game ended (rewards come "
                                       "at the end, in info['rewards'])")
            self.seat, self.observation = _seat(info, "step", Stage.STEP), result.observation
            if self.turns >= self.max_turns:
                self.end = GameEnd((0.0, 0.0), "turn_limit")
        return self.end is not None

    def stop_as_draw(self, reason: str) -> None:
        """End the game where it stands, a draw (a seat that could not reply, a fault in play)."""
        self.end = GameEnd((0.0, 0.0), reason)
