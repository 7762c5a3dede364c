"""``train_steps`` after a first Ctrl-C (``spade.run.stop``): the step in progress ends, its
checkpoint is written out of schedule and the run stops naming it; on the last step the run just
ends. A recording trainer stands in for the model: the loop's schedule is what is under test
(the real command: tests/run/test_train_interrupt.py)."""

from __future__ import annotations

import asyncio

import pytest

from spade.run.loops import Synchronous, train_steps
from spade.run.stop import GracefulStop, StopRequested
from spade.selfplay.step import Step


class Recorder:
    def __init__(self, *, checkpoint_every: int, stop_during: int):
        self.config = type("C", (), {"run": type("R", (), {"checkpoint_every": checkpoint_every})()})()
        self.resume = False
        self.stop = GracefulStop()
        self.stop_during = stop_during
        self.events: list[str] = []

    async def one_step(self, step: Step, *, ready=None, update=None) -> None:
        self.events.append(f"step {step.updates_done}")
        if step.updates_done == self.stop_during:
            self.stop.requested = True

    def stop_requested(self) -> bool:
        return self.stop.requested

    def checkpoint(self, done: Step) -> None:
        self.events.append(f"checkpoint {done.updates_done}")


def test_a_stop_checkpoints_the_step_in_progress_out_of_schedule():
    trainer = Recorder(checkpoint_every=4, stop_during=1)
    with pytest.raises(StopRequested) as stopped:
        asyncio.run(train_steps(trainer, Synchronous(), Step(0), Step(8)))
    assert stopped.value.done == 2
    assert trainer.events == ["step 0", "step 1", "checkpoint 2"]


def test_a_stop_on_a_scheduled_checkpoint_writes_it_once():
    trainer = Recorder(checkpoint_every=2, stop_during=1)
    with pytest.raises(StopRequested):
        asyncio.run(train_steps(trainer, Synchronous(), Step(0), Step(8)))
    assert trainer.events == ["step 0", "step 1", "checkpoint 2"]


def test_a_stop_during_the_last_step_ends_the_run_as_it_would_have():
    trainer = Recorder(checkpoint_every=4, stop_during=2)
    assert asyncio.run(train_steps(trainer, Synchronous(), Step(0), Step(3))) == 3
    assert trainer.events == ["step 0", "step 1", "step 2", "checkpoint 3"]



def test_a_stop_now_dropped_in_a_weakref_callback_is_raised_again_at_the_next_safe_point(monkeypatch):
    """A signal handler's exception raised while a weakref callback runs is printed and dropped by
    Python; the trainer's stage changes and step ends raise it again (seen in a loaded CI run)."""
    import io
    import signal
    import sys
    import weakref

    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: dropped.append(unraisable.exc_type))

    class Thing:
        pass

    stop = GracefulStop(stream=io.StringIO())
    stop.describe = lambda: "stopping after step 0's checkpoint"
    assert stop.install()
    try:
        stop.on_sigint(signal.SIGINT, None)  # the first Ctrl-C: recorded, nothing raised
        assert stop.requested and not stop.now
        stop.raise_if_now()  # nothing to raise yet
        thing = Thing()
        ref = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGINT))  # the second Ctrl-C lands here
        del thing  # the callback runs: the handler's KeyboardInterrupt is raised inside it and dropped
        assert ref() is None and dropped == [KeyboardInterrupt]
        assert stop.now
        with pytest.raises(KeyboardInterrupt):
            stop.raise_if_now()
    finally:
        stop.uninstall()
