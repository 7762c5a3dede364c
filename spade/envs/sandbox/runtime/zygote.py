"""The zygote: a warm Python inside one sandbox that forks one hardened child per environment.

Forking here, from a small process whose modules are already imported, is what keeps
instantiation at a few milliseconds no matter how much memory the trainer holds. The zygote runs
no generated code. It speaks to the supervisor over a SOCK_SEQPACKET socket: one frame per record,
and each new child's socket travels with its ``spawned`` record (SCM_RIGHTS), so the supervisor then
talks to the child directly. It keeps a few children forked and hardened ahead of demand, kills
children on request, and reports every exit status, which is how the supervisor tells a seccomp
kill from a segfault from ``os._exit``.

With ``sandbox.offer_numpy`` the start record names the folder numpy is mounted in; the zygote
imports numpy (and ``numpy.random``) from there before any fork, with one BLAS thread
(:data:`BLAS_THREAD_VARIABLES`, set before numpy's OpenBLAS loads: a child cannot start threads,
``clone`` is fatal under seccomp, and threads started here would not exist in a forked child); the
variables are removed again once read. The folder is on ``sys.path`` only for that import. A numpy
that does not import stops the sandbox.
"""

from __future__ import annotations

import errno
import importlib
import os
import selectors
import signal
import socket
import sys
from typing import Any

from . import child, framing, host_modules, landlock
from .limits import ChildLimits

NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")
RECORD_BYTES = 1 << 16
_ALWAYS_PRELOAD = ("inspect", "traceback", "json", "dataclasses", "typing", "random", "collections")
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


class Zygote:
    def __init__(self, channel: socket.socket):
        self.channel = channel
        self.selector = selectors.DefaultSelector()
        self.idle: list[tuple[int, socket.socket]] = []
        self.live: set[int] = set()
        config = self._recv()
        if config is None:
            sys.exit(0)
        self.limits = ChildLimits.from_json(config["limits"])
        self.warm_children = int(config.get("warm_children", 2))
        self.tmp_probe = str(config.get("tmp_probe", ""))
        self.probe_filesystem = bool(config.get("probe_filesystem", False))
        self.hardening_failures = 0
        if config.get("numpy_site"):
            _import_numpy(str(config["numpy_site"]))
        _preload(self.limits.allowed_imports)
        host_modules.install(config.get("host_modules") or {})  # before any fork: children inherit them

    def _recv(self) -> dict[str, Any] | None:
        record = self.channel.recv(RECORD_BYTES)
        if not record:
            return None
        return framing.decode_payload(record[framing.HEADER.size:])

    def _send(self, message: dict[str, Any], fd: int | None = None) -> None:
        frame = framing.encode(message)
        if fd is None:
            self.channel.send(frame)
        else:
            socket.send_fds(self.channel, [frame], [fd])

    def serve(self) -> None:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        os.set_blocking(wake_read, False)
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(self.channel, selectors.EVENT_READ, "channel")
        self.selector.register(wake_read, selectors.EVENT_READ, "wakeup")
        self._send({"op": "hello", **self._facts()})
        self._top_up()
        while True:
            for key, _ in self.selector.select():
                if key.data == "wakeup":
                    _drain(wake_read)
                    self._reap()
                elif not self._handle_request():
                    self._shutdown()
                    return
            self._top_up()

    def _handle_request(self) -> bool:
        try:
            request = self._recv()
        except OSError:
            return False
        if request is None:
            return False
        op = request.get("op")
        if op == "spawn":
            pid, parent_end = self.idle.pop(0) if self.idle else self._fork()
            self._send({"op": "spawned", "id": request.get("id"), "pid": pid}, parent_end.fileno())
            parent_end.close()
        elif op == "kill":
            pid = request.get("pid")
            if pid in self.live:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return True

    def _fork(self) -> tuple[int, socket.socket]:
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            child.run(child_end, self.limits)
        child_end.close()
        self.live.add(pid)
        return pid, parent_end

    def _top_up(self) -> None:
        while len(self.idle) < self.warm_children:
            self.idle.append(self._fork())

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.live.discard(pid)
            stale = [entry for entry in self.idle if entry[0] == pid]
            for entry in stale:
                self.idle.remove(entry)
                entry[1].close()
            report: dict[str, Any] = {"op": "exited", "pid": pid, "signal": None, "code": None}
            if os.WIFSIGNALED(status):
                report["signal"] = os.WTERMSIG(status)
            else:
                report["code"] = os.waitstatus_to_exitcode(status)
                if report["code"] == child.EXIT_HARDENING_FAILED:
                    self._count_hardening_failure()
            self._send(report)

    def _count_hardening_failure(self) -> None:
        # Children that cannot lock themselves down would be forked again and again: stop warming.
        self.hardening_failures += 1
        if self.hardening_failures >= 3:
            self.warm_children = 0

    def _shutdown(self) -> None:
        for pid in list(self.live):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "pid": os.getpid(),
            "uid": os.getuid(),
            "gid": os.getgid(),
            "namespaces": {},
            "landlock_abi": landlock.abi_version(),
            "environ": sorted(os.environ),
        }
        for name in NAMESPACES:
            try:
                facts["namespaces"][name] = os.stat(f"/proc/self/ns/{name}").st_ino
            except OSError:
                facts["namespaces"][name] = None
        try:
            facts["interfaces"] = [name for _, name in socket.if_nameindex()]
        except OSError:
            facts["interfaces"] = None
        if self.probe_filesystem:  # only inside bubblewrap: outside, these writes would be real
            facts["system_read_only"] = _write_fails(os.path.join(sys.base_prefix, ".spade-probe"))
            facts["tmp_written"] = bool(self.tmp_probe) and not _write_fails(self.tmp_probe)
        return facts


def _write_fails(path: str) -> bool:
    try:
        with open(path, "w") as handle:
            handle.write("probe")
    except OSError as exc:
        return exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT)
    return False


def _import_numpy(site: str) -> None:
    os.environ.update(dict.fromkeys(BLAS_THREAD_VARIABLES, "1"))
    sys.path.insert(0, site)
    try:
        importlib.import_module("numpy")
        importlib.import_module("numpy.random")
    finally:
        sys.path.remove(site)
        for name in BLAS_THREAD_VARIABLES:  # read once, as the libraries loaded: the environment stays clean
            os.environ.pop(name, None)


def _preload(modules: tuple[str, ...]) -> None:
    for name in (*_ALWAYS_PRELOAD, *modules):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a missing optional module only costs speed
            pass


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def main(channel_fd: int) -> None:
    channel = socket.socket(fileno=channel_fd)
    Zygote(channel).serve()
