"""What a rank does in a step besides the update every rank runs, chosen once when the trainer is
built, so that ``Trainer.one_step`` is the same lines on every rank.

- :class:`Orchestrating` (global rank 0): runs the orchestrator's step (or takes the rollout a
  schedule played ahead), shares its samples, evaluates the policy it published when
  ``eval.every`` says so, and owns the score that a checkpoint records for ``run.best_metric``.
- :class:`ShardServing` (a rollout shard's rank, ``selfplay.rollout_shards`` > 1): plays its block
  of rank 0's rounds of plays while it waits for the samples.
- :class:`Waiting` (every other rank): waits for the samples.

A step's samples come in two verbs: :meth:`~Waiting.produce` (rank 0 plays the step, a shard rank
starts serving its block, the others have nothing to do) and :meth:`~Waiting.switch_to_training`,
the rollout manager's collective of that name: every rank returns from it with the step's samples
and the training state onloaded (a shard rank once its block is served).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Optional

import torch

from ..collectives import in_thread
from ..rollout.manager import RolloutManager
from ..selfplay.sources.slot_stages import no_stage
from ..selfplay.step import Step
from .best_checkpoint import checkpoint_score
from .progress import Progress
from .step_metrics import measured_step


class Waiting:
    """A rank that neither runs the orchestrator nor plays a shard."""

    def __init__(self, rollout: RolloutManager):
        self.rollout = rollout

    async def produce(self, step: Step, *, ready: Optional[Any] = None) -> Optional[Any]:
        """The step's rollout, rank 0's ``StepOutput`` (None on the other ranks); ``ready``: the
        step's rollout, played ahead by the schedule."""
        return None

    async def switch_to_training(self, out: Optional[Any], *, keep_serving: bool = False) -> list:
        """Every rank: the step's samples, the engine's memory handed to training (``keep_serving``:
        the engine goes on taking requests through the update)."""
        return await self.rollout.switch_to_training(None, keep_serving=keep_serving)

    async def play_ahead(self, step: Step) -> Optional[Any]:
        """``run.overlap``: ``step``'s rollout, played while the step before it trains (rank 0)."""
        return None

    async def evaluate(self, done: Step) -> Optional[dict[str, Any]]:
        """The held-out benchmarks on the policy after ``done`` updates, when due (rank 0)."""
        return None


class ShardServing(Waiting):
    """A rollout shard's rank other than rank 0 (``spade.selfplay.plays.rollout_shards``)."""

    def __init__(self, rollout: RolloutManager, server: Any):
        super().__init__(rollout)
        self.server = server
        self.serving: Optional[asyncio.Task] = None

    async def produce(self, step: Step, *, ready: Optional[Any] = None) -> Optional[Any]:
        self.serving = asyncio.create_task(self.server.serve_step())  # until rank 0's step ends
        return None

    async def switch_to_training(self, out: Optional[Any], *, keep_serving: bool = False) -> list:
        samples = await self.rollout.switch_to_training(None, keep_serving=keep_serving)
        serving, self.serving = self.serving, None
        if serving is not None:
            await serving  # it ended before rank 0 shared the samples
        return samples


class Orchestrating(Waiting):
    """Global rank 0. ``evaluate_now(done)`` runs the configured benchmarks; ``due(updates)`` says
    when (``eval.due``); ``best_metric`` is ``run.best_metric``."""

    def __init__(self, rollout: RolloutManager, orchestrator: Any, progress: Progress, *, shards: Any,
                 device: torch.device, evaluate_now: Callable[[Step], Awaitable[dict[str, Any]]],
                 due: Callable[[int], bool], best_metric: str):
        super().__init__(rollout)
        self.orchestrator = orchestrator
        self.progress = progress
        self.shards = shards
        self.device = device
        self.evaluate_now, self.due, self.best_metric = evaluate_now, due, best_metric
        self.eval_score: Optional[tuple[int, float]] = None  # (updates, run.best_metric) of the last evaluation

    async def produce(self, step: Step, *, ready: Optional[Any] = None) -> Optional[Any]:
        if ready is not None:
            return ready
        out = await measured_step(self.orchestrator, self.rollout.engine, step, self.progress,
                                  play_engine=self.rollout.play_engine)
        if self.shards is not None:  # the shards go on to the samples' broadcast
            await in_thread(self.device, self.shards.end_step)
        return out

    async def switch_to_training(self, out: Optional[Any], *, keep_serving: bool = False) -> list:
        return await self.rollout.switch_to_training([t.to_train_sample() for t in out.samples],
                                                     keep_serving=keep_serving)

    async def play_ahead(self, step: Step) -> Optional[Any]:
        """The next step's rollout during this step's update: the progress line stays ``training``."""
        on_stage, self.orchestrator.on_stage = self.orchestrator.on_stage, no_stage
        try:
            return await measured_step(self.orchestrator, self.rollout.engine, step, self.progress)
        finally:
            self.orchestrator.on_stage = on_stage

    async def evaluate(self, done: Step) -> Optional[dict[str, Any]]:
        if not self.due(done.updates_done):
            return None
        out = await self.evaluate_now(done)
        score = checkpoint_score(out, self.best_metric)
        self.eval_score = None if score is None else (done.updates_done, score)
        return out
