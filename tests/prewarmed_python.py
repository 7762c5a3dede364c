"""Run as ``python -S tests/prewarmed_python.py SOCKET PYTHON-ARGS...`` by the executable that
``tests/prewarmed.py``'s ``python()`` writes: a stand-in for the Python interpreter whose command
runs forked from the prewarmed interpreter listening on SOCKET.

It hands its standard streams, working directory, environment and command line to the zygote,
which forks a child to run the command (or answers ``fresh``: then this process becomes
``sys.executable`` with the same arguments, as it also does when the zygote cannot be reached).
Until the child ends, this process stands for it: signals sent to it (or its group) go to the
child's process group (one that arrives before the child's pid is known is held until then), and
it ends as the child ended (same exit status, or killed by the same signal). If this process is
killed outright, the zygote sees its connection close and kills the child's group a few
milliseconds later, so whatever started it still has every process it launched under its control.

Only the standard library, and ``-S`` skips ``site``: this process adds a few milliseconds.
"""

import json
import os
import signal
import socket
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _start(path: str, argv: list[str]) -> tuple[socket.socket, int] | None:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.connect(path)
        request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        socket.send_fds(connection, [request], [0, 1, 2])
        reply = connection.recv(64).decode()
    except OSError:
        return None
    return (connection, int(reply.split()[1])) if reply.startswith("pid ") else None


class _Forwarder:
    """Signal handlers installed before the child exists: a signal that arrives before its pid is
    known is held and sent once it is."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.held: list[int] = []
        for signum in FORWARDED:
            signal.signal(signum, self.handle)

    def handle(self, signum: int, frame) -> None:
        if self.pid is None:
            self.held.append(signum)
            return
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def start(self, pid: int) -> None:
        self.pid = pid
        while self.held:
            self.handle(self.held.pop(0), None)

    def give_up(self) -> None:
        """Back to the default dispositions, and the held signals delivered to this process."""
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_DFL)
        for signum in self.held:
            os.kill(os.getpid(), signum)


def main() -> None:
    path, argv = sys.argv[1], sys.argv[2:]
    forwarder = _Forwarder()
    started = _start(path, argv)
    if started is None:
        forwarder.give_up()
        os.execv(sys.executable, [sys.executable, *argv])
    connection, pid = started
    forwarder.start(pid)
    reply = connection.recv(64).decode()
    if not reply.startswith("exit "):
        sys.exit(f"the prewarmed interpreter lost the command {argv}: {reply!r}")
    code = int(reply.split()[1])
    if code < 0:  # end as the child did, killed by the same signal
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
