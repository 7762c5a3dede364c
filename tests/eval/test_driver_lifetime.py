"""A harness driver dies with the evaluation that started it (issue 43): real process trees.

A parent Python process starts a driver through the real launcher (``external_harness.run_driver``);
the driver starts a grandchild and both write their process ids. The parent is then ended by
SIGTERM, SIGINT or SIGKILL, and the driver (and, where the parent can still act, its whole group)
must be gone within seconds. With the tau2 venv, ``spade eval`` itself is terminated while tau2's
driver runs. Then the tau2 smoke command of docs/evaluation.md runs to its end.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import ROOT
from spade.process_group import kill_group

pytestmark = pytest.mark.timeout(900)

PARENT = textwrap.dedent('''
    import asyncio, signal, sys
    from pathlib import Path
    from spade.eval.external_harness import Driver, run_driver

    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, also when started in background
    work = Path(sys.argv[1])
    driver = Driver("sleeper", Path(sys.argv[2]), Path(sys.executable), work, work / "driver.log", {},
                    "timeout_s", None, RuntimeError)
    asyncio.run(run_driver(driver, {}))
''')

SLEEPER = textwrap.dedent('''
    import os, subprocess, sys, time
    from pathlib import Path

    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pids = Path(sys.argv[1]).parent / "pids"
    pids.with_suffix(".tmp").write_text(f"{os.getpid()} {grandchild.pid}")
    pids.with_suffix(".tmp").rename(pids)
    time.sleep(600)
''')


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def start_parent(tmp_path: Path) -> tuple[subprocess.Popen, int, int]:
    (tmp_path / "parent.py").write_text(PARENT)
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, str(tmp_path / "parent.py"), str(tmp_path), str(tmp_path / "sleeper.py")]
    parent = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pids = tmp_path / "pids"
    try:
        wait_until(pids.exists, 120, "the driver and its child to start")
    except AssertionError:
        parent.kill()
        raise
    driver, grandchild = map(int, pids.read_text().split())
    return parent, driver, grandchild


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_ending_the_parent_kills_the_drivers_whole_group(tmp_path, sig):
    parent, driver, grandchild = start_parent(tmp_path)
    try:
        assert alive(driver) and alive(grandchild)
        parent.send_signal(sig)
        code = parent.wait(timeout=60)
        if sig == signal.SIGTERM:
            assert code == -signal.SIGTERM  # it still ends as SIGTERM ends a process
        wait_until(lambda: not alive(driver) and not alive(grandchild), 15, "the driver's group to die")
    finally:
        parent.kill()
        kill_group(driver)


def test_a_parent_killed_outright_takes_the_driver_with_it(tmp_path):
    parent, driver, grandchild = start_parent(tmp_path)
    try:
        parent.kill()  # SIGKILL: no handler runs; the kernel's parent-death signal does the work
        parent.wait(timeout=60)
        wait_until(lambda: not alive(driver), 15, "the driver to die")
    finally:
        kill_group(driver)  # the grandchild: a parent-death signal reaches the direct child only


# -- the real path: spade eval and tau2's driver ---------------------------------------------------


def tau2_ready() -> bool:
    from spade.eval.tau2_bench import package_version, tau2_python
    from spade.eval.types import BenchmarkUnavailable

    try:
        package_version(tau2_python())
    except BenchmarkUnavailable:
        return False
    return True


needs_tau2 = pytest.mark.skipif(not tau2_ready(), reason="no tau2 venv (make tau2)")


def drivers_under(directory: Path) -> list[int]:
    """Processes running tau2's driver on a config in ``directory``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"tau2_driver.py") for a in argv) and any(str(directory).encode() in a for a in argv):
            found.append(int(entry.name))
    return [pid for pid in found if alive(pid)]


def smoke_command() -> list[str]:
    """The tau2 smoke command of docs/evaluation.md, as written there."""
    text = (ROOT / "docs" / "evaluation.md").read_text()
    match = re.search(r"A smoke run on CPU[^\n]*\n\n((?:    .*\n)+)", text)
    assert match, "docs/evaluation.md lost its tau2 smoke command"
    return shlex.split(match.group(1).replace("\\\n", " "))


@pytest.mark.slow
@needs_tau2
def test_terminating_spade_eval_ends_its_tau2_driver(tmp_path):
    out = tmp_path / "eval"
    argv = smoke_command()
    argv[argv.index("--out") + 1] = str(out)
    assert argv[0] == "spade"
    process = subprocess.Popen([sys.executable, "-m", "spade", *argv[1:]], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: drivers_under(out), 300, "tau2's driver to start")
        (driver,) = drivers_under(out)
        process.terminate()
        assert process.wait(timeout=60) == -signal.SIGTERM
        wait_until(lambda: not alive(driver), 15, "tau2's driver to die")
    finally:
        process.kill()
        for pid in drivers_under(out):
            kill_group(pid)


@pytest.mark.slow
@needs_tau2
def test_the_documented_tau2_smoke_command_finishes(tmp_path):
    argv = smoke_command()
    argv[argv.index("--out") + 1] = str(tmp_path / "smoke")
    result = subprocess.run([sys.executable, "-m", "spade", *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "tau2" in result.stdout
    assert (tmp_path / "smoke" / "tau2.jsonl").is_file()
