"""A live one-line status display for ``spade train``, plain log lines when not on a terminal.

The trainer (and, when it wants, the orchestrator: see ``Progress.phase`` / ``Progress.update``)
feeds it; on a TTY one status line is redrawn in place with ``\\r``::

    step 2 (3/400) | playing | envs 18 admitted | episodes 212 | 1830 tok/s | last step 41.2s

Otherwise each phase change and each finished step prints one plain line (phase changes only
every ``log_every`` steps' worth of noise: at most one line per phase). A finished step's line
(:func:`spade.run.console.step_line`, printed on a TTY too, above the status line) names what the
step did: environments admitted and rejected with the top reasons, plays and mean return with and
without hint, loss and gradient norm, designer rewards released, time. ``env_source`` (the run's
``selfplay.env_source``) picks the words for the set: environments admitted (designer), drawn
from the pool (fixed_pool), or rlve problems and the environments raised (rlve).

**Phases** are named as they run: ``starting`` (sandbox, servers, model), then per step
``designing``, ``admitting`` and ``hinting`` (a regeneration; slots run concurrently, the phase
is the earliest stage a slot is still in, with how many slots are in each), ``drawing`` (fixed
pool) or ``generating`` (rlve), ``playing``, ``training``, ``syncing``, ``evaluating`` and
``checkpointing``. The time in the current phase moves: a heartbeat thread redraws the TTY line
every second and, off a terminal, writes ``step 2 (3/4) training for 30 s ...`` whenever nothing
was written for ``heartbeat_s`` (25 s), so a log file is never silent for 30 s during a step.

Steps are numbered as everywhere else (docs/training_runs.md, "Step numbers"): ``step 2 (3/4)``
is the step with 2 updates done before it, the third of four.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Optional, TextIO

from ..selfplay.step import Step
from .console import step_label, step_line


class Progress:
    def __init__(self, total_steps: int, *, stream: Optional[TextIO] = None, tty: Optional[bool] = None,
                 log_every: int = 1, enabled: bool = True, env_source: Optional[str] = None,
                 heartbeat_s: float = 25.0):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(tty if tty is not None else getattr(self.stream, "isatty", lambda: False)())
        self.total_steps = total_steps
        self.log_every = max(1, log_every)
        self.enabled = enabled
        self.env_source = env_source  # None: told apart by the metrics (spade.run.console.source_of)
        self.step: Optional[int] = None
        self.phase_name = "starting"
        self.phase_detail: Optional[str] = None
        self._logged_phases: set[str] = set()  # the phase lines a log file got in this step
        self.counters: dict[str, Any] = {}
        self.tokens_per_s: Optional[float] = None
        self.last_step_s: Optional[float] = None
        self._phase_started = time.monotonic()
        self._step_started: Optional[float] = None
        self._width = 0
        self.heartbeat_s = heartbeat_s
        self._lock = threading.RLock()  # the heartbeat thread, the main thread and a SIGINT handler write
        self._last_write = time.monotonic()
        self._beating: Optional[threading.Thread] = None
        self._stopped = threading.Event()

    # -- feeding
    def start_step(self, step: int) -> None:
        self.step = step
        self.counters = {}
        self._step_started = time.monotonic()
        self._logged_phases = set()

    def phase(self, name: str, detail: Optional[str] = None, **counters: Any) -> None:
        """The current phase; ``detail`` (e.g. the designer slots per stage) holds until the next call."""
        self._start_heartbeat()
        changed = name != self.phase_name
        if changed:
            self._phase_started = time.monotonic()
        self.phase_name = name
        self.phase_detail = detail
        self.counters.update(counters)
        if self.tty:
            self._redraw()
        elif changed and self._loud() and not (detail and name in self._logged_phases):  # concurrent slots: once
            self._logged_phases.add(name)
            self._line(f"step {self._step_text()} {self._phase_text()}" + self._counter_text())

    def step_time_left(self) -> Optional[float]:
        """About how long the step in progress still runs: the last step's time less what this one
        has run (0 once past it); None before a step has ended."""
        if self.last_step_s is None or self._step_started is None:
            return None
        return max(0.0, float(self.last_step_s) - (time.monotonic() - self._step_started))

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
        with self._lock:
            if self.tty and self._width:
                self.stream.write("\r" + " " * self._width + "\r")
            self.stream.write(text + "\n")
            self.stream.flush()
            self._last_write = time.monotonic()
            if self.tty:
                self._redraw()

    def close(self) -> None:
        self._stopped.set()
        with self._lock:
            if self.enabled and self.tty and self._width:
                self.stream.write("\n")
                self.stream.flush()
                self._width = 0

    # -- the heartbeat
    def _start_heartbeat(self) -> None:
        if self._beating is not None or not self.enabled or self.heartbeat_s <= 0:
            return
        self._beating = threading.Thread(target=self._beat, name="spade-progress", daemon=True)
        self._beating.start()

    def _beat(self) -> None:
        """TTY: redraw every second (the phase's time moves); else a line after ``heartbeat_s`` of silence."""
        tick = min(1.0, self.heartbeat_s / 4)
        while not self._stopped.wait(tick):
            with self._lock:
                if not self.enabled:
                    continue
                if self.tty:
                    self._redraw()
                elif time.monotonic() - self._last_write >= self.heartbeat_s:
                    self._line(self.heartbeat_line())

    def heartbeat_line(self) -> str:
        """``step 2 (3/4) training for 30 s samples=12``: the phase and how long it has run."""
        where = "" if self.step is None else f"step {self._step_text()} "  # before the first step: building
        return f"{where}{self._phase_text()} for {time.monotonic() - self._phase_started:.0f} s" + self._counter_text()

    def _phase_text(self) -> str:
        return self.phase_name + (f" ({self.phase_detail})" if self.phase_detail else "")

    # -- drawing
    def _loud(self) -> bool:
        return self.step is None or Step(self.step).every(self.log_every)

    def _step_text(self) -> str:
        return "-" if self.step is None else step_label(self.step, self.total_steps)

    def _counter_text(self) -> str:
        return "".join(f" {k}={v}" for k, v in self.counters.items())

    def status_line(self) -> str:
        parts = [f"step {self._step_text()}", self._phase_text()]
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
        with self._lock:
            text = self.status_line()
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
            self._width = len(text)
            self._last_write = time.monotonic()

    def _line(self, text: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            stamp = time.strftime("%H:%M:%S")
            self.stream.write(f"[{stamp}] {text}\n")
            self.stream.flush()
            self._last_write = time.monotonic()
