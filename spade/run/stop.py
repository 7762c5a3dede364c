"""Ctrl-C in ``spade train``: the first finishes the step and its checkpoint, the second stops now.

:class:`GracefulStop` is installed as the SIGINT handler of a single-process run (under torchrun
every rank gets the signal and they would have to agree on a step: there Ctrl-C stops at once, as
before). The first SIGINT sets :attr:`GracefulStop.requested` and prints at once what will happen,
in the words of ``describe`` (the trainer's: the step in progress and the time left, from the
measured step and checkpoint times); ``spade.run.loops.train_steps`` checkpoints after that step
and ends the run. A second SIGINT, or the first one while ``describe`` has no step to name (the
model is still loading), raises ``KeyboardInterrupt`` as Python's own handler would. A signal
handler's exception can land in a finalizer or a weakref callback, where Python prints it and drops
it ("Exception ignored in ..."); so a stop-now is also remembered (:attr:`GracefulStop.now`), and
the trainer raises it again at its next stage change or step end (:meth:`GracefulStop.raise_if_now`).

Standard library only.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Callable, Optional, TextIO


class StopRequested(Exception):
    """The run ended early on request, after checkpointing ``done`` updates."""

    def __init__(self, done: int):
        super().__init__(f"stopped on request with {done} updates done")
        self.done = done


class GracefulStop:
    """A SIGINT handler: stop after the current step's checkpoint; again: stop now."""

    def __init__(self, stream: Optional[TextIO] = None):
        self.requested = False
        self.stream = stream if stream is not None else sys.stderr
        # what will happen (the step and about how long), or None while no step runs yet
        self.describe: Callable[[], Optional[str]] = lambda: None
        self._previous = None
        self.now = False  # a stop-now was raised (and may have been dropped: module docstring)

    def install(self) -> bool:
        """Become the SIGINT handler (main thread only); returns whether it was installed."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self._previous = signal.signal(signal.SIGINT, self.on_sigint)
        return True

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def on_sigint(self, signum, frame) -> None:  # noqa: ARG002
        if self.requested:
            self._stop_now()
        what = self.describe()
        if what is None:
            self._stop_now()
        self.requested = True
        self.stream.write(f"\nspade train: Ctrl-C: {what}; Ctrl-C again to stop now\n")
        self.stream.flush()

    def raise_if_now(self) -> None:
        """Raise the stop-now again where it is safe to: a signal handler's raise may have been dropped."""
        if self.now:
            raise KeyboardInterrupt

    def _stop_now(self) -> None:
        self.now = True
        raise KeyboardInterrupt
