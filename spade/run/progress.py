"""A live one-line status display for ``spade train``, plain log lines when not on a terminal.

The trainer (and, when it wants, the orchestrator: see ``Progress.phase`` / ``Progress.update``)
feeds it; on a TTY one status line is redrawn in place with ``\\r``::

    step 3/400 | playing | envs 18 admitted | episodes 212 | 1830 tok/s | last step 41.2s

Otherwise each phase change and each finished step prints one plain line (phase changes only
every ``log_every`` steps' worth of noise: at most one line per phase). A finished step's line
(:func:`spade.run.console.step_line`, printed on a TTY too, above the status line) names what the
step did: environments admitted and rejected with the top reasons, plays and mean return with and
without hint, loss and gradient norm, designer rewards released, time. ``env_source`` (the run's
``selfplay.env_source``) picks the words for the set: environments admitted (designer), drawn
from the pool (fixed_pool), or rlve problems and the environments raised (rlve).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional, TextIO

from ..selfplay.step import Step
from .console import step_line


class Progress:
    def __init__(self, total_steps: int, *, stream: Optional[TextIO] = None, tty: Optional[bool] = None,
                 log_every: int = 1, enabled: bool = True, env_source: Optional[str] = None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(tty if tty is not None else getattr(self.stream, "isatty", lambda: False)())
        self.total_steps = total_steps
        self.log_every = max(1, log_every)
        self.enabled = enabled
        self.env_source = env_source  # None: told apart by the metrics (spade.run.console.source_of)
        self.step: Optional[int] = None
        self.phase_name = "starting"
        self.counters: dict[str, Any] = {}
        self.tokens_per_s: Optional[float] = None
        self.last_step_s: Optional[float] = None
        self._phase_started = time.monotonic()
        self._width = 0

    # -- feeding
    def start_step(self, step: int) -> None:
        self.step = step
        self.counters = {}

    def phase(self, name: str, **counters: Any) -> None:
        changed = name != self.phase_name
        self.phase_name = name
        self._phase_started = time.monotonic()
        self.counters.update(counters)
        if self.tty:
            self._redraw()
        elif changed and self._loud():
            self._line(f"step {self._step_text()} {name}" + self._counter_text())

    def update(self, **counters: Any) -> None:
        """Counters such as ``admitted=``, ``rejected=``, ``episodes=``, ``tokens_per_s=``."""
        tokens = counters.pop("tokens_per_s", None)
        if tokens is not None:
            self.tokens_per_s = float(tokens)
        self.counters.update(counters)
        if self.tty:
            self._redraw()

    def end_step(self, step: int, metrics: dict[str, Any]) -> None:
        self.last_step_s = metrics.get("time/step_s")
        if Step(step).after.every(self.log_every) or Step(step).ordinal == self.total_steps:
            line = step_line(step, self.total_steps, metrics, self.env_source)
            if self.tty:
                self.message(f"[{time.strftime('%H:%M:%S')}] {line}")
            else:
                self._line(line)
        elif self.tty:
            self._redraw()

    def message(self, text: str) -> None:
        """A plain line (on a TTY: above the status line)."""
        if not self.enabled:
            return
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
        self.stream.write(text + "\n")
        self.stream.flush()
        if self.tty:
            self._redraw()

    def close(self) -> None:
        if self.enabled and self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0

    # -- drawing
    def _loud(self) -> bool:
        return self.step is None or Step(self.step).every(self.log_every)

    def _step_text(self) -> str:
        shown = "-" if self.step is None else str(Step(self.step).ordinal)
        return f"{shown}/{self.total_steps}"

    def _counter_text(self) -> str:
        return "".join(f" {k}={v}" for k, v in self.counters.items())

    def status_line(self) -> str:
        parts = [f"step {self._step_text()}", self.phase_name]
        admitted = self.counters.get("admitted")
        if admitted is not None:
            parts.append({"fixed_pool": f"envs {admitted} drawn", "rlve": f"problems {admitted}"}.get(
                self.env_source or "", f"envs {admitted} admitted"))
        episodes = self.counters.get("episodes")
        if episodes is not None:
            parts.append(f"episodes {episodes}")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:.0f} tok/s")
        parts.append(f"{time.monotonic() - self._phase_started:.0f}s in phase")
        if self.last_step_s is not None:
            parts.append(f"last step {self.last_step_s:.1f}s")
        return " | ".join(parts)

    def _redraw(self) -> None:
        if not self.enabled:
            return
        text = self.status_line()
        pad = max(0, self._width - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)

    def _line(self, text: str) -> None:
        if not self.enabled:
            return
        stamp = time.strftime("%H:%M:%S")
        self.stream.write(f"[{stamp}] {text}\n")
        self.stream.flush()
