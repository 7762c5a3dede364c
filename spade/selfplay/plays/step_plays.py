"""A step's plays, always as groups, and the stage that plays every group of a step to its end.

A *group* is one environment's no-hint plays begun in one step: ``(environment, origin step,
plays)``. Its advantages are the z-scores of its returns (stage 3) and its returns join the
designer's window at its origin step (stage 4). :class:`WholeGroups` (the default) plays every
group of the step to its end, so every group's origin is the step itself; with partial rollouts
(:mod:`.partial_plays`) a step's groups are those complete in it, some begun in the step before.
Either way the orchestrator scores and releases the same groups the same way.

A stage that plays a step's groups (``step_player``) offers: ``play(step, envs, with_hint=)``
returning :class:`StepPlays`; ``end_set()``, awaited before a regeneration replaces the set;
``step_metrics()``; and ``state_dict()`` / ``load_state_dict()`` for the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..sources.designer_source import EnvSpec
from .play_record import Play
from .player import Player, PlayRequest
from ..settings import SelfPlaySettings

Group = tuple[EnvSpec, int, list[Play]]  # (environment, the step it began in, its no-hint plays)


@dataclass(frozen=True)
class StepPlays:
    """One step's plays. ``nohint`` and ``hinted``: the current set's plays of this step, each
    environment's, in each arm (the step's record: trajectory log, the source, memory, the designer's
    regret). ``groups``: what trains, each complete no-hint group (none given: every environment's
    no-hint plays of ``nohint``, begun in this step). ``played``: the record's plays in play order."""

    nohint: dict[str, list[Play]]
    hinted: dict[str, list[Play]]
    groups: tuple[Group, ...] = ()
    played: tuple[Play, ...] = ()

    @classmethod
    def of(cls, envs: list[EnvSpec], plays: list[Play], step: int,
           groups: tuple[Group, ...] | None = None) -> "StepPlays":
        nohint: dict[str, list[Play]] = {env.env_id: [] for env in envs}
        hinted: dict[str, list[Play]] = {env.env_id: [] for env in envs}
        for play in plays:
            (hinted if play.hinted else nohint)[play.env_id].append(play)
        if groups is None:
            groups = tuple((env, step, nohint[env.env_id]) for env in envs)
        return cls(nohint, hinted, groups, tuple(plays))

    def nohint_returns(self, env_id: str) -> list[float]:
        return [p.episode_return for p in self.nohint[env_id]]

    def hint_returns(self, env_id: str) -> list[float]:
        return [p.episode_return for p in self.hinted[env_id]]


class WholeGroups:
    """Every environment ``g_nohint`` times without the hint and, at a regeneration, ``g_hint``
    times with it, all to their end; then, with ``plays.drop_equal_return_groups``, up to
    ``plays.refill_equal_groups`` extra rounds of ``g_nohint`` plays of the environments whose returns
    are all equal so far (a stabiliser, off by default)."""

    def __init__(self, settings: SelfPlaySettings, player: Player):
        self.settings = settings
        self.player = player

    async def end_set(self) -> None:
        """Nothing outlives its step here."""

    async def play(self, step: int, envs: list[EnvSpec], *, with_hint: bool) -> StepPlays:
        plays = await self.player.play_all(step, self.player.requests(envs, with_hint=with_hint))
        plays += await self._refill(step, envs, plays)
        return StepPlays.of(envs, plays, step)

    async def _refill(self, step: int, envs: list[EnvSpec], plays: list[Play]) -> list[Play]:
        s = self.settings
        if not s.plays.drop_equal_return_groups or s.plays.refill_equal_groups == 0:
            return []
        by_env: dict[str, list[float]] = {env.env_id: [] for env in envs}
        for play in plays:
            if not play.hinted:
                by_env[play.env_id].append(play.episode_return)
        extra: list[Play] = []
        for round_ in range(1, s.plays.refill_equal_groups + 1):
            flat = [env for env in envs if all_equal(by_env[env.env_id])]
            if not flat:
                break
            g = s.nohint_plays(len(envs))
            requests = [PlayRequest(env, False, round_ * g + i) for env in flat for i in range(g)]
            new = await self.player.play_all(step, requests)
            for play in new:
                by_env[play.env_id].append(play.episode_return)
            extra += new
        return extra

    def step_metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any], logprob_temperature: float) -> None:
        pass


def all_equal(values: list[float]) -> bool:
    return all(v == values[0] for v in values)
