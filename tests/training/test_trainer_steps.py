"""The trainer's loop counts steps as updates done: which steps run, which weight version the engine
starts from, which checkpoints are written; and the one place a step's metrics line is made.

The loop runs with its parts replaced by recorders (no model, no engine); the expected numbers are
written out by hand from ``run.steps``, ``run.checkpoint_every`` and the checkpoint resumed from.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from spade.peak_memory import PhaseMemory
from spade.run.loops import Synchronous
from spade.run.step_metrics import step_record
from spade.run.trainer import Trainer
from spade.selfplay.step import Step


class Recorder:
    def __init__(self):
        self.published: list[int] = []
        self.counters = {}

    async def publish(self, weights, version, *, changed=True):
        self.published.append(version)

    def phase(self, *args, **kwargs):
        pass


class Loop(Trainer):
    """The real ``Trainer.run`` loop; building, restoring, the step and the checkpoint recorded."""

    def __init__(self, steps: int, every: int, *, start: int = 0, resume: bool = False):
        self.config = SimpleNamespace(run=SimpleNamespace(steps=steps, checkpoint_every=every, loggers=("tensorboard",), best_metric="none", best_mode="max", overlap=0), eval=SimpleNamespace(every=0))
        self.resume, self.rank, self.start = resume, 1, start
        self.stop = None  # no Ctrl-C handler (spade.run.stop)
        self.last_checkpoint_s = None
        self.rollout = self.progress = Recorder()
        self.learner = SimpleNamespace(weight_stream=None)
        self.schedule = Synchronous()
        self.phase_memory = PhaseMemory()  # peak RSS per phase (issue 25)
        self.ran: list[Step] = []
        self.saved: list[Step] = []

    async def build(self):
        pass

    def restore(self) -> Step:
        return Step(self.start)

    async def one_step(self, step: Step, **schedule):
        self.ran.append(step)

    def checkpoint(self, done: Step):
        self.saved.append(done)

    async def close(self):
        pass


@pytest.mark.parametrize("steps, every, start, resume, ran, saved", [
    (5, 2, 0, False, [0, 1, 2, 3, 4], [2, 4, 5]),  # every 2 updates, and after the last
    (5, 2, 3, True, [3, 4], [4, 5]),  # resumed from checkpoint 3: steps 3 and 4 remain
    (4, 2, 4, True, [], []),  # resumed from the final checkpoint: nothing to do
    (3, 1, 0, False, [0, 1, 2], [1, 2, 3]),
    (0, 1, 0, False, [], []),
])
def test_steps_run_and_checkpoints_written(steps, every, start, resume, ran, saved):
    loop = Loop(steps, every, start=start, resume=resume)
    assert asyncio.run(loop.run()) == len(ran)
    assert loop.ran == [Step(n) for n in ran]
    assert loop.saved == [Step(n) for n in saved]
    assert loop.rollout.published == [start]  # the engine starts from the checkpoint's weights


@dataclass
class Out:
    metrics: dict = field(default_factory=dict)


def test_the_metrics_line_is_made_in_one_place():
    between = step_record(Out({"agent/samples": 4.0, "designer/samples": 0.0, "time/play_s": 2.0}),
                          {"train/policy_lag_max": 0.0}, {"train/loss": 0.5}, {"engine/restarts_total": 0.0}, {},
                          times={"time/step_s": 9.0})
    assert between == {"agent/samples": 4.0, "designer/samples": 0.0, "time/play_s": 2.0, "env/admitted": 0.0,
                       "env/rejected": 0.0, "train/policy_lag_max": 0.0, "train/loss": 0.5,
                       "engine/restarts_total": 0.0, "time/step_s": 9.0}
    at_regeneration = step_record(Out({"env/admitted": 3.0, "env/rejected": 5.0}), {"eval/mean": 0.4},
                                  times={})
    assert at_regeneration == {"env/admitted": 3.0, "env/rejected": 5.0, "eval/mean": 0.4}
