"""Designed two-player games in SPIRAL's source (``selfplay.spiral.designed.enabled``): spade's extension.

At every regeneration each of ``designed.games`` slots gets up to ``designed.max_attempts``
designer calls (the designer role's generator: our engine, or ``selfplay.designer_endpoint``;
sampling ``selfplay.sampling.designer``). An attempt asks for a two-player zero-sum game on a theme
drawn from ``(seed, step, slot, attempt)`` (:mod:`spade.designer.two_seat_prompts`), and the reply
goes through two-seat admission in the run's sandbox (:func:`~spade.envs.two_seat_admission.admit_two_seat`:
the contract, then the round robin of degenerate policies on the candidate's seeds). The first
admitted game fills the slot as an :class:`EnvSpec` (skill ``designed_<slot>``, its code as the
source, no hint); a failed attempt is written under ``rejected/`` with its reason, as the designer's
are; a slot whose attempts all fail is left out of the set. The designer calls are not trained:
the games train the seats, as TextArena's do.

In play (:class:`DesignedGame`), each game opens the code in a fresh sandboxed process, resets it
with the game's seed and drives it through :class:`~spade.envs.two_seat.TwoSeatGame`; the
two-seat player (:mod:`spade.selfplay.plays.two_seat_player`) sees the same interface as a
TextArena game, so prompts, move extraction, returns (an invalid move scored by
``selfplay.spiral.invalid_move``), role baselines and training are unchanged. A game that faults
in play ends as a draw (``env_error``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ...designer.corpus import attempt_rng
from ...designer.two_seat_prompts import draw_theme, two_seat_designer_messages
from ...envs.protocol import EnvFault, ErrorKind, InfrastructureFault, Sandbox, Stage
from ...envs.two_seat import TwoSeatGame
from ...envs.two_seat_admission import TwoSeatVerdict, admit_two_seat
from ...envs.two_seat_probes import SeatProbeSettings
from ..seeds import derive_seed
from ..settings import SelfPlaySettings
from .designer_source import EnvSpec, Rejection, write_rejection
from .spiral_games import GameEnd
from .spiral_settings import GAMES, SpiralSettings
from .text_generators import GenerationFailed, TextGenerator, TextSampling

DESIGNED_PREFIX = "designed_"


def is_designed(env: EnvSpec) -> bool:
    """A designed game of the set (not one of TextArena's)."""
    return env.skill not in GAMES


def probe_settings(config: SpiralSettings, run_seed: int) -> SeatProbeSettings:
    designed = config.designed
    return SeatProbeSettings(seed_count=designed.probe_seeds, seed_base=run_seed, turns=config.max_turns,
                             max_steps=designed.probe_steps, degenerate_share=designed.degenerate_share)


class DesignedGames:
    """The designed slots of one regeneration (module docstring)."""

    def __init__(self, settings: SelfPlaySettings, *, sandbox: Sandbox, generator: TextGenerator, run_dir: Path,
                 seed: int):
        self.settings = settings
        self.config = settings.spiral
        self.sandbox = sandbox
        self.generator = generator
        self.run_dir = Path(run_dir)
        self.seed = seed

    async def design(self, step: int, first_slot: int) -> tuple[list[EnvSpec], list[Rejection], int]:
        """The admitted games (slots numbered from ``first_slot``), the rejections, and the attempts made."""
        outcomes = await asyncio.gather(*(self.fill_slot(step, slot, first_slot + slot)
                                          for slot in range(self.config.designed.games)))
        envs = [spec for spec, _, _ in outcomes if spec is not None]
        return envs, [r for _, rejections, _ in outcomes for r in rejections], sum(n for _, _, n in outcomes)

    async def fill_slot(self, step: int, slot: int, set_slot: int) -> tuple[EnvSpec | None, list[Rejection], int]:
        rejections: list[Rejection] = []
        designed = self.config.designed
        for attempt in range(designed.max_attempts):
            theme = draw_theme(attempt_rng(self.seed, "two_seat", step, slot, attempt))
            record: dict[str, Any] = {"step": step, "slot": set_slot, "attempt": attempt,
                                      "skill": f"{DESIGNED_PREFIX}{slot}", "theme": theme}
            sampling = TextSampling.of(self.settings.sampling.designer,
                                       derive_seed(self.seed, "two_seat_designer", step, slot, attempt))
            try:
                generated = await self.generator.generate(
                    two_seat_designer_messages(theme, max_turns=self.config.max_turns), sampling)
            except GenerationFailed as exc:
                rejections.append(write_rejection(self.run_dir, record, exc.kind, Stage.GENERATE, exc.message, ""))
                continue
            verdict = await self.admit(generated.text)
            if verdict is None:
                rejections.append(write_rejection(self.run_dir, record, ErrorKind.CRASHED, Stage.SERVICE,
                                                  "the sandbox failed on every try (infrastructure)", generated.text))
                continue
            if not verdict.admitted:
                assert verdict.error is not None
                error = verdict.error
                rejections.append(write_rejection(self.run_dir, record, error.kind, error.stage, error.message,
                                                  generated.text))
                continue
            spec = EnvSpec(env_id=f"spiral-{step:06d}-{DESIGNED_PREFIX}{slot}", slot=set_slot,
                           skill=f"{DESIGNED_PREFIX}{slot}", source=verdict.code, hint="",
                           class_name=verdict.class_name or "", max_turns=self.config.max_turns, generated_step=step,
                           document=theme, attempts=attempt + 1)
            return spec, rejections, attempt + 1
        return None, rejections, designed.max_attempts

    async def admit(self, response: str) -> TwoSeatVerdict | None:
        """Two-seat admission, an infrastructure failure or timeout retried up to
        ``selfplay.plays.max_retries`` times; None when every try failed."""
        settings = probe_settings(self.config, self.seed)
        for _ in range(self.settings.plays.max_retries + 1):
            try:
                return await asyncio.wait_for(
                    admit_two_seat(self.sandbox, response, settings, code_extraction=self.settings.code_extraction),
                    self.config.designed.admission_timeout_s)
            except (InfrastructureFault, asyncio.TimeoutError):
                continue
        return None


class DesignedGame:
    """One game of a designed environment, with a TextArena game's interface for the two-seat player
    (``observation()``, ``play()`` (here a coroutine), ``stop_as_draw()``, ``end``, ``turns``)."""

    def __init__(self, game: TwoSeatGame | None, settings: SpiralSettings):
        self.game = game
        self.settings = settings
        self.end: GameEnd | None = None

    @classmethod
    async def open(cls, sandbox: Sandbox, env: EnvSpec, seed: int, settings: SpiralSettings) -> "DesignedGame":
        """A fresh sandboxed instance of ``env`` reset with ``seed`` (a game that faults here is a draw)."""
        try:
            instance = await sandbox.open(env.source, max_turns=settings.max_turns)
        except EnvFault:
            opened = cls(None, settings)
            opened.stop_as_draw("env_error")
            return opened
        game = TwoSeatGame(instance, settings.max_turns)
        opened = cls(game, settings)
        try:
            await game.start(seed)
        except EnvFault:
            opened.stop_as_draw("env_error")
        return opened

    @property
    def turns(self) -> int:
        return 0 if self.game is None else self.game.turns

    def observation(self) -> tuple[int, str]:
        assert self.game is not None
        return self.game.seat, self.game.observation

    async def play(self, seat: int, action: str) -> bool:
        assert self.game is not None
        try:
            await self.game.move(action)
        except EnvFault:
            self.stop_as_draw("env_error")
            return True
        end = self.game.end
        if end is not None:
            if end.reason == "invalid_move":
                assert end.invalid_mover is not None
                self.end = GameEnd(self.settings.returns_of_invalid_move(end.invalid_mover), "invalid_move",
                                   end.invalid_mover)
            else:
                reason = "terminated" if end.reason == "terminated" else "truncated"
                self.end = GameEnd({0: end.rewards[0], 1: end.rewards[1]}, reason)
        return self.end is not None

    def stop_as_draw(self, reason: str) -> None:
        self.end = GameEnd({0: 0.0, 1: 0.0}, reason)

    async def close(self) -> None:
        if self.game is not None:
            await self.game.env.close()

