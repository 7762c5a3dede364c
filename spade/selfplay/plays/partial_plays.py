"""Partial rollouts' stage of a step (``selfplay.partial_rollouts``, docs/partial_rollouts.md).

The carried groups and this step's fresh no-hint groups play until ``ceil(complete_fraction *
envs_per_set)`` groups are complete; the rest are carried into the next step
(:mod:`.carried_plays`, :meth:`~spade.selfplay.plays.player.Player.play_groups`). A regeneration step plays everything to
the end (its hinted arm as without partial rollouts), and before the new set replaces the old one
the ending set's carried groups are finished (:meth:`PartialGroups.end_set`): they train in the
regeneration step, whose record (trajectory log, the source, memory) keeps to the new set's own
groups. Each step's groups are those complete in it, each with the step it began in
(:class:`~.step_plays.StepPlays`), so scoring and the designer's window treat them as any group.
"""

from __future__ import annotations

import math
from typing import Any

from .carried_plays import CarriedGroup
from ..sources.designer_source import EnvSpec
from .player import GroupsOutcome, Player
from ..settings import SelfPlaySettings
from .step_plays import StepPlays, WholeGroups


class PartialGroups:
    """The step's groups with partial rollouts; ``carried`` are the unfinished groups of earlier
    steps (in the checkpoint)."""

    def __init__(self, settings: SelfPlaySettings, player: Player):
        self.settings = settings
        self.player = player
        self.carried: list[CarriedGroup] = []
        self._finished_before: GroupsOutcome | None = None  # carried groups a regeneration step finished first
        self._outcome = GroupsOutcome()  # the last step's (metrics)

    async def end_set(self) -> None:
        """Before a regeneration: the ending set's carried plays end first."""
        if self.carried:
            self._finished_before = await self.player.play_groups(self.carried, stop_after=None)
            self.carried = []

    async def play(self, step: int, envs: list[EnvSpec], *, with_hint: bool) -> StepPlays:
        groups = self.carried + self.player.fresh_groups(step, envs)
        if with_hint:
            needed = None
            hinted = await self.player.play_all(step, [r for r in self.player.requests(envs, with_hint=True)
                                                       if r.hinted])
        else:
            needed = math.ceil(self.settings.partial_rollouts.complete_fraction * self.settings.envs_per_set)
            hinted = []
        outcome = await self.player.play_groups(groups, stop_after=needed)
        before, self._finished_before = self._finished_before, None
        if before is not None:  # the ending set's carried groups, finished before regeneration
            outcome.complete = before.complete + outcome.complete
            outcome.aborted += before.aborted
        self.carried = outcome.carried
        self._outcome = outcome
        in_set = {env.env_id for env in envs}
        # the step's own record: complete groups of the set; at a regeneration only the new set's own
        # groups (the ending set's train, but are not its record)
        current = [p for g in outcome.complete if g.env.env_id in in_set and (not with_hint or g.origin_step == step)
                   for p in g.finished] + hinted
        # no group complete (every one aborted): the set's groups of this step, empty, as without carrying
        complete = tuple((g.env, g.origin_step, g.finished) for g in outcome.complete) or None
        return StepPlays.of(envs, current, step, complete)

    def step_metrics(self) -> dict[str, float]:
        outcome = self._outcome
        return {"rollout/carried_over": float(outcome.carried_plays), "rollout/aborted": float(outcome.aborted),
                "rollout/carried_groups": float(len(outcome.carried)),
                # plays of the groups complete in this step (what trains, the ending set's carried groups too)
                "rollout/completed": float(sum(len(g.finished) for g in outcome.complete))}

    def state_dict(self) -> dict[str, Any]:
        return {"carried": [group.to_json() for group in self.carried]}

    def load_state_dict(self, state: dict[str, Any], logprob_temperature: float) -> None:
        self.carried = [CarriedGroup.from_json(group, logprob_temperature) for group in state.get("carried", [])]


def step_player(settings: SelfPlaySettings, player: Player) -> Any:
    """The stage that plays a step's groups: partial rollouts', or every group to its end."""
    return PartialGroups(settings, player) if settings.partial_rollouts.enabled else WholeGroups(settings, player)
