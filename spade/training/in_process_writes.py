"""megatron-core's checkpoint file writer, run in this process.

megatron-core's filesystem writer would otherwise start a ``multiprocessing`` Manager (a spawned
server process plus a resource tracker, which outlive a killed trainer) and fork one writer per
file. ``in_process_writes`` swaps in a sequential writer for the duration of a
``dist_checkpointing.save`` and yields the list of the files this rank wrote.
"""

from __future__ import annotations

import contextlib
import functools
import queue
from typing import Any


def _write_buckets_in_process(written: list[str], transform_list: list, use_msc: bool, rank: int,
                              write_buckets: list, global_results_queue: Any) -> None:
    """megatron-core's ``write_preloaded_data_multiproc`` without processes: the buckets (one file
    each) are written one after another here; the results go to the same queue in the same form."""
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    results: dict[int, Any] = {}
    for index, bucket in enumerate(write_buckets):
        local_results: queue.Queue = queue.Queue()
        count: queue.Queue = queue.Queue()
        count.put(index)
        FileSystemWriterAsync.write_preloaded_data(transform_list, index, bucket, local_results, count,
                                                   True, use_msc=use_msc)
        _, outcome = local_results.get_nowait()
        if isinstance(outcome, Exception):
            global_results_queue.put(outcome)
            return
        results[index] = outcome
        written.append(str(bucket[0]))
    global_results_queue.put(results)


@contextlib.contextmanager
def in_process_writes():
    """During a ``dist_checkpointing.save``: write this rank's files in this process (no Manager,
    no resource tracker, no forked writers); yields the list of the files written."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    writer = filesystem_async.FileSystemWriterAsync
    saved_queue = filesystem_async._get_write_results_queue
    saved_write = writer.__dict__["write_preloaded_data_multiproc"]
    written: list[str] = []
    filesystem_async._get_write_results_queue = queue.Queue
    writer.write_preloaded_data_multiproc = staticmethod(functools.partial(_write_buckets_in_process, written))
    try:
        yield written
    finally:
        filesystem_async._get_write_results_queue = saved_queue
        writer.write_preloaded_data_multiproc = saved_write
