"""Peak RSS per phase (issue 25): ``memory/peak_rss_gb/<phase>`` from the kernel's resettable
high-water mark, checked with an allocation of known size; the getrusage fallback; the step line.
"""

from __future__ import annotations

import gc
import sys

import pytest

from spade.peak_memory import GB, PeakRss, PhaseMemory
from spade.run.console import step_line
from spade.run.step_metrics import step_memory

MB = 2**20
BLOCK = 256 * MB


def _touch(size: int) -> bytearray:
    block = bytearray(size)  # zero pages are not resident until written
    for i in range(0, size, 4096):
        block[i] = 1
    return block


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
def test_each_phase_has_its_own_peak():
    """On a kernel that resets the mark, each phase's own peak; on one that takes the write and keeps
    the mark (seen on a CI container), the meter must notice and label its figures as since the start."""
    meter = PhaseMemory()
    assert meter.probe.resettable, "/proc/self/clear_refs is not writable here"
    gc.collect()
    meter.start()
    if not meter.probe.resettable:
        meter.mark("quiet")
        assert meter.metrics()["memory/peak_rss_since_start"] == 1.0
        return  # nothing more to see where the kernel keeps the mark: it was detected and labelled
    meter.mark("quiet")
    block = _touch(BLOCK)
    meter.mark("allocating")  # read while the block is resident (a freed block's peak is not
    del block                 # always kept by the kernel once it is unmapped)
    gc.collect()
    meter.mark("freeing")  # reset while the block was still resident, so it counts here too
    meter.mark("after")
    quiet, allocating, after = (meter.peaks[p] for p in ("quiet", "allocating", "after"))
    assert allocating - quiet >= 0.9 * BLOCK  # the block was resident during "allocating"
    assert after < allocating - 0.8 * BLOCK  # and the mark was reset once it was freed
    metrics = meter.metrics()
    assert metrics["memory/peak_rss_gb/allocating"] == pytest.approx(allocating / GB)
    largest = max(allocating, meter.peaks["freeing"])  # both saw the block resident
    assert metrics["memory/peak_rss_gb"] == pytest.approx(largest / GB)
    assert meter.largest_phase() in ("allocating", "freeing") and "memory/peak_rss_since_start" not in metrics


def test_without_clear_refs_the_peak_is_since_the_start_and_says_so(tmp_path):
    probe = PeakRss(clear_refs=tmp_path)  # a directory: the write fails as on a locked-down kernel
    assert not probe.resettable
    import resource

    scale = 1 if sys.platform == "darwin" else 1024
    assert probe.peak_bytes() >= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    meter = PhaseMemory(probe=probe)
    meter.start()
    meter.mark("update")
    assert meter.metrics()["memory/peak_rss_since_start"] == 1.0


def _status(path, hwm_kb: int, rss_kb: int):
    path.write_text(f"Name:\tpython\nVmHWM:\t{hwm_kb} kB\nVmRSS:\t{rss_kb} kB\n")


def test_a_reset_the_kernel_ignores_turns_the_fallback_on(tmp_path):
    status, clear_refs = tmp_path / "status", tmp_path / "clear_refs"
    _status(status, 2_000_000, 1_990_000)  # the mark 10 MB above the RSS: a reset that worked
    probe = PeakRss(status=status, clear_refs=clear_refs)
    assert probe.resettable and clear_refs.read_text() == "5"
    assert probe.peak_bytes() == 2_000_000 * 1024
    _status(status, 2_000_000, 1_000_000)  # the write taken, the mark kept 1 GB above the RSS
    assert not probe.reset() and not probe.resettable
    _status(status, 1_000_000, 1_000_000)
    assert not probe.reset() and not probe.resettable  # once seen, for good
    meter = PhaseMemory(probe=probe)
    meter.start()
    meter.mark("update")
    assert meter.metrics()["memory/peak_rss_since_start"] == 1.0


def test_a_phase_marked_twice_keeps_the_larger_peak():
    class Fixed(PeakRss):
        def __init__(self, values):
            self.values, self.resettable = list(values), True

        def reset(self):
            return True

        def peak_bytes(self):
            return self.values.pop(0)

    meter = PhaseMemory(probe=Fixed([3 * 10**9, 1 * 10**9, 2 * 10**9]))
    meter.start()
    for phase in ("logprobs", "update", "logprobs"):
        meter.mark(phase)
    assert meter.metrics() == {"memory/peak_rss_gb/logprobs": 3.0, "memory/peak_rss_gb/update": 1.0,
                               "memory/peak_rss_gb": 3.0}


def test_step_line_and_the_checkpoint_of_the_step_before():
    phases = {"memory/peak_rss_gb/plays": 2.5, "memory/peak_rss_gb/forward_backward": 3.25,
              "memory/peak_rss_gb": 3.25}
    record = step_memory(phases, {"memory/peak_rss_gb/checkpoint": 3.9, "memory/peak_rss_gb": 3.9})
    assert record["memory/peak_rss_gb/checkpoint"] == 3.9 and record["memory/peak_rss_gb"] == 3.25
    assert step_memory(phases, {}) == phases
    first = step_memory(phases, {"memory/peak_rss_gb/build": 2.4, "memory/peak_rss_gb": 2.4})
    assert first["memory/peak_rss_gb/build"] == 2.4 and first["memory/peak_rss_gb"] == 3.25
    line = step_line(0, 3, {**record, "agent/episodes": 0})
    assert line.endswith("peak RSS 3.2 GB in forward_backward")


FRAGMENTED_FREE = """
import sys
from spade.peak_memory import PeakRss, large_allocations_from_mmap
if sys.argv[1] == "fixed":
    assert large_allocations_from_mmap()
probe = PeakRss()
def touched(size):
    block = bytearray(size)
    block[::4096] = b"\\1" * len(block[::4096])
    return block
first = touched(16 << 20)
del first  # glibc's default: the threshold rises to 16 MiB, later 8 MiB blocks come from its heap
before = probe.current_bytes()
blocks = [touched(8 << 20) for _ in range(30)]
held = probe.current_bytes()
del blocks[0:29:2]  # free every other block; the last one keeps the heap's top in place
print((held - probe.current_bytes()) / (15 * (8 << 20)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_fixed_mmap_threshold_returns_freed_blocks_to_the_kernel():
    import subprocess

    def returned(mode: str) -> float:
        done = subprocess.run([sys.executable, "-c", FRAGMENTED_FREE, mode], capture_output=True, text=True,
                              check=True)
        return float(done.stdout.strip())

    assert returned("fixed") > 0.9  # the freed half left the process
    assert returned("default") < 0.2  # glibc's default keeps it resident (why the trainer fixes it)
