"""One sandbox (a bubblewrap process with a zygote inside) as seen from the supervisor.

The supervisor holds a SOCK_SEQPACKET socket to each zygote: ``spawn`` requests go out,
``spawned`` records come back carrying the new child's socket, and ``exited`` records report how
every child ended. A sandbox whose zygote stops answering is killed whole and replaced.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
import signal
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from .config import SandboxConfig
from .launcher import plan_launch
from .runtime import framing, host_modules

RECORD_BYTES = 1 << 16


def host_module_sources() -> dict[str, str]:
    """The source of each module the sandbox shares with the trainer (:mod:`.runtime.host_modules`),
    read from this installation's package, for the zygote's start record."""
    sources = {}
    for name, module in host_modules.SHARED:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        with open(spec.origin, encoding="utf-8") as handle:
            sources[name] = handle.read()
    return sources
STDERR_TAIL_BYTES = 4_096


class SandboxDied(Exception):
    """The sandbox process or its zygote went away (an infrastructure fault)."""


@dataclass(frozen=True)
class ChildExit:
    signal: int | None
    code: int | None


class Sandbox:
    def __init__(self, index: int, config: SandboxConfig):
        self.index = index
        self.config = config
        self.process: asyncio.subprocess.Process | None = None
        self.channel: socket.socket | None = None
        self.hello: dict[str, Any] = {}
        self.tmp_probe = f"/tmp/spade-probe-{uuid.uuid4().hex}"
        self.readable_paths: tuple[str, ...] = ()
        self.bubblewrap = False
        self.alive = False
        self.live_envs = 0
        self.stderr_tail = b""
        self._ids = itertools.count()
        self._hello: asyncio.Future[dict[str, Any]] | None = None
        self._spawns: dict[int, asyncio.Future[tuple[int, socket.socket]]] = {}
        self._exits: dict[int, ChildExit] = {}
        self._exit_waiters: dict[int, asyncio.Future[ChildExit]] = {}
        self._stderr_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        plan = plan_launch(self.config, theirs.fileno())
        self.readable_paths = plan.readable_paths
        self.bubblewrap = plan.bubblewrap
        try:
            self.process = await asyncio.create_subprocess_exec(
                *plan.argv, pass_fds=(theirs.fileno(),), env=plan.env, cwd="/",
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
        finally:
            theirs.close()
        self.channel = ours
        ours.setblocking(False)
        self.alive = True
        self._hello = loop.create_future()
        loop.add_reader(ours.fileno(), self._on_readable)
        self._stderr_task = asyncio.create_task(self._collect_stderr())
        limits = self.config.child_limits(self.readable_paths)
        try:  # a bubblewrap that cannot set up the sandbox has exited by now: say what it said
            self._send({"limits": limits.to_json(), "warm_children": self.config.warm_children,
                        "tmp_probe": self.tmp_probe, "probe_filesystem": self.bubblewrap,
                        "host_modules": host_module_sources(), "numpy_site": plan.numpy_site})
            self.hello = await asyncio.wait_for(self._hello, self.config.start_timeout_s)
        except (asyncio.TimeoutError, SandboxDied):
            await self.destroy()
            raise SandboxDied(f"sandbox {self.index} did not start: {self.describe_stderr()}") from None

    def describe_stderr(self) -> str:
        text = self.stderr_tail.decode("utf-8", "replace").strip()
        return text[-1_000:] if text else "(no output)"

    async def _collect_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        while True:
            chunk = await self.process.stderr.read(4_096)
            if not chunk:
                break
            self.stderr_tail = (self.stderr_tail + chunk)[-STDERR_TAIL_BYTES:]
        await self.process.wait()
        self._mark_dead()

    def _send(self, message: dict[str, Any]) -> None:
        if not self.alive or self.channel is None:
            raise SandboxDied(f"sandbox {self.index} is not running")
        try:
            self.channel.send(framing.encode(message))
        except OSError as exc:
            self._mark_dead()
            raise SandboxDied(f"sandbox {self.index}: {exc}") from None

    def _on_readable(self) -> None:
        assert self.channel is not None
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.channel, RECORD_BYTES, 1)
            except BlockingIOError:
                return
            except OSError:
                self._mark_dead()
                return
            if not data:
                self._mark_dead()
                return
            try:
                message = framing.decode_payload(data[framing.HEADER.size:])
            except framing.FrameError:
                for fd in fds:
                    os.close(fd)
                self._mark_dead()
                return
            self._dispatch(message, fds)

    def _dispatch(self, message: dict[str, Any], fds: list[int]) -> None:
        op = message.get("op")
        if op == "hello" and self._hello is not None and not self._hello.done():
            self._hello.set_result(message)
        elif op == "spawned" and fds:
            waiter = self._spawns.pop(message.get("id"), None)
            sock = socket.socket(fileno=fds[0])
            if waiter is None or waiter.done():
                sock.close()
            else:
                waiter.set_result((int(message["pid"]), sock))
        elif op == "exited":
            status = ChildExit(message.get("signal"), message.get("code"))
            pid = message.get("pid")
            waiter = self._exit_waiters.pop(pid, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(status)
            else:
                self._exits[pid] = status
                if len(self._exits) > 10_000:
                    self._exits.pop(next(iter(self._exits)))
        else:
            for fd in fds:
                os.close(fd)

    def _mark_dead(self) -> None:
        if not self.alive:
            return
        self.alive = False
        if self.channel is not None:
            try:
                asyncio.get_running_loop().remove_reader(self.channel.fileno())
            except (RuntimeError, ValueError):
                pass
        error = SandboxDied(f"sandbox {self.index} died: {self.describe_stderr()}")
        for future in [self._hello, *self._spawns.values(), *self._exit_waiters.values()]:
            if future is not None and not future.done():
                future.set_exception(error)
                future.exception()  # a waiter may have timed out already; do not warn
        self._spawns.clear()
        self._exit_waiters.clear()
        if self.process is not None and self.process.returncode is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def spawn(self) -> tuple[int, socket.socket]:
        request_id = next(self._ids)
        future: asyncio.Future[tuple[int, socket.socket]] = asyncio.get_running_loop().create_future()
        self._spawns[request_id] = future
        self._send({"op": "spawn", "id": request_id})
        try:
            return await asyncio.wait_for(future, self.config.start_timeout_s)
        except asyncio.TimeoutError:
            self._spawns.pop(request_id, None)
            await self.destroy()
            raise SandboxDied(f"sandbox {self.index}: the zygote did not fork in time") from None

    def kill(self, pid: int) -> None:
        if self.alive:
            self._send({"op": "kill", "pid": pid})

    async def wait_exit(self, pid: int, timeout: float) -> ChildExit | None:
        if pid in self._exits:
            return self._exits.pop(pid)
        if not self.alive:
            return None
        future: asyncio.Future[ChildExit] = asyncio.get_running_loop().create_future()
        self._exit_waiters[pid] = future
        try:
            return await asyncio.wait_for(future, timeout)
        except (asyncio.TimeoutError, SandboxDied):
            self._exit_waiters.pop(pid, None)
            return None

    def forget_exit(self, pid: int) -> None:
        self._exits.pop(pid, None)

    async def destroy(self) -> None:
        self._mark_dead()
        if self.process is not None:
            try:
                await asyncio.wait_for(self.process.wait(), 5)
            except asyncio.TimeoutError:
                pass
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self._stderr_task is not None:
            # the process is gone: its stderr ends now; keep its last words for the error message
            await asyncio.wait({self._stderr_task}, timeout=2)
            self._stderr_task.cancel()
