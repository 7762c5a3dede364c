"""TextArena's two-player games as SPIRAL plays them: one game, both seats, scored at its end.

The games are TextArena's own environments (``textarena`` pinned in requirements.txt), made by
their registry id without TextArena's default wrappers and wrapped in the observation wrapper SPIRAL
chose (:data:`~.spiral_settings.GAMES`). No move is forgiven (``error_allowance = 0``, as the
released actor sets it): an invalid move ends the game.

TextArena's games draw from Python's global ``random`` (a reset reseeds it; Kuhn Poker shuffles
its deck between rounds). Games of a step are played concurrently and the trainer keeps no global
random state of its own to disturb, but one game's draws must not depend on how the others
interleave with it: each :class:`TextArenaGame` keeps its own generator state and swaps it in
around every call into TextArena (which never awaits), so a game is a function of its seed alone.

The prompt of a turn is SPIRAL's (the released ``qwen3`` template's user message: the task line,
the observation, the request to reason and box the answer); the action is the last ``\\boxed{}``
of the reply put in TextArena's ``[action]`` form as the released ``extract_action`` does: a short
answer without brackets gets them, whitespace is collapsed (:func:`spade.envs.two_seat.action_of`,
also the move format of the designed two-seat games).
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from typing import Any, Iterator

from ...envs.two_seat import action_of  # noqa: F401  (the move format is the two-seat contract's)
from .spiral_settings import GAMES, SpiralSettings

TASK_LINE = "You are playing a two-player zero-sum game. Make valid actions to win."
REASONING_REQUEST = "Please reason step by step, and put your final answer within \\boxed{}."


def turn_prompt(observation: str) -> str:
    """The user message of one turn (the chat template adds the rest)."""
    return f"{TASK_LINE}\nObservation: {observation}\n{REASONING_REQUEST}"


@dataclass
class GameEnd:
    """How a game ended: each seat's return, and why (``terminated``, ``invalid_move``, ``truncated``)."""

    returns: dict[int, float]
    reason: str
    invalid_mover: int | None = None


def _wrapped(env: Any, wrapper: str) -> Any:
    from textarena.wrappers import LLMObservationWrapper
    from textarena.wrappers.ObservationWrappers.llm_observation_wrapper import FirstLastObservationWrapper

    return LLMObservationWrapper(env) if wrapper == "history" else FirstLastObservationWrapper(env)


class TextArenaGame:
    """One game of ``name`` (a key of GAMES), reset with ``seed``."""

    def __init__(self, name: str, seed: int, settings: SpiralSettings):
        self.name = name
        self.settings = settings
        self.turns = 0
        self.end: GameEnd | None = None
        textarena_id, wrapper = GAMES[name]
        self._random = random.Random(seed).getstate()
        with self._own_random():  # importing textarena draws from the generator too
            import textarena

            self.env = _wrapped(textarena.make(textarena_id), wrapper)
            self.env.reset(num_players=2, seed=seed)
            self.env.state.error_allowance = 0

    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        outer = random.getstate()
        random.setstate(self._random)
        try:
            yield
        finally:
            self._random = random.getstate()
            random.setstate(outer)

    def observation(self) -> tuple[int, str]:
        """The seat to move and what it sees."""
        with self._own_random():
            seat, observation = self.env.get_observation()
        return int(seat), str(observation)

    def play(self, seat: int, action: str) -> bool:
        """Seat ``seat`` plays ``action``; True when the game is over (then :attr:`end` says how)."""
        with self._own_random():
            done, _ = self.env.step(action=action)
        self.turns += 1
        if done:
            self._close()
        elif self.turns >= self.settings.max_turns:
            self.end = GameEnd({0: 0.0, 1: 0.0}, "truncated")
            done = True
        return bool(done)

    def stop_as_draw(self, reason: str) -> None:
        """End the game where it stands, a draw (a seat that could not reply: its context was full)."""
        self.end = GameEnd({0: 0.0, 1: 0.0}, reason)

    def _close(self) -> None:
        with self._own_random():
            rewards, info = self.env.close()
        invalid = [seat for seat in (0, 1) if (info or {}).get(seat, {}).get("invalid_move")]
        if invalid:
            mover = invalid[0]
            self.end = GameEnd(self.settings.returns_of_invalid_move(mover), "invalid_move", mover)
        else:
            self.end = GameEnd({seat: float(rewards[seat]) for seat in (0, 1)}, "terminated")
