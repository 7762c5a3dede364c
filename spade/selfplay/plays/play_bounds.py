"""Time bounds on plays, as the released trainer set them (``selfplay.plays.hint_turn_timeout_s``,
``selfplay.plays.nohint_play_timeout_s``; :mod:`.play_rules` says what each does when it runs out).

* :class:`TurnBoundEngine`: the engine as a hinted play sees it, each reply bounded; one that runs
  over ends the episode as a policy that cannot go on does (:class:`~spade.envs.runner.StopEpisode`:
  unfinished, return 0).
* :func:`bounded_play`: one attempt of a no-hint play bounded as a whole; :class:`PlayTimedOut`
  when it runs over (the player drops the play).

The bound on a whole set's generation lives with the designer round
(``DesignerRound._bounded_slots``, ``selfplay.set_generation_timeout_s``).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Iterable, Optional, TypeVar

from ...envs.runner import StopEpisode
from ...rollout.engine import GenerationChunk, GenerationRequest, GenerationResult, GenerationStats, RolloutEngine

T = TypeVar("T")


class PlayTimedOut(Exception):
    """A no-hint play ran past ``selfplay.plays.nohint_play_timeout_s``."""


class TurnBoundEngine(RolloutEngine):
    """``engine`` with every ``generate`` call bounded by ``seconds``: the request is cancelled and
    :class:`StopEpisode` raised when it runs over. Everything else is the engine's."""

    def __init__(self, engine: RolloutEngine, seconds: float):
        self.engine = engine
        self.seconds = float(seconds)

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        try:
            return await asyncio.wait_for(self.engine.generate(request), self.seconds)
        except asyncio.TimeoutError:
            raise StopEpisode(f"the reply took longer than {self.seconds:g} s "
                              "(selfplay.plays.hint_turn_timeout_s)") from None

    def generate_stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        return self.engine.generate_stream(request)

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None:
        await self.engine.update_weights(named_tensors, version)

    def generation_stats(self) -> Optional[GenerationStats]:
        return self.engine.generation_stats()

    def close(self) -> None:  # the engine belongs to whoever made it
        pass


def turn_bound(engine: RolloutEngine, seconds: float | None) -> RolloutEngine:
    """``engine`` with its replies bounded by ``seconds`` (None: ``engine`` itself)."""
    return engine if seconds is None else TurnBoundEngine(engine, seconds)


async def bounded_play(play: Awaitable[T], seconds: float | None) -> T:
    """``await play``, within ``seconds`` (None: no bound); :class:`PlayTimedOut` past it."""
    if seconds is None:
        return await play
    try:
        return await asyncio.wait_for(play, seconds)
    except asyncio.TimeoutError:
        raise PlayTimedOut(f"the play took longer than {seconds:g} s (selfplay.plays.nohint_play_timeout_s)") from None
