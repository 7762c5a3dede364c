"""The trainer's side of the rlve-gym worker processes (:mod:`.worker`): start, ask, restart, stop.

:class:`RLVEWorkers` owns ``n`` worker processes. Each has its own one-thread executor, so the
requests to one worker are answered in order while the event loop stays free, and nothing here
is bound to a particular event loop. A worker starts on its first request (importing rlve-gym
takes seconds), and again after it died or was killed for running past ``timeout_s``.

Failures are exceptions the adapter maps onto the environment contract:
:class:`WorkerTimeout` (the request took too long: the worker is killed) and :class:`WorkerDied`
(the process went away or could not start). No worker outlives the trainer: each is killed with
its parent by the kernel (``PR_SET_PDEATHSIG``, set by the worker itself) and :meth:`close`
stops them all.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .worker import PARENT_ENV

__all__ = ["RLVEWorkers", "WorkerDied", "WorkerError", "WorkerTimeout"]


class WorkerError(Exception):
    """A worker could not answer."""


class WorkerTimeout(WorkerError):
    """The worker did not answer within the request's timeout (it has been killed)."""


class WorkerDied(WorkerError):
    """The worker process exited, or never became ready."""


class _Worker:
    """One worker process and its line-oriented pipe (used from one thread at a time)."""

    def __init__(self, index: int, *, command: list[str], startup_timeout_s: float, log_path: Path | None):
        self.index = index
        self.command = command
        self.startup_timeout_s = startup_timeout_s
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.buffer = b""
        self.starts = 0
        self.closed = False

    def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self.closed:
            raise WorkerDied(f"rlve worker {self.index} is closed")
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            code = self._reap()
            raise WorkerDied(f"rlve worker {self.index} exited ({code}) before a request") from exc
        return self._read_line(time.monotonic() + timeout_s, what=f"op {message.get('op')!r}")

    def _start(self) -> None:
        self._reap()
        env = {**os.environ, PARENT_ENV: str(os.getpid()),
               "PYTHONHASHSEED": "0",    # problems regenerated in another worker must come out the same
               "OMP_NUM_THREADS": "1"}   # rlve-gym imports torch; the worker needs no threads
        log = open(self.log_path, "ab") if self.log_path is not None else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, env=env)
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        self.buffer = b""
        self.starts += 1
        ready = self._read_line(time.monotonic() + self.startup_timeout_s, what="start-up")
        if not ready.get("ready"):
            self._reap()
            raise WorkerDied(f"rlve worker {self.index} could not start: {ready.get('error', ready)}")

    def _read_line(self, deadline: float, *, what: str) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self._reap()
                raise WorkerTimeout(f"rlve worker {self.index}: no answer to {what} in time")
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                code = self._reap()
                raise WorkerDied(f"rlve worker {self.index} exited ({code}) during {what}"
                                 + (f"; its log: {self.log_path}" if self.log_path else ""))
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def _reap(self) -> int | None:
        """Kill the process if it runs; its exit code (None when there was none)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.kill()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        return proc.wait()

    def kill(self) -> None:
        """From another thread: stop the process (a request in flight sees it exit)."""
        self.closed = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def pid(self) -> int | None:
        return None if self.proc is None or self.proc.poll() is not None else self.proc.pid


class RLVEWorkers:
    """``n`` rlve-gym worker processes; :meth:`call` sends one request to worker ``key % n``.

    ``command`` starts one worker (default: this interpreter running :mod:`.worker`); it must
    print a ``{"ready": true}`` line, then answer each request line with one line.
    """

    def __init__(self, n: int, *, cache_size: int = 256, startup_timeout_s: float = 120.0,
                 log_dir: Path | None = None, command: list[str] | None = None):
        if n < 1:
            raise ValueError(f"need at least one rlve worker, got {n}")
        if log_dir is not None:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
        if command is None:
            command = [sys.executable, "-m", "spade.envs.rlve.worker", "--cache", str(cache_size)]
        self.workers = [_Worker(i, command=list(command), startup_timeout_s=startup_timeout_s,
                                log_path=None if log_dir is None else Path(log_dir) / f"rlve_worker_{i}.log")
                        for i in range(n)]
        self.executors = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rlve-worker-{i}")
                          for i in range(n)]
        self.closed = False

    def __len__(self) -> int:
        return len(self.workers)

    async def call(self, key: int, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self.closed:
            raise WorkerDied("the rlve workers are closed")
        index = key % len(self.workers)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executors[index], self.workers[index].request, message, timeout_s)

    async def start(self) -> None:
        """Start every worker now (concurrently), rather than on its first request."""
        await asyncio.gather(*(self.call(i, {"op": "list"}, self.workers[i].startup_timeout_s)
                               for i in range(len(self.workers))))

    def pids(self) -> list[int]:
        """The process ids of the running workers."""
        return [pid for pid in (w.pid() for w in self.workers) if pid is not None]

    def close(self) -> None:
        """Stop every worker (their queued requests fail with :class:`WorkerDied`)."""
        self.closed = True
        for worker in self.workers:
            worker.kill()
        for executor in self.executors:
            executor.shutdown(wait=True, cancel_futures=True)
        for worker in self.workers:
            worker._reap()
