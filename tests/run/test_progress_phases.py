"""The phases of a step as ``spade train`` shows them (issue 43): named as they run, the designer's
concurrent slots told as the earliest stage a slot is in, and a log file that hears from a long
phase at least every ``heartbeat_s``. A real :class:`Progress` writing to a string."""

from __future__ import annotations

import io
import re
import time

from spade.run.progress import Progress
from spade.selfplay.sources.slot_stages import SlotStages


def log_progress(**kwargs) -> tuple[Progress, io.StringIO]:
    stream = io.StringIO()
    return Progress(4, stream=stream, tty=False, **kwargs), stream


def phase_lines(stream: io.StringIO) -> list[str]:
    return [re.sub(r"^\[\d\d:\d\d:\d\d\] ", "", line) for line in stream.getvalue().splitlines()]


def test_concurrent_designer_slots_are_told_as_the_earliest_stage_once_each():
    progress, stream = log_progress(heartbeat_s=0)
    progress.start_step(2)
    stages = SlotStages()
    stages.report = lambda name, detail: progress.phase(name, detail=detail)
    for slot in range(3):
        stages.enter(slot, "designing")
    assert progress.status_line().startswith("step 2 (3/4) | designing (3 designing) |")
    stages.enter(0, "admitting")
    stages.enter(1, "admitting")
    assert progress.status_line().startswith("step 2 (3/4) | designing (1 designing, 2 admitting) |")
    stages.leave(2)  # its attempts ran out
    stages.enter(0, "hinting")
    assert progress.status_line().startswith("step 2 (3/4) | admitting (1 admitting, 1 hinting) |")
    stages.enter(1, "designing")  # rejected: the slot's next attempt
    stages.enter(1, "admitting")
    stages.enter(1, "hinting")
    stages.leave(0)
    stages.leave(1)
    progress.phase("playing")
    # a log file gets each stage once per step, not every back-and-forth of a slot
    assert phase_lines(stream) == ["step 2 (3/4) designing (1 designing)", "step 2 (3/4) admitting (2 admitting)",
                                   "step 2 (3/4) hinting (2 hinting)", "step 2 (3/4) playing"]


def test_a_log_file_hears_from_a_long_phase_every_heartbeat():
    """Off a terminal the heartbeat writes the phase and its time when nothing was written for
    ``heartbeat_s`` (25 s in a run; 0.2 s here)."""
    progress, stream = log_progress(heartbeat_s=0.2)
    progress.start_step(2)
    progress.phase("training", samples=12)
    deadline = time.monotonic() + 10
    while stream.getvalue().count("\n") < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("step 2 (3/4) training samples=12"), lines
    assert all(re.fullmatch(r"\[\d\d:\d\d:\d\d\] step 2 \(3/4\) training for \d+ s samples=12", line)
               for line in lines[1:3]), lines


def test_the_heartbeat_stays_quiet_while_lines_come_and_stops_with_the_run():
    progress, stream = log_progress(heartbeat_s=0.5)
    progress.start_step(0)
    progress.phase("playing")
    for _ in range(8):  # a line every 0.1 s: no heartbeat is due
        time.sleep(0.1)
        progress.message("a line")
    assert "for " not in stream.getvalue()
    progress.close()
    written = stream.getvalue()
    time.sleep(0.8)
    assert stream.getvalue() == written


def test_the_time_left_in_a_step_comes_from_the_last_step():
    progress, _ = log_progress(heartbeat_s=0)
    progress.start_step(0)
    assert progress.step_time_left() is None  # no step has ended yet
    progress.end_step(0, {"time/step_s": 40.0})
    progress.start_step(1)
    assert 39.0 < progress.step_time_left() <= 40.0


def test_on_a_terminal_the_phase_time_moves_on_one_redrawn_line():
    stream = io.StringIO()
    progress = Progress(4, stream=stream, tty=True, heartbeat_s=0.2)  # redrawn every 0.05 s here, 1 s in a run
    progress.start_step(1)
    progress.phase("playing")
    deadline = time.monotonic() + 10
    while "1s in phase" not in stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    progress.close()
    drawn = stream.getvalue()
    assert "step 1 (2/4) | playing | 0s in phase" in drawn and "step 1 (2/4) | playing | 1s in phase" in drawn
    assert drawn.count("\n") == 1  # one line, redrawn with \r; the newline only at close


def test_a_long_start_is_heard_from_too():
    progress, stream = log_progress(heartbeat_s=0.2)
    progress.phase("starting", what="model")
    deadline = time.monotonic() + 10
    while "for " not in stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    progress.close()
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] starting for \d+ s what=model", stream.getvalue().splitlines()[0])
