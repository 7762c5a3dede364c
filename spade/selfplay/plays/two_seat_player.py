"""SPIRAL's plays: the model on both seats of a two-player game, each seat's turns its own play.

A step plays ``selfplay.spiral.games_per_step`` games of every environment of the set (one per
configured game, :mod:`spade.selfplay.sources.spiral_source`), at most
``selfplay.plays.max_concurrent`` games at a time. In a game the seat to move sees TextArena's
observation in SPIRAL's prompt (:func:`~spade.selfplay.sources.spiral_games.turn_prompt`), one
fresh prompt per turn as the released actor renders it, and replies; the move is taken out of the
reply and played. A reply cut by its token limit is played as it stands (its box, if any, is the
move); a turn whose prompt no longer fits the context ends the game as a draw.

Each game gives two :class:`~spade.selfplay.plays.play_record.Play` records, seat 0's and seat
1's, ``index = 2 * game + seat``, each with that seat's return and its turns as turn samples (the
per-turn form of :mod:`.turn_samples`: every turn its prompt plus its reply, the seat's turns one
episode in the loss). A seat that never moved (the game ended first) has nothing to train on; its
return still counts (the role baselines take it in). Seeds: game ``g`` of environment ``e`` at
step ``s`` resets with ``derive_seed(seed, "spiral-game", s, e, g)`` and each seat samples from
its own derived seed, so a step is a function of the run seed.

A designed game (``selfplay.spiral.designed``, spade's extension) is played the same way: each
game opens its code in a fresh sandboxed process (:class:`~spade.selfplay.sources.spiral_designed.DesignedGame`,
the player's sandbox), closed when the game ends; a fault of the game in play ends it as a draw.

This is a step player in the sense of :mod:`.step_plays` (``play``, ``end_set``,
``step_metrics``, ``state_dict``): nothing is carried between steps, no hinted arm.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from ...envs.runner import EndReason, Message, StopEpisode, Turn
from ..seeds import derive_seed
from ..settings import SelfPlaySettings
from ..sources.designer_source import EnvSpec
from ..sources.spiral_designed import DESIGNED_PREFIX, DesignedGame, is_designed
from ..sources.spiral_games import TextArenaGame, action_of, turn_prompt
from .play_record import Play
from .player import Player
from .step_plays import StepPlays
from .turn_samples import PerTurnPolicy, play_trajectories

SEATS = (0, 1)
# how a game's end reads as a play's end_reason (an invalid move ends the game like any last move)
END_REASONS = {"terminated": EndReason.TERMINATED.value, "invalid_move": EndReason.TERMINATED.value,
               "truncated": EndReason.TRUNCATED.value, "context_full": EndReason.POLICY_STOPPED.value,
               "env_error": EndReason.ENV_ERROR.value}


class TwoSeatGames:
    """The step's games; the :class:`Player` lends its engine, tokenizer, chat format and seed."""

    def __init__(self, settings: SelfPlaySettings, player: Player):
        self.settings = settings
        self.player = player
        self._ends: list[tuple[str, str, int]] = []  # the last step's games: (game, end, turns)

    async def end_set(self) -> None:
        """Nothing outlives its step."""

    async def play(self, step: int, envs: list[EnvSpec], *, with_hint: bool) -> StepPlays:
        semaphore = asyncio.Semaphore(self.settings.plays.max_concurrent)
        games = [(env, g) for env in envs for g in range(self.settings.spiral.games_per_step)]

        async def bounded(env: EnvSpec, g: int) -> tuple[list[Play], tuple[str, str, int]]:
            async with semaphore:
                return await self.play_game(step, env, g)

        results = await asyncio.gather(*(bounded(env, g) for env, g in games))
        self._ends = [end for _, end in results]
        return StepPlays.of(envs, [play for plays, _ in results for play in plays], step)

    async def play_game(self, step: int, env: EnvSpec, g: int) -> tuple[list[Play], tuple[str, str, int]]:
        """Game ``g`` of ``env`` at ``step``: both seats' plays, and (game, how it ended, turns)."""
        s, p = self.settings, self.player
        reset_seed = derive_seed(p.seed, "spiral-game", step, env.env_id, g)
        game: TextArenaGame | DesignedGame
        if is_designed(env):
            game = await DesignedGame.open(p.sandbox, env, reset_seed, s.spiral)
        else:
            game = TextArenaGame(env.skill, reset_seed, s.spiral)
        try:
            return await self._play_to_end(game, step, env, g, reset_seed)
        finally:
            if isinstance(game, DesignedGame):
                await game.close()

    async def _play_to_end(self, game: TextArenaGame | DesignedGame, step: int, env: EnvSpec, g: int,
                           reset_seed: int) -> tuple[list[Play], tuple[str, str, int]]:
        s, p = self.settings, self.player
        samplings = {seat: s.engine_sampling(p.stop_token_ids,
                                             derive_seed(p.seed, "spiral-agent", step, env.env_id, g, seat))
                     for seat in SEATS}
        policies = {seat: PerTurnPolicy(p.engine, p.tokenizer, samplings[seat], max_context_tokens=s.max_context_tokens,
                                        chat_format=p.chat_format) for seat in SEATS}
        turns: dict[int, list[Turn]] = {seat: [] for seat in SEATS}
        openings = {seat: "" for seat in SEATS}
        last = 0  # the seat that moved last
        while game.end is None:
            seat, observation = game.observation()
            prompt = turn_prompt(observation)
            openings[seat] = openings[seat] or prompt
            try:
                reply = await policies[seat]([Message("user", prompt)])
            except StopEpisode as stop:
                if stop.response is None:  # the prompt left no room for a reply
                    game.stop_as_draw("context_full")
                    break
                reply = stop.response  # cut by its token limit: played as it stands
            action = action_of(reply)
            # a designed game steps in the sandbox
            done = await game.play(seat, action) if isinstance(game, DesignedGame) else game.play(seat, action)
            turns[seat].append(Turn(reply, action, "", 0.0, done, False))
            last = seat
        end = game.end
        assert end is not None
        if turns[last]:  # the last move's observation says how the game ended (trajectory log, explorer)
            ending = f"game over ({end.reason}): seat 0 {end.returns[0]:g}, seat 1 {end.returns[1]:g}"
            turns[last][-1] = replace(turns[last][-1], observation=ending)
        plays = []
        for seat in SEATS:
            samples = play_trajectories(policies[seat], logprob_temperature=samplings[seat].logprob_temperature)
            plays.append(Play(env.env_id, False, 2 * g + seat, end.returns[seat], len(turns[seat]),
                              END_REASONS[end.reason], samples[-1] if samples else None, seed=reset_seed,
                              opening=openings[seat], turn_log=tuple(turns[seat]), turn_samples=samples))
        return plays, (env.skill, end.reason, game.turns)

    def step_metrics(self) -> dict[str, float]:
        """Per game of the last step: games played, and the shares ended by an invalid move, cut at
        ``max_turns`` and drawn, and the mean number of moves (``spiral/<game>/...``)."""
        metrics: dict[str, float] = {}
        for name in sorted({game for game, _, _ in self._ends}):
            ends = [(end, n) for game, end, n in self._ends if game == name]
            metrics[f"spiral/{name}/games"] = float(len(ends))
            designed = ("env_error",) if name.startswith(DESIGNED_PREFIX) else ()  # a designed game's faults
            reasons = ("invalid_move", "truncated", "context_full") + designed
            for reason in reasons:
                metrics[f"spiral/{name}/{reason}_share"] = sum(end == reason for end, _ in ends) / len(ends)
            metrics[f"spiral/{name}/moves_mean"] = sum(n for _, n in ends) / len(ends)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any], logprob_temperature: float) -> None:
        pass
