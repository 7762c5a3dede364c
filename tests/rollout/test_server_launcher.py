"""ServerLauncher against a real subprocess.

The server here is a stand-in: a small ``http.server`` script written by the test, a test double for
SGLang (which cannot run without a GPU). It serves ``/health`` (503 until a configurable delay has
passed, or until a file the test creates exists, then 200), can exit at once or crash after N
seconds with a chosen code, can fork a child that ignores SIGTERM (to check that the whole process
group is stopped), and logs lines (every request with its status) to stdout.

Orderings are driven by events (the health file appears only after the log shows a refused probe),
and upper time limits are generous deadlines far from the expected times, not windows a busy
machine could miss.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from spade.rollout.sglang.launcher import (
    ServerLauncher,
    ServerStartError,
    extra_argv,
    free_port,
    http_get_status,
    sglang_argv,
)

pytestmark = pytest.mark.timeout(60)

STANDIN = r'''
import argparse, os, signal, subprocess, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--port", type=int, required=True)
p.add_argument("--health-delay", type=float, default=0.0)
p.add_argument("--health-file", default=None)
p.add_argument("--crash-after", type=float, default=None)
p.add_argument("--crash-code", type=int, default=7)
p.add_argument("--exit-at-start", type=int, default=None)
p.add_argument("--child-pid-file", default=None)
p.add_argument("--ignore-sigterm", action="store_true")
a = p.parse_args()

def log(msg):
    print(f"standin[{os.getpid()}]: {msg}", flush=True)

for i in range(60):
    log(f"warming up line {i}")
if a.exit_at_start is not None:
    log("fatal: boom (exit at start)")
    sys.exit(a.exit_at_start)
if a.ignore_sigterm:
    signal.signal(signal.SIGTERM, lambda *_: log("ignoring SIGTERM"))
if a.child_pid_file:
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    with open(a.child_pid_file, "w") as f:
        f.write(str(child.pid))
    log(f"spawned child {child.pid}")

t0 = time.monotonic()

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        ready = time.monotonic() - t0 >= a.health_delay and (a.health_file is None or os.path.exists(a.health_file))
        code = 200 if (self.path == "/health" and ready) else (503 if self.path == "/health" else 404)
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, fmt, *args):
        log("request " + (fmt % args))

if a.crash_after is not None:
    def crash():
        time.sleep(a.crash_after)
        log(f"crashing with code {a.crash_code}")
        os._exit(a.crash_code)
    threading.Thread(target=crash, daemon=True).start()

server = ThreadingHTTPServer((a.host, a.port), H)
log(f"listening on {a.host}:{a.port}")
server.serve_forever()
'''


@pytest.fixture
def standin(tmp_path: Path):
    script = tmp_path / "standin_server.py"
    script.write_text(STANDIN)

    def make(*args: str, start_timeout_s: float = 10.0, port: int | None = None) -> ServerLauncher:
        port = port or free_port()
        argv = [sys.executable, str(script), "--port", str(port), *args]
        return ServerLauncher(argv, host="127.0.0.1", port=port, start_timeout_s=start_timeout_s,
                              log_path=tmp_path / "logs" / "server.log", poll_interval_s=0.05)

    return make


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie whose new parent has not reaped it yet is dead too
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return True


async def _until(cond, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.05)
    return cond()


def test_start_waits_for_health_then_stop(standin, tmp_path):
    async def main():
        healthy_file = tmp_path / "healthy"
        launcher = standin("--health-file", str(healthy_file))
        starting = asyncio.ensure_future(launcher.start())
        # the server answered a probe with 503: start() must still be waiting
        assert await _until(lambda: '"GET /health HTTP/1.1" 503' in launcher.log_tail(), timeout_s=30)
        assert not starting.done()
        healthy_file.touch()
        await asyncio.wait_for(starting, 30)
        assert '"GET /health HTTP/1.1" 200' in launcher.log_tail()
        assert launcher.is_alive() and await launcher.health()
        await launcher.wait_healthy(timeout_s=1)
        assert await http_get_status("127.0.0.1", launcher.port, "/nope") == 404
        with pytest.raises(RuntimeError, match="already running"):
            await launcher.start()
        pid = launcher.pid
        await launcher.stop(grace_s=5)
        assert not launcher.is_alive() and _dead(pid)
        assert "listening on" in launcher.log_tail()
        await launcher.stop()  # idempotent

    asyncio.run(main())


def test_health_never_comes_raises_with_tail_and_kills(standin):
    async def main():
        launcher = standin("--health-delay", "1000", start_timeout_s=1.5)
        t0 = time.monotonic()
        with pytest.raises(ServerStartError) as info:
            await asyncio.wait_for(launcher.start(), 30)  # gives up at its timeout, not later
        assert time.monotonic() - t0 >= 1.5  # and not before it
        err = info.value
        assert "not healthy" in str(err) and "after 1.5 s" in str(err)
        assert "request" in err.log_tail and "/health" in err.log_tail  # the 503 probes were logged
        assert len(err.log_tail.splitlines()) <= 40
        assert not launcher.is_alive() and _dead(launcher.pid)

    asyncio.run(main())


def test_early_exit_reported_at_once(standin):
    async def main():
        launcher = standin("--exit-at-start", "3", start_timeout_s=3600)
        with pytest.raises(ServerStartError) as info:
            # the exit is noticed, not the start timeout: a wait for the timeout would be cut off here
            await asyncio.wait_for(launcher.start(), 45)
        assert info.value.returncode == 3 and "exited with code 3" in str(info.value)
        assert "fatal: boom" in info.value.log_tail and "fatal: boom" in str(info.value)
        assert "warming up line 59" in info.value.log_tail
        assert "warming up line 10" not in info.value.log_tail  # only the tail

    asyncio.run(main())


def test_death_detected_and_restart_from_callback(standin, tmp_path):
    async def main():
        launcher = standin("--crash-after", "1.0", "--crash-code", "7")
        deaths: list[tuple[int, str]] = []
        restarted = asyncio.Event()

        async def on_death(returncode: int, tail: str) -> None:
            deaths.append((returncode, tail))
            if len(deaths) == 1:
                # the engine's recovery path: bring the server back (it will crash again later)
                launcher.argv[launcher.argv.index("--crash-after") + 1] = "1000"
                await launcher.restart(grace_s=1)
                restarted.set()

        await launcher.start()
        first_pid = launcher.pid
        task = launcher.watch(on_death)
        await asyncio.wait_for(restarted.wait(), 10)
        assert deaths[0][0] == 7 and "crashing with code 7" in deaths[0][1]
        assert launcher.pid != first_pid and launcher.is_alive() and await launcher.health()
        # a deliberate stop is not a death
        await launcher.close(grace_s=2)
        await asyncio.wait_for(task, 5)
        assert len(deaths) == 1

    asyncio.run(main())


def test_restart_same_port(standin):
    async def main():
        launcher = standin()
        await launcher.start()
        pid, port = launcher.pid, launcher.port
        deaths = []

        async def on_death(rc, tail):
            deaths.append(rc)

        task = launcher.watch(on_death)
        await launcher.restart(grace_s=2)
        assert launcher.port == port and launcher.pid != pid and _dead(pid)
        assert await http_get_status("127.0.0.1", port, "/health") == 200
        # the watcher follows the new process: kill it from outside and it is reported
        os.kill(launcher.pid, 9)
        assert await _until(lambda: deaths == [-9])
        task.cancel()
        await launcher.stop(grace_s=1)
        assert deaths == [-9]

    asyncio.run(main())


def test_stop_kills_whole_group(standin, tmp_path):
    async def main():
        pid_file = tmp_path / "child.pid"
        launcher = standin("--child-pid-file", str(pid_file), "--ignore-sigterm")
        await launcher.start()
        child = int(pid_file.read_text())
        assert not _dead(child)
        assert os.getpgid(child) == launcher.pid  # own process group, led by the server
        t0 = time.monotonic()
        await asyncio.wait_for(launcher.stop(grace_s=0.5), 30)  # SIGTERM ignored by both: SIGKILL after the grace
        assert time.monotonic() - t0 >= 0.5  # the grace period was given
        assert "ignoring SIGTERM" in launcher.log_tail() and launcher.returncode == -9
        assert await _until(lambda: _dead(child)), "the server's child outlived stop()"

    asyncio.run(main())


def test_free_port_and_argv_builders():
    port = free_port()
    assert 0 < port < 65536
    argv = sglang_argv("/models/qwen3", tp=2, ep=2, dp=1, mem_fraction=0.7, port=port, host="0.0.0.0",
                       extra_args={"context_length": 4096, "disable_radix_cache": True,
                                   "enable_foo": False, "cuda_graph_bs": [1, 2, 4], "json_arg": {"a": 1}})
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    s = " ".join(argv)
    for part in ("--model-path /models/qwen3", "--tp-size 2", "--ep-size 2", "--dp-size 1",
                 "--mem-fraction-static 0.7", "--enable-memory-saver", f"--port {port}",
                 "--host 0.0.0.0", "--skip-tokenizer-init", "--context-length 4096",
                 "--disable-radix-cache", "--cuda-graph-bs 1 2 4", '--json-arg {"a": 1}'):
        assert part in s, part
    assert "--enable-foo" not in s
    assert extra_argv(["--x", "1"]) == ["--x", "1"]
    assert extra_argv(None) == []


# Whether SGLang 0.5.23 knows the flags sglang_argv emits: tests/rollout/test_sglang_upstream.py parses
# them with that release's own ServerArgs parser.


def test_server_dies_with_the_process_that_launched_it(standin, tmp_path):
    """A trainer killed outright (SIGKILL: no cleanup runs) must not leave its server running and
    holding GPU memory: the server is started with a parent-death signal."""
    import subprocess
    import textwrap

    script = tmp_path / "standin_server.py"
    standin()  # writes the script
    port = free_port()
    pid_file = tmp_path / "server.pid"
    owner = textwrap.dedent(f"""
        import asyncio, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from spade.rollout.sglang.launcher import ServerLauncher
        async def main():
            launcher = ServerLauncher([sys.executable, {str(script)!r}, "--port", "{port}"], port={port},
                                      log_path={str(tmp_path / "owner.log")!r}, start_timeout_s=20)
            await launcher.start()
            open({str(pid_file)!r}, "w").write(str(launcher.pid))
            await asyncio.sleep(600)
        asyncio.run(main())
    """)
    proc = subprocess.Popen([sys.executable, "-c", owner])
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, "the owner never started its server"
            time.sleep(0.05)
        server = int(pid_file.read_text())
        assert not _dead(server)
        proc.kill()
        proc.wait(timeout=10)
        assert asyncio.run(_until(lambda: _dead(server), timeout_s=10)), "the server outlived its owner"
    finally:
        if proc.poll() is None:
            proc.kill()
