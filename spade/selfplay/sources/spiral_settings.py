"""SPIRAL's numbers (``selfplay.spiral``), read when ``selfplay.env_source: spiral``.

SPIRAL (arXiv 2506.24119; code: spiral-rl/spiral) trains one model by letting it play both seats of
two-player zero-sum text games from TextArena. Every step plays ``games_per_step`` games of each
configured game; each seat's turns are trained on that seat's final return (win 1, draw 0,
loss -1). The games are TextArena's own (:data:`GAMES`: the textarena environment each name plays
and the observation wrapper SPIRAL put around it, ``spiral/envs/__init__.py:57-65`` of the
released code). A game that runs past ``max_turns`` turns ends as a draw (the released
``GameState.is_truncated``, ``train_spiral.py:330-337``).

Advantages (``advantage``): ``rae``, SPIRAL's role-conditioned advantage estimation, keeps one
moving average of the return per (game, seat) and trains each seat's turns on its return minus
that average as it stood before the game (``rae_decay`` is the average's decay, 0.95 in the
released code, ``train_spiral.py:79``; the averages start at 0, ``spiral/utils.py:18-31``).
``grpo`` is the ablation issue 44 asks for: the z-score of each return among the step's plays of the
same game, as every other source is scored. ``none`` is SPIRAL's own ablation
(``use_role_baseline False``): the raw return is the advantage.

``drop_zero_advantage`` leaves out a seat whose advantage is exactly 0 (the released
``filter_zero_adv``, on by default there, ``train_spiral.py:75-77``): it adds nothing to the policy
gradient, only tokens to the loss's average.

Designed games (``designed``, spade's extension, not SPIRAL's; off in SPIRAL's reproduction
recipes): with ``designed.enabled`` each regeneration also asks the designer for ``designed.games``
two-player zero-sum games of its own (:mod:`spade.designer.two_seat_prompts`), admits them in the
sandbox by the two-seat rule (:mod:`spade.envs.two_seat_admission`: each seat wins on the rules
against the other seat's degenerate policies, no content-free reply beats the legal-move players)
and plays them beside (or, with ``games: []``, instead of) TextArena's, with the same player and
advantages (:mod:`spade.selfplay.sources.spiral_designed`).

An invalid move (``invalid_move``): ``loss`` scores it as TextArena does with no error allowed
(the mover -1, the other seat +1); ``released`` is the released code's shaping, the mover -1.5 and
the other seat +0.5 (``train_spiral.py:322-325``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ...config import require

_WHERE = "selfplay.spiral"

# name -> (textarena environment id, observation wrapper); "-raw": no wrapper of TextArena's own, so
# the wrapper is SPIRAL's choice: the whole history for poker and negotiation, the first and last
# observation for TicTacToe (the released make_env)
GAMES: dict[str, tuple[str, str]] = {
    "kuhn_poker": ("KuhnPoker-v0-short-raw", "history"),            # 5 rounds, as SPIRAL's KuhnPoker-v1
    "tic_tac_toe": ("TicTacToe-v0-raw", "first_last"),
    "simple_negotiation": ("SimpleNegotiation-v0-raw", "history"),  # 10 turns, as SimpleNegotiation-v1
}
ADVANTAGES: tuple[str, ...] = ("rae", "grpo", "none")
INVALID_MOVES: tuple[str, ...] = ("loss", "released")


@dataclass(frozen=True)
class DesignedGameSettings:
    """``selfplay.spiral.designed``: two-player games the designer writes (spade's extension, module docstring)."""

    enabled: bool = False          # off: SPIRAL's own games only (its reproduction recipes)
    games: int = 1                 # designed games in each set (one designer slot each)
    max_attempts: int = 4          # designer calls per slot before the slot stays empty for the set
    probe_seeds: int = 4           # reset seeds of admission's round robin, drawn per candidate
    probe_steps: int = 20_000      # moves over the whole round robin (the games after them are not played)
    degenerate_share: float = 0.9  # a content-free reply winning this share on each seat is rejected
    admission_timeout_s: float = 300.0  # one candidate's admission, all stages

    def __post_init__(self) -> None:
        def key(name: str) -> str:
            return f"{_WHERE}.designed.{name}"

        require(isinstance(self.enabled, bool), key("enabled"), f"must be true or false, got {self.enabled!r}")
        for name in ("games", "max_attempts", "probe_seeds", "probe_steps"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, key(name),
                    f"must be an integer >= 1, got {value!r}")
        share = self.degenerate_share
        require(isinstance(share, (int, float)) and not isinstance(share, bool) and 0.0 < share <= 1.0,
                key("degenerate_share"), f"must be a number in (0, 1], got {share!r}")
        timeout = self.admission_timeout_s
        require(isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0,
                key("admission_timeout_s"), f"must be a number > 0, got {timeout!r}")


@dataclass(frozen=True)
class SpiralSettings:
    """``selfplay.spiral``: which games, how many a step, and how their returns become advantages."""

    games: tuple[str, ...] = ("kuhn_poker",)  # TextArena games to play: kuhn_poker, tic_tac_toe, simple_negotiation
    games_per_step: int = 16      # games of each configured game per step (both seats of each train)
    # rae: return less its (game, seat) moving average; grpo: z-scores of the step; none: the raw return
    advantage: Literal["rae", "grpo", "none"] = "rae"
    rae_decay: float = 0.95       # the moving average's weight on its old value
    drop_zero_advantage: bool = False  # leave out seats whose advantage is exactly 0 (the release: true)
    invalid_move: Literal["loss", "released"] = "loss"  # loss: mover -1, other +1; released: -1.5 / +0.5
    max_turns: int = 50           # turns of both seats before a game is cut and scored as a draw
    designed: DesignedGameSettings = field(default_factory=DesignedGameSettings)  # spade's extension: off

    def __post_init__(self) -> None:
        def key(name: str) -> str:
            return f"{_WHERE}.{name}"

        games = self.games
        require(isinstance(self.designed, DesignedGameSettings), key("designed"), "must be a designed-games section")
        require(not isinstance(games, str) and (len(games) > 0 or self.designed.enabled), key("games"),
                f"must be a non-empty list of game names ({', '.join(GAMES)}) unless designed.enabled is true, "
                f"got {games!r}")
        unknown = [g for g in games if g not in GAMES]
        require(not unknown, key("games"),
                f"{unknown[0] if unknown else ''!r} is not a game; choose from: {', '.join(GAMES)}")
        require(len(set(games)) == len(games), key("games"), "lists a game twice")
        for name in ("games_per_step", "max_turns"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, key(name),
                    f"must be an integer >= 1, got {value!r}")
        require(self.advantage in ADVANTAGES, key("advantage"),
                f"{self.advantage!r} is not allowed; choose one of: {', '.join(ADVANTAGES)}")
        decay = self.rae_decay
        require(isinstance(decay, (int, float)) and not isinstance(decay, bool) and 0.0 < decay < 1.0,
                key("rae_decay"), f"must be a number in (0, 1), got {decay!r}")
        require(isinstance(self.drop_zero_advantage, bool), key("drop_zero_advantage"),
                f"must be true or false, got {self.drop_zero_advantage!r}")
        require(self.invalid_move in INVALID_MOVES, key("invalid_move"),
                f"{self.invalid_move!r} is not allowed; choose one of: {', '.join(INVALID_MOVES)}")

    def returns_of_invalid_move(self, mover: int) -> dict[int, float]:
        """Both seats' returns when seat ``mover`` ended the game with an invalid move."""
        lose, win = (-1.5, 0.5) if self.invalid_move == "released" else (-1.0, 1.0)
        return {mover: lose, 1 - mover: win}
