"""Peak resident memory (RSS) per phase of a training step: the ``memory/peak_rss_gb/*`` metrics.

On Linux the kernel keeps the process's RSS high-water mark (``VmHWM`` in ``/proc/self/status``)
and resets it to the current RSS when "5" is written to ``/proc/self/clear_refs``. ``PhaseMemory``
resets it when a step starts and at each phase boundary, and reads it at the next boundary: each
phase's figure is the largest RSS the process reached during that phase (all its threads; on a
multi-rank run, this rank's process).

The reset is the kernel's one high-water mark: ``getrusage``'s ``ru_maxrss`` and ``/usr/bin/time
-v``'s "Maximum resident set size" read the same counter, so for a ``spade train`` process they
report only the peak since the last phase boundary. The run's peak is the largest
``memory/peak_rss_gb/*`` of its lines (``build`` on the first line, ``checkpoint`` on the next).

Where ``clear_refs`` cannot be written (not Linux, a restricted container) the high-water mark
cannot be reset: the figures fall back to ``resource.getrusage``'s maximum RSS, the peak since the
process started, so a phase shows the largest of itself and everything before it
(``PeakRss.resettable`` is False, and the metrics carry ``memory/peak_rss_since_start: 1``).

``large_allocations_from_mmap()`` keeps those peaks from piling up: glibc serves a block of at
least ``M_MMAP_THRESHOLD`` with its own ``mmap`` (returned to the kernel on free) and smaller ones
from its heap, which keeps freed space resident; by default it raises the threshold up to 32 MiB
whenever such a block is freed, so after the first step every activation tensor of a CPU update
(a few MiB each) lives on the heap and stays resident after the update. A fixed threshold (which
also turns the raising off) returns them: the steady-state update of the smoke run peaked 1 GB
lower with the same losses (benchmarks/main_job_memory.py).

Standard library only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

GB = 1e9
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial threshold, kept fixed
STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
# a mark this far above the RSS just after a reset was not reset (the RSS can only have fallen by
# what other threads freed in the microseconds between the write and the read)
IGNORED_RESET_BYTES = 64 * 2**20


class PeakRss:
    """The process's RSS high-water mark, and its reset where the kernel allows it."""

    def __init__(self, status: Path = STATUS, clear_refs: Path = CLEAR_REFS):
        self.status = status
        self.clear_refs = clear_refs
        self.resettable = True
        self.resettable = self.reset()

    def reset(self) -> bool:
        """Set the high-water mark to the current RSS; False when the kernel does not let us. A
        kernel may take the write and keep the mark (some container runtimes): a mark still well
        above the RSS right after the write shows that, and ``resettable`` turns False for good
        (the figures fall back to the peak since the start, and say so)."""
        if not self.resettable:
            return False
        try:
            self.clear_refs.write_text("5")
        except OSError:
            self.resettable = False
            return False
        mark, rss = self._status_kb("VmHWM"), self._status_kb("VmRSS")
        if mark is not None and rss is not None and (mark - rss) * 1024 > IGNORED_RESET_BYTES:
            self.resettable = False
            return False
        return True

    def peak_bytes(self) -> int:
        """The high-water mark in bytes (VmHWM, else getrusage's maximum RSS)."""
        value = self._status_kb("VmHWM") if self.resettable else None
        if value is not None:
            return value * 1024
        scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, kilobytes on Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale

    def current_bytes(self) -> Optional[int]:
        """The RSS now (VmRSS), None where /proc is missing."""
        value = self._status_kb("VmRSS")
        return None if value is None else value * 1024

    def _status_kb(self, key: str) -> Optional[int]:
        try:
            for line in self.status.read_text().splitlines():
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            return None
        return None


@dataclass
class PhaseMemory:
    """Peak RSS of each phase of a step: ``start()`` when the step begins, ``mark(phase)`` when a
    phase ends (a phase marked twice keeps the larger peak), ``metrics()`` for the step's line."""

    probe: PeakRss = field(default_factory=PeakRss)
    peaks: dict[str, int] = field(default_factory=dict)

    def start(self) -> None:
        self.peaks = {}
        self.probe.reset()

    def mark(self, phase: str) -> None:
        peak = self.probe.peak_bytes()
        self.peaks[phase] = max(peak, self.peaks.get(phase, 0))
        self.probe.reset()

    def metrics(self) -> dict[str, float]:
        """``memory/peak_rss_gb/<phase>`` per phase and ``memory/peak_rss_gb`` (the step's largest), in GB."""
        if not self.peaks:
            return {}
        out = {f"memory/peak_rss_gb/{phase}": peak / GB for phase, peak in self.peaks.items()}
        out["memory/peak_rss_gb"] = max(self.peaks.values()) / GB
        if not self.probe.resettable:
            out["memory/peak_rss_since_start"] = 1.0
        return out

    def largest_phase(self) -> Optional[str]:
        return max(self.peaks, key=self.peaks.get) if self.peaks else None


def large_allocations_from_mmap(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes (module docstring); False where the C
    library is not glibc (nothing changed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold)))


def no_phase(phase: str) -> None:
    """The default phase hook of the parts that report phases (nothing measures)."""
