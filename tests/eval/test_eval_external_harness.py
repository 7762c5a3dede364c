"""The shared seam of tau2 and ACEBench: driver scripts that are files of their own, run by path in
another venv, and ``external_harness.run_driver`` (config in, report out, hard timeout that kills
the driver's whole process group). Also: the chat-model interface the benchmarks are typed against
is what ``runner.ChatModel`` provides."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import os
import sys
import time
import typing
from pathlib import Path

import pytest

from spade.eval.external_harness import DRIVERS, IMPORT_FAILED, Driver, driver_env, run_driver


class DriverFailed(RuntimeError):
    pass


def _driver(tmp_path: Path, script: Path, timeout_s=None, stdin=None) -> Driver:
    return Driver("toy", script, Path(sys.executable), tmp_path, tmp_path / "toy.log", driver_env(),
                  "toy.timeout_s", timeout_s, DriverFailed, stdin=stdin)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (killed, not yet reaped by its parent) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(")")[-1].split()[0] == "Z")


@pytest.mark.parametrize("name", ["tau2_driver.py", "acebench_driver.py"])
def test_drivers_are_scripts_that_import_nothing_of_spade(name):
    """A driver runs in the harness's venv, which has no spade: its imports must not name it."""
    tree = ast.parse((DRIVERS / name).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported and not any(m == "spade" or m.startswith("spade.") for m in imported)
    assert not any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree))


def test_the_tau2_driver_reports_a_missing_harness_as_an_import_error(tmp_path):
    """Run by path with a Python that lacks tau2 (the trainer's): exit status 3, the reason in the
    report, which run_driver returns instead of raising."""
    if importlib.util.find_spec("tau2") is not None:
        pytest.skip("this Python has tau2")
    report = asyncio.run(run_driver(_driver(tmp_path, DRIVERS / "tau2_driver.py", timeout_s=120), {"domains": []}))
    assert set(report) == {"import_error"} and "tau2" in report["import_error"]
    assert IMPORT_FAILED == 3


def test_config_in_report_out_and_stdin(tmp_path):
    script = tmp_path / "echo_driver.py"
    script.write_text("import json, sys\n"
                      "cfg = json.load(open(sys.argv[1]))\n"
                      "json.dump({'got': cfg['x'], 'stdin': sys.stdin.read(), 'cwd': __import__('os').getcwd()},"
                      " open(cfg['output'], 'w'))\n")
    report = asyncio.run(run_driver(_driver(tmp_path, script, timeout_s=60, stdin=b"y\ny\n"), {"x": [1, 2]}))
    assert report == {"got": [1, 2], "stdin": "y\ny\n", "cwd": str(tmp_path)}


def test_a_failing_driver_raises_with_the_log_tail(tmp_path):
    script = tmp_path / "bad_driver.py"
    script.write_text("import sys\nprint('the harness said no')\nsys.exit(5)\n")
    with pytest.raises(DriverFailed, match=r"(?s)the toy driver exited with 5 .*the harness said no"):
        asyncio.run(run_driver(_driver(tmp_path, script, timeout_s=60), {}))


def test_the_timeout_kills_the_drivers_whole_process_group(tmp_path):
    """A driver that started a child of its own: past the timeout both are gone and the error
    names the setting."""
    script = tmp_path / "hanging_driver.py"
    pid_file = tmp_path / "child.pid"
    script.write_text("import subprocess, sys, time\n"
                      f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                      f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
                      "time.sleep(600)\n")
    with pytest.raises(DriverFailed, match=r"toy did not finish within toy.timeout_s=1.5 s"):
        asyncio.run(run_driver(_driver(tmp_path, script, timeout_s=1.5), {}))
    child = int(pid_file.read_text())
    for _ in range(200):  # SIGKILL is delivered at once; the orphan is reaped by init shortly
        if not _alive(child):
            break
        time.sleep(0.01)
    assert not _alive(child)


def test_chat_model_provides_the_interface_the_benchmarks_are_typed_against():
    from spade.eval.chat_interface import ChatModelLike
    from spade.eval.runner import ChatModel

    class Engine:
        weight_version = 0

    model = ChatModel(Engine(), object(), concurrency=3, max_context_tokens=100, stop_token_ids=[7],
                      chat_template_kwargs={"enable_thinking": False})
    wanted = set(typing.get_type_hints(ChatModelLike)) | {"complete"}
    assert all(hasattr(model, name) for name in wanted), wanted - set(dir(model))
    assert model.stop_token_ids == (7,) and model.template_kwargs == {"enable_thinking": False}
