"""Supervise one rollout-server subprocess (an SGLang server in production).

``ServerLauncher`` starts the server in its own process group (its own session) with stdout and
stderr appended to a log file, waits until ``GET http://host:port<health_path>`` answers 200, and
stops it by signalling the whole group (SIGTERM, then SIGKILL after a grace period), so worker
processes the server forks (SGLang's schedulers, detokenizer, TP workers) go with it. A failed start
(timeout or early exit) raises ``ServerStartError`` carrying the last lines of the log; an early
exit is reported as soon as it happens, not after the full timeout. ``watch(on_death)`` runs a
task that notices an unexpected death of a server that had become healthy, kills what is left of its
process group and awaits ``on_death(returncode, log_tail)``: the engine's hook to ``restart()`` the
server, re-send the weights and retry in-flight requests.

Only the standard library is used (asyncio subprocesses and streams for the HTTP probe).

``sglang_argv`` builds the ``python -m sglang.launch_server`` command line. Its flags were checked
against the source of the pinned release, the ``sglang==0.5.23`` wheel (see ``sglang_argv``);
SGLang renames and retires flags between releases, so check them again when the pin moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence, Union

from ...process_group import kill_group

OnDeath = Callable[[int, str], Awaitable[None]]

TAIL_LINES = 40


class ServerStartError(RuntimeError):
    """The server did not become healthy: it exited early or the health check timed out."""

    def __init__(self, message: str, *, returncode: Optional[int], log_tail: str):
        super().__init__(f"{message}\n--- last lines of the server log ---\n{log_tail}")
        self.returncode = returncode
        self.log_tail = log_tail


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it; another process could still take it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def read_log_tail(path: Union[str, Path], lines: int = TAIL_LINES, max_bytes: int = 256 * 1024) -> str:
    """The last ``lines`` lines of a (possibly large, possibly binary-ish) log file."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except FileNotFoundError:
        return "(no log file)"
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


async def http_get_status(host: str, port: int, path: str, timeout_s: float = 2.0) -> Optional[int]:
    """The HTTP status code of ``GET path``, or None when the server does not answer."""
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
        request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
        writer.write(request.encode("ascii"))
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout_s)
        parts = line.decode("latin-1").split()
        if len(parts) >= 2 and parts[0].startswith("HTTP/") and parts[1].isdigit():
            return int(parts[1])
        return None
    except (OSError, asyncio.TimeoutError, ConnectionError):
        return None
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def _die_with_parent() -> None:
    """In the server, before exec (Linux): SIGKILL when the process that launched it dies, so a
    trainer killed outright does not leave a server holding GPU memory. SGLang's own worker
    processes die with the server's main process in the same way."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class ServerLauncher:
    """Start, health-check, watch, stop and restart one server subprocess on a fixed port."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int,
        health_path: str = "/health",
        start_timeout_s: float = 600.0,
        log_path: Union[str, Path],
        env: Optional[Mapping[str, str]] = None,
        inherit_env: bool = True,
        poll_interval_s: float = 0.2,
        probe_timeout_s: float = 2.0,
    ):
        if not argv:
            raise ValueError("argv is empty")
        self.argv = [str(a) for a in argv]
        self.host = host
        self.port = int(port)
        self.health_path = health_path if health_path.startswith("/") else "/" + health_path
        self.start_timeout_s = float(start_timeout_s)
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self.inherit_env = inherit_env  # False: ``env`` is the whole environment
        self.poll_interval_s = poll_interval_s
        self.probe_timeout_s = probe_timeout_s
        self._proc: Optional[asyncio.subprocess.Process] = None
        self._generation = 0
        self._healthy: set[int] = set()  # generations that passed the health check
        self._intentional: set[int] = set()  # generations we stopped ourselves
        self._new_proc = asyncio.Event()
        self._lock = asyncio.Lock()
        self._closed = False

    # ---- queries ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> Optional[int]:
        return self._proc.returncode if self._proc is not None else None

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    def log_tail(self, lines: int = TAIL_LINES) -> str:
        return read_log_tail(self.log_path, lines)

    async def health(self) -> bool:
        status = await http_get_status(self.host, self.port, self.health_path, self.probe_timeout_s)
        return status == 200

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Spawn the server and wait until it is healthy; ``ServerStartError`` if it is not."""
        async with self._lock:
            await self._start_locked()

    async def _start_locked(self) -> None:
        if self.is_alive():
            raise RuntimeError(f"server already running (pid {self.pid})")
        self._closed = False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"=== spade: {stamp} starting: {' '.join(self.argv)}\n".encode())
            log.flush()
            if not self.inherit_env:
                env = dict(self.env or {})
            else:
                env = {**os.environ, **self.env} if self.env is not None else None
            proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env=env, start_new_session=True, preexec_fn=_die_with_parent)
        self._generation += 1
        generation = self._generation
        self._proc = proc
        previous, self._new_proc = self._new_proc, asyncio.Event()
        previous.set()
        try:
            await self._wait_healthy(proc, self.start_timeout_s)
        except BaseException:
            self._intentional.add(generation)
            await self._terminate(proc, grace_s=2.0)
            raise
        self._healthy.add(generation)

    async def _wait_healthy(self, proc: asyncio.subprocess.Process, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.returncode is not None:
                raise ServerStartError(
                    f"server exited with code {proc.returncode} before becoming healthy "
                    f"({self.url}{self.health_path})", returncode=proc.returncode, log_tail=self.log_tail())
            if await self.health():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerStartError(
                    f"server not healthy at {self.url}{self.health_path} after {timeout_s:.1f} s",
                    returncode=proc.returncode, log_tail=self.log_tail())
            # Sleep, but wake up at once if the process exits.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), min(self.poll_interval_s, remaining))

    async def wait_healthy(self, timeout_s: Optional[float] = None) -> None:
        """Wait until the running server answers 200 on the health path (e.g. after a resume)."""
        if self._proc is None:
            raise RuntimeError("server not started")
        await self._wait_healthy(self._proc, self.start_timeout_s if timeout_s is None else timeout_s)

    async def _terminate(self, proc: asyncio.subprocess.Process, grace_s: float) -> None:
        pgid = proc.pid  # start_new_session: the server leads its own process group
        kill_group(pgid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except asyncio.TimeoutError:
            pass
        # Whether or not the leader went quietly, nothing of the group may outlive it.
        kill_group(pgid, signal.SIGKILL)
        await proc.wait()

    async def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the whole process group, SIGKILL it after ``grace_s``; idempotent."""
        async with self._lock:
            await self._stop_locked(grace_s)

    async def _stop_locked(self, grace_s: float) -> None:
        proc = self._proc
        if proc is None:
            return
        self._intentional.add(self._generation)
        await self._terminate(proc, grace_s)

    async def restart(self, grace_s: float = 10.0) -> None:
        """Stop (if running) and start again on the same port."""
        async with self._lock:
            await self._stop_locked(grace_s)
            await self._start_locked()

    async def close(self, grace_s: float = 10.0) -> None:
        """Stop the server and end any ``watch`` task."""
        self._closed = True
        await self.stop(grace_s)
        self._new_proc.set()

    # ---- death detection -------------------------------------------------------------------
    def watch(self, on_death: OnDeath) -> "asyncio.Task[None]":
        """A task that awaits ``on_death(returncode, log_tail)`` whenever a healthy server dies on
        its own (not through ``stop``/``restart``), after killing the rest of its process group.
        It keeps watching the servers started later (e.g. by ``on_death`` calling ``restart``)
        until ``close()`` or cancellation."""
        return asyncio.get_running_loop().create_task(self._watch_loop(on_death), name="server-watch")

    async def _watch_loop(self, on_death: OnDeath) -> None:
        while not self._closed:
            proc, generation, changed = self._proc, self._generation, self._new_proc
            if proc is None:
                await changed.wait()
                continue
            returncode = await proc.wait()
            if generation in self._healthy and generation not in self._intentional and not self._closed:
                self._intentional.add(generation)  # report each death once
                kill_group(proc.pid, signal.SIGKILL)
                await on_death(returncode, self.log_tail())
            if self._generation == generation and not self._closed:
                await changed.wait()


def _flag(key: str) -> str:
    return key if key.startswith("--") else "--" + key.replace("_", "-")


def extra_argv(extra_args: Union[Mapping[str, Any], Sequence[str], None]) -> list[str]:
    """Pass-through flags: ``{"foo_bar": 3}`` -> ``--foo-bar 3``; ``True`` -> bare ``--foo-bar``;
    ``False``/``None`` -> omitted; a list/tuple -> ``--key v1 v2``; a dict -> its JSON. A list of
    strings is passed through verbatim."""
    if extra_args is None:
        return []
    if not isinstance(extra_args, Mapping):
        return [str(a) for a in extra_args]
    out: list[str] = []
    for key, value in extra_args.items():
        if value is None or value is False:
            continue
        if value is True:
            out.append(_flag(key))
        elif isinstance(value, (list, tuple)):
            out += [_flag(key), *(str(v) for v in value)]
        elif isinstance(value, Mapping):
            out += [_flag(key), json.dumps(value)]
        else:
            out += [_flag(key), str(value)]
    return out


def sglang_argv(
    model_path: Union[str, Path],
    *,
    tp: int = 1,
    ep: int = 1,
    dp: int = 1,
    mem_fraction: float = 0.8,
    port: int,
    host: str = "127.0.0.1",
    extra_args: Union[Mapping[str, Any], Sequence[str], None] = None,
    python: str = sys.executable,
    command: Optional[Sequence[str]] = None,
    return_routed_experts: bool = False,
) -> list[str]:
    """The ``python -m sglang.launch_server`` command line for one colocated rollout server
    (``command``, when given, replaces ``python -m sglang.launch_server``: a wrapper, the tests'
    stand-in).

    ``--enable-memory-saver`` lets the trainer release / resume the server's GPU memory (weights and
    KV cache) around train steps; ``--skip-tokenizer-init`` because spade sends and receives token
    ids only. ``python`` is the interpreter of the environment SGLang is installed in.

    Checked against ``sglang==0.5.23``: in that release ``ServerArgs`` is assembled from the
    namespace classes in ``sglang/srt/arg_groups/fields/`` and every field ``x_y`` becomes the flag
    ``--x-y`` (``arg_groups/arg_utils.py``; a ``bool`` field is a bare ``store_true`` flag):
    ``--model-path`` (``model.py``), ``--tp-size``, ``--ep-size``, ``--dp-size`` (``parallel.py``),
    ``--mem-fraction-static`` (``schedule.py``), ``--enable-memory-saver`` (``exec_.py``),
    ``--host``, ``--port``, ``--skip-tokenizer-init`` (``serving.py``), and ``--base-gpu-id``
    (``device.py``), which the deployment passes in ``extra_args``. ``tests/rollout/test_sglang_upstream.py``
    parses the command line of every SGLang recipe with that release's own ``ServerArgs`` parser. ``python -m
    sglang.launch_server`` still works in 0.5.23 (it warns that ``sglang serve`` is the
    recommended entry point). Keep ``dp == 1`` when weights are synced: 0.5.23 refuses
    ``/init_weights_update_group`` and ``/update_weights_from_*`` on a server with ``--dp-size``
    above 1. ``return_routed_experts`` (``loss.routing_replay: rollout``) adds
    ``--enable-return-routed-experts`` (``exec_.py``): the server can then answer requests with their
    routed experts (``protocol``'s docstring).
    """
    argv = [
        *(command or (python, "-m", "sglang.launch_server")),
        "--model-path", str(model_path),
        "--tp-size", str(int(tp)),
        "--ep-size", str(int(ep)),
        "--dp-size", str(int(dp)),
        "--mem-fraction-static", repr(float(mem_fraction)),
        "--enable-memory-saver",
        "--port", str(int(port)),
        "--host", host,
        "--skip-tokenizer-init",
    ]
    if return_routed_experts:
        argv.append("--enable-return-routed-experts")
    return argv + extra_argv(extra_args)
