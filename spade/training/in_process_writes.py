"""megatron-core's checkpoint file writer, run in this process, one tensor in memory at a time.

megatron-core's filesystem writer would otherwise start a ``multiprocessing`` Manager (a spawned
server process plus a resource tracker, which outlive a killed trainer) and fork one writer per
file. ``in_process_writes`` swaps in a sequential writer for the duration of a
``dist_checkpointing.save`` and yields the list of the files this rank wrote.

It also defers each tensor until the moment it is written. megatron-core's writer resolves every
tensor of the save plan up front and copies each one that is a view into a larger storage (the
parameters and the distributed optimizer's state are slices of flat buffers; ``torch.save`` of a
view would write the whole buffer), so a save held a second copy of the training state: +0.75 GB
of peak RSS for SmolLM2-135M in bf16 (``benchmarks/main_job_memory.py``, the checkpoint phase).
Here the plan holds placeholders; the writer resolves one tensor, copies it to a compact CPU tensor
if it has to, writes it and lets it go, so a save adds at most its largest tensor. The files hold
the same tensors in the same order (tests/training/test_checkpoint.py compares the bytes of both ways).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import queue
from typing import Any


class _DeferredDevice:
    type = "deferred"  # not "cpu": megatron-core leaves a tensor it cannot see on the host as it is


class DeferredTensor:
    """A save plan's tensor, resolved by the planner only when the writer reaches it."""

    device = _DeferredDevice()

    def __init__(self, planner: Any, item: Any):
        self.planner = planner
        self.item = item

    def detach(self) -> "DeferredTensor":
        return self

    def to(self, *args: Any, **kwargs: Any) -> "DeferredTensor":  # megatron's host staging: later
        return self

    def materialize(self) -> Any:
        """The tensor as ``torch.save`` must get it: on the host, owning exactly its own bytes."""
        tensor = self.planner.resolve_data(self.item).detach()
        if tensor.device.type != "cpu":
            return tensor.to("cpu")
        if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
            return tensor.clone()  # a view into a larger buffer
        return tensor


class _DeferringPlanner:
    """The save planner as megatron-core's writer sees it while it buckets the plan."""

    def __init__(self, planner: Any):
        self._planner = planner

    def resolve_data(self, item: Any) -> Any:
        from torch.distributed.checkpoint.planner import WriteItemType

        if item.type == WriteItemType.BYTE_IO:
            return self._planner.resolve_data(item)
        return DeferredTensor(self._planner, item)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)


def _write_file(transform_list: list, bucket: Any, use_msc: bool) -> list:
    """One bucket's file: its byte items, then its tensors one by one; fsynced; its write results."""
    from torch.distributed.checkpoint.filesystem import _write_item

    path, storage_key, (bytes_data, tensor_data) = bucket
    extra: dict[str, Any] = {}
    if "serialization_format" in inspect.signature(_write_item).parameters:
        from torch.distributed.checkpoint.filesystem import SerializationFormat

        extra["serialization_format"] = SerializationFormat.TORCH_SAVE
    if use_msc:
        import multistorageclient as msc

        opener = msc.open
    else:
        opener = open
    results = []
    with opener(path, "wb") as stream:
        for item, data in bytes_data:
            results.append(_write_item(*transform_list, stream, data, item, storage_key, **extra))
        for item, data in tensor_data:
            tensor = data.materialize() if isinstance(data, DeferredTensor) else data
            results.append(_write_item(*transform_list, stream, tensor, item, storage_key, **extra))
            del tensor
        if use_msc:
            stream.fsync()
        else:
            stream.flush()
            os.fsync(stream.fileno())
    return results


def _write_buckets_in_process(written: list[str], transform_list: list, use_msc: bool, rank: int,
                              write_buckets: list, global_results_queue: Any) -> None:
    """megatron-core's ``write_preloaded_data_multiproc`` without processes: the buckets (one file
    each) are written one after another here; the results go to the same queue in the same form."""
    results: dict[int, Any] = {}
    for index, bucket in enumerate(write_buckets):
        try:
            results[index] = _write_file(transform_list, bucket, use_msc)
        except Exception as exc:  # noqa: BLE001  (megatron-core reports a writer's failure this way)
            global_results_queue.put(exc)
            return
        written.append(str(bucket[0]))
    global_results_queue.put(results)


@contextlib.contextmanager
def in_process_writes(*, defer_tensors: bool = True):
    """During a ``dist_checkpointing.save``: write this rank's files in this process (no Manager,
    no resource tracker, no forked writers), each tensor resolved only when it is written
    (``defer_tensors``); yields the list of the files written."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    writer = filesystem_async.FileSystemWriterAsync
    saved_queue = filesystem_async._get_write_results_queue
    saved_write = writer.__dict__["write_preloaded_data_multiproc"]
    saved_prepare = writer.__dict__["prepare_write_data"]
    written: list[str] = []

    def prepare_write_data(self: Any, plan: Any, planner: Any) -> None:
        return saved_prepare(self, plan, _DeferringPlanner(planner))

    filesystem_async._get_write_results_queue = queue.Queue
    writer.write_preloaded_data_multiproc = staticmethod(functools.partial(_write_buckets_in_process, written))
    if defer_tensors:
        writer.prepare_write_data = prepare_write_data
    try:
        yield written
    finally:
        filesystem_async._get_write_results_queue = saved_queue
        writer.write_preloaded_data_multiproc = saved_write
        writer.prepare_write_data = saved_prepare
