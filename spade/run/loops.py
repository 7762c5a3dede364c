"""The schedules over the trainer's verbs: how steps follow each other (``run.overlap``).

``train_steps`` runs a schedule from the step a run starts at to ``run.steps``, with a checkpoint
every ``run.checkpoint_every`` updates and after the last (and after the step in progress when
Ctrl-C asked to stop: ``spade.run.stop``). A schedule runs one step at a time with
``Trainer.one_step``, handing it what the schedule changes:

- :class:`Synchronous` (``run.overlap: 0``): play, train, publish, in turn.
- :class:`OneStepOffPolicy` (``run.overlap: 1``): while step t trains, rank 0 plays step t+1's
  rollout on the weights step t started from (the engine keeps serving through the update); step
  t+1 trains on it, one weight version behind. An error in the update cancels that rollout. The
  last step plays nothing beyond ``run.steps``.

A rollout played and not yet trained on (the *ready rollout*) is part of the checkpoint written
after the step that played it (``trainer_state.json``'s ``ready_rollout``), so a resumed run trains
on the same samples as a straight one. Both schedules take one from a checkpoint. New schedules
(fully asynchronous rollouts) go here, not into ``one_step``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from ..selfplay.step import Step
from .stop import StopRequested


class Synchronous:
    """Each step plays, trains and publishes in turn."""

    def __init__(self) -> None:
        self.ready: Optional[Any] = None  # rank 0: a rollout played ahead, not yet trained on

    async def step(self, trainer: Any, step: Step, end: Step) -> None:
        await trainer.one_step(step, ready=self.take())

    def take(self) -> Optional[Any]:
        ready, self.ready = self.ready, None
        return ready

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the schedule (rank 0): the ready rollout, when there is one."""
        if self.ready is None:
            return {}
        return {"ready_rollout": {"step": self.ready.step.updates_done,
                                  "samples": [t.to_json() for t in self.ready.samples],
                                  "metrics": self.ready.metrics}}

    def load_state(self, state: dict[str, Any], agent_temperature: float) -> None:
        self.ready = ready_rollout(state.get("ready_rollout"), agent_temperature)


class OneStepOffPolicy(Synchronous):
    """``run.overlap: 1``: the next step's rollout runs while this step trains."""

    async def step(self, trainer: Any, step: Step, end: Step) -> None:
        ready = self.take()
        if step.after < end:
            await trainer.one_step(step, ready=ready, update=lambda samples: self.overlapped(trainer, step.after,
                                                                                             samples))
        else:
            await trainer.one_step(step, ready=ready)

    async def overlapped(self, trainer: Any, following: Step, samples: list) -> dict[str, Any]:
        """The update in a thread while rank 0 plays ``following`` (torch releases the GIL in its
        ops: the update and the engine's work share the cores)."""
        ahead = asyncio.create_task(trainer.role.play_ahead(following))
        try:
            metrics = await asyncio.to_thread(trainer.learner.update, samples, on_phase=trainer.phase_memory.mark)
        except BaseException:
            ahead.cancel()
            await asyncio.gather(ahead, return_exceptions=True)
            raise
        self.ready = await ahead
        return metrics


def schedule_for(overlap: int) -> Synchronous:
    """The schedule ``run.overlap`` names."""
    return OneStepOffPolicy() if overlap else Synchronous()


async def train_steps(trainer: Any, schedule: Synchronous, start: Step, end: Step) -> int:
    """Steps ``start`` to ``end`` under ``schedule``, checkpointed every ``run.checkpoint_every``
    updates and after the last; returns the number of steps run."""
    every = trainer.config.run.checkpoint_every
    ran = 0
    last_saved = start if trainer.resume else None
    step = start
    while step < end:
        await schedule.step(trainer, step, end)
        ran += 1
        step = step.after
        stopping = trainer.stop_requested()  # Ctrl-C (spade.run.stop): this step's checkpoint, then the end
        if step.every(every) or step == end or stopping:
            trainer.checkpoint(step)
            last_saved = step
        if stopping and step < end:  # on the last step the run just ends as it would have
            raise StopRequested(step.updates_done)
    if end > start and last_saved != end:
        trainer.checkpoint(end)
    return ran


def ready_rollout(saved: Optional[dict[str, Any]], agent_temperature: float) -> Any:
    """The ``StepOutput`` a checkpoint holds for ``run.overlap`` (None when it holds none);
    ``agent_temperature``: the log-prob temperature of records older than that field."""
    if saved is None:
        return None
    from ..rl.samples import Trajectory
    from ..selfplay.orchestrator import StepOutput

    return StepOutput(Step(saved["step"]), [Trajectory.from_json(t, default_logprob_temperature=agent_temperature)
                                            for t in saved["samples"]], dict(saved["metrics"]))
