"""SPIRAL's role-conditioned advantage estimation (RAE), a baseline per (game, seat).

In a two-player game the seats are not alike (the first mover of TicTacToe wins more often), so a
single baseline over both seats leaves the seat's edge in the advantage. RAE keeps one exponential
moving average of the return per game and seat, ``b <- decay * b + (1 - decay) * R``, starting at
0, and gives a seat's play the advantage ``R - b`` with ``b`` read *before* that play's return
updates it (the released ``prepare_trajectories``, ``train_spiral.py:488-493``: the baseline is
then independent of the return it is subtracted from). Plays are taken in the order given: game by
game, seat 0 before seat 1, as the released actor walks its games.

The averages are the only state; :meth:`RoleBaselines.state_dict` goes into the orchestrator's
checkpoint through the SPIRAL source, so a resumed run continues with the same baselines.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

STATE_VERSION = 1


class RoleBaselines:
    def __init__(self, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay = float(decay)
        self.values: dict[tuple[str, int], float] = {}  # (game, seat) -> moving average of its return
        self.updates: dict[tuple[str, int], int] = {}   # (game, seat) -> returns folded in so far

    def baseline(self, game: str, seat: int) -> float:
        return self.values.get((game, seat), 0.0)

    def advantage(self, game: str, seat: int, episode_return: float) -> float:
        """``episode_return`` less the (game, seat) baseline, which then takes the return in."""
        key = (game, int(seat))
        before = self.values.get(key, 0.0)
        self.values[key] = self.decay * before + (1.0 - self.decay) * float(episode_return)
        self.updates[key] = self.updates.get(key, 0) + 1
        return float(episode_return) - before

    def advantages(self, game: str, seat_returns: Iterable[tuple[int, float]]) -> list[float]:
        """One advantage per ``(seat, return)``, in order (each updating its seat's baseline)."""
        return [self.advantage(game, seat, ret) for seat, ret in seat_returns]

    def keep_only(self, keep: Callable[[str], bool]) -> None:
        """Forget the baselines of every game ``keep`` says no to (designed games that left the set)."""
        self.values = {key: value for key, value in self.values.items() if keep(key[0])}
        self.updates = {key: n for key, n in self.updates.items() if keep(key[0])}

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "decay": self.decay,
                "baselines": [[game, seat, value, self.updates.get((game, seat), 0)]
                              for (game, seat), value in sorted(self.values.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"role baselines state version {state.get('version')!r}, expected {STATE_VERSION}")
        self.values = {(str(g), int(s)): float(v) for g, s, v, _ in state["baselines"]}
        self.updates = {(str(g), int(s)): int(n) for g, s, _, n in state["baselines"]}
