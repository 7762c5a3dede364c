"""Probing a designed two-seat game with policies that know nothing of it (issue 44's admission rule).

The pool is part of the degenerate-policy family of :mod:`spade.envs.degenerate_probes`, the
families the issue names, each reading only its own seat's observations:

* ``constant``: ``\\boxed{0}``, ``\\boxed{1}``, the empty reply, plain text;
* ``copy``: a number or word copied from the latest observation (new ones first);
* ``random``: a seeded random short reply, fresh or repeated;
* ``legal``: spade's two-seat addition, the first, the last or a seeded random one of the moves the
  observation's ``Valid moves:`` line lists (the contract asks every observation for one): the
  "first legal-looking option", a player that at least makes legal moves.

Every policy plays every other on both seats, on every probe seed (a round robin; seeds drawn per
candidate as the one-player probes draw them, :func:`~spade.envs.degenerate_probes.derive_probe_seeds`),
each game cut at the turn budget. From the results (:meth:`SeatProbeReport.verdict`):

* seat ``s`` **can win** when some policy on seat ``s`` wins at least one game *on the rules*
  (not by the other seat's invalid move: a forfeit shows how the game scores invalid moves, not
  that its win condition can be reached by this seat);
* ``one_sided``: exactly one seat can win; ``always_draw``: neither can (every game was drawn, cut,
  or won only by a forfeit); when no game ended on its own within the budget, ``never_ends``;
* ``degenerate_win``: a content-free policy (constant, copy or random) wins at least
  ``degenerate_share`` of its games against the legal-move players on the other seat, *on each
  seat*: a reply that knows nothing of the game beats players that make legal moves whichever seat
  it has, so the game pays for something other than skill (a secret both seats can read, a reply
  that wins outright). On one seat only is not enough: a copied number can be a strong legal move
  for the seat that moves first (TicTacToe's last cell listed), and the first mover may be the
  same seat on every probe seed. So a leak that only one seat can read is not caught here. The
  legal policies themselves are not judged so (one of them may well beat the others).

A fault of the environment on the way (a crash, a contract break) ends the probing: admission
rejects the game with that fault.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Optional

from .degenerate_probes import derive_probe_seeds, probe_policies
from .protocol import EnvError, EnvInstance, ErrorKind, Stage
from .sandbox.runtime.probe_family import ProbePolicy, ProbeView, box
from .two_seat import SEATS, TwoSeatGame, action_of, valid_moves

DEGENERATE_NAMES = ("boxed_0", "boxed_1", "empty", "plain_text", "copy_new_number", "copy_last_number",
                    "copy_new_word", "copy_last_word", "random_short", "repeat_previous")
CONTENT_FREE = frozenset({"constant", "copy", "random"})
DEFAULT_SEED_COUNT = 4
DEFAULT_DEGENERATE_SHARE = 0.9
DEFAULT_MAX_STEPS = 20_000


def _legal(pick: str) -> Any:
    def act(view: ProbeView) -> Optional[str]:
        moves = valid_moves(view.observation)
        if not moves:
            return None
        move = moves[0] if pick == "first" else moves[-1] if pick == "last" else view.rng.choice(moves)
        return box(move)
    return act


def seat_policies() -> tuple[ProbePolicy, ...]:
    """The pool: the named members of the degenerate family, then the legal-move players."""
    family = {policy.name: policy for policy in probe_policies()}
    legal = tuple(ProbePolicy(f"legal_{pick}", f"the {pick} valid move listed", _legal(pick), family="legal")
                  for pick in ("first", "last", "random"))
    return tuple(family[name] for name in DEGENERATE_NAMES) + legal


@dataclass(frozen=True)
class SeatProbeSettings:
    """``seeds``: the reset seeds (empty: ``seed_count`` drawn per candidate from ``seed_base``, the
    run's seed, and its code); ``turns``: moves of both seats before a game is cut as a draw;
    ``max_steps``: moves over the whole round robin (the games after it are not played);
    ``degenerate_share``: the win share against the legal players at which a content-free policy wins."""

    seeds: tuple[int, ...] = ()
    seed_count: int = DEFAULT_SEED_COUNT
    seed_base: int = 0
    turns: int = 50
    max_steps: int = DEFAULT_MAX_STEPS
    degenerate_share: float = DEFAULT_DEGENERATE_SHARE

    def seeds_for(self, code: str) -> tuple[int, ...]:
        return tuple(self.seeds) or derive_probe_seeds(self.seed_base, code, self.seed_count)


@dataclass(frozen=True)
class Match:
    """One game: the policy on each seat, the seed, the winner (None: no winner), how it ended, moves."""

    policies: tuple[str, str]
    seed: int
    winner: int | None
    reason: str
    moves: int

    @property
    def won_on_rules(self) -> bool:
        return self.winner is not None and self.reason == "terminated"


@dataclass
class SeatProbeReport:
    seeds: tuple[int, ...]
    turns: int
    degenerate_share: float
    families: dict[str, str] = field(default_factory=dict)  # policy -> family
    matches: list[Match] = field(default_factory=list)
    steps: int = 0
    budget_exhausted: bool = False

    def wins_on_rules(self, seat: int) -> list[Match]:
        return [m for m in self.matches if m.won_on_rules and m.winner == seat]

    def share_against_legal(self, policy: str, seat: int) -> tuple[float, int]:
        """``policy`` on ``seat``: its win share over its games against the legal players, and how many."""
        games = [m for m in self.matches
                 if m.policies[seat] == policy and self.families[m.policies[1 - seat]] == "legal"]
        return (sum(m.winner == seat for m in games) / len(games) if games else 0.0), len(games)

    def degenerate_winner(self) -> tuple[str, tuple[float, float], int] | None:
        """The first content-free policy that beats the legal players often enough on each seat:
        (its name, its win share on seat 0 and on seat 1, games on each seat)."""
        for policy, family in self.families.items():
            if family in CONTENT_FREE:
                (share0, games0), (share1, games1) = (self.share_against_legal(policy, seat) for seat in SEATS)
                if games0 and games1 and min(share0, share1) >= self.degenerate_share:
                    return policy, (share0, share1), min(games0, games1)
        return None

    def verdict(self) -> EnvError | None:
        """The rejection the round robin calls for (module docstring), or None: admitted."""
        found = self.degenerate_winner()
        if found is not None:
            policy, shares, games = found
            return EnvError(ErrorKind.DEGENERATE_WIN, Stage.DEGENERATE_PROBE,
                            f"the probe policy '{policy}' of family '{self.families[policy]}' wins {shares[0]:.0%} "
                            f"(seat 0) and {shares[1]:.0%} (seat 1) of its {games} games a seat against the "
                            "legal-move players on the other seat: a reply that knows nothing of the game beats "
                            "players that make legal moves")
        winners = [seat for seat in SEATS if self.wins_on_rules(seat)]
        if len(winners) == 2:
            return None
        played = f"{len(self.matches)} games on seeds {list(self.seeds)}"
        if len(winners) == 1:
            loser = 1 - winners[0]
            return EnvError(ErrorKind.ONE_SIDED, Stage.WINNABILITY,
                            f"seat {loser} never wins on the rules in {played} (seat {winners[0]} does "
                            f"{len(self.wins_on_rules(winners[0]))} times): a seat that cannot win teaches it nothing")
        if not any(m.reason in ("terminated", "invalid_move") for m in self.matches):
            return EnvError(ErrorKind.NEVER_ENDS, Stage.WINNABILITY,
                            f"no game of {played} ended on its own within {self.turns} moves")
        return EnvError(ErrorKind.ALWAYS_DRAW, Stage.WINNABILITY,
                        f"no seat wins on the rules in {played} (endings: {self.endings()}): every game is drawn, "
                        "cut or forfeited")

    def endings(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for match in self.matches:
            counts[match.reason] = counts.get(match.reason, 0) + 1
        return counts

    def to_json(self) -> dict[str, Any]:
        error = self.verdict()
        return {"seeds": list(self.seeds), "turns": self.turns, "steps": self.steps,
                "budget_exhausted": self.budget_exhausted, "games": len(self.matches), "endings": self.endings(),
                "wins_on_rules": [len(self.wins_on_rules(seat)) for seat in SEATS],
                "verdict": None if error is None else error.kind.value}


async def play_match(env: EnvInstance, policies: tuple[ProbePolicy, ProbePolicy], seed: int, turns: int, *,
                     record: list[tuple[int, str]] | None = None) -> Match:
    """One game of ``policies[0]`` (seat 0) against ``policies[1]`` (seat 1), reset with ``seed``;
    ``record`` gets every turn's (seat to move, its observation)."""
    game = await TwoSeatGame(env, turns).start(seed)
    seen: dict[int, list[str]] = {seat: [] for seat in SEATS}
    replies: dict[int, list[str]] = {seat: [] for seat in SEATS}
    rngs = {seat: random.Random(f"two-seat-probe:{policies[seat].name}:{seed}:{seat}") for seat in SEATS}
    memory: dict[int, dict[str, Any]] = {seat: {} for seat in SEATS}
    while game.end is None:
        seat = game.seat
        seen[seat].append(game.observation)
        if record is not None:
            record.append((seat, game.observation))
        view = ProbeView(seen[seat][0], game.observation, replies[seat][-1] if replies[seat] else None, rngs[seat],
                         tuple(seen[seat]), tuple(replies[seat]), memory[seat])
        reply = policies[seat].act(view) or ""  # nothing to say: an empty reply
        replies[seat].append(reply)
        await game.move(action_of(reply))
    end = game.end
    return Match((policies[0].name, policies[1].name), seed, end.winner(), end.reason, game.turns)


async def run_seat_probes(env: EnvInstance, settings: SeatProbeSettings, seeds: tuple[int, ...]) -> SeatProbeReport:
    """The round robin on ``env`` (already loaded); an environment fault propagates."""
    pool = seat_policies()
    report = SeatProbeReport(tuple(seeds), settings.turns, settings.degenerate_share,
                             {policy.name: policy.family for policy in pool})
    for seed in seeds:
        for first in pool:
            for second in pool:
                if report.steps >= settings.max_steps:
                    report.budget_exhausted = True
                    return report
                match = await play_match(env, (first, second), seed, settings.turns)
                report.matches.append(match)
                report.steps += match.moves
    return report
