"""tests/prewarmed.py, the suite's runner of ``spade`` commands forked from a prewarmed interpreter,
and its stand-in for the ``python`` executable (``python()``, ``torchrun()``): what a command sees
and returns is what a fresh interpreter process sees and returns."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import prewarmed
from spade.process_group import kill_group

# a config that can start (spade train --check runs the checks of a start: the model must exist)
CONFIG = "model: {hf_dir: embedded, dtype: float32}\nselfplay: {use_corpus: false}\nrun: {steps: 3, seed: 11}\n"


def fresh(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spade", *args], capture_output=True, text=True, timeout=120,
                          **kwargs)


def test_a_forked_command_prints_and_exits_as_a_fresh_process(tmp_path):
    (tmp_path / "mine.yaml").write_text(CONFIG)
    args = ["train", "--config", "mine.yaml", "--check", "run.log_every=5"]  # relative: the working directory
    forked = prewarmed.run(args, cwd=tmp_path, timeout=120)
    assert forked.args == [sys.executable, "-m", "spade", *args]
    assert prewarmed._zygote is not None and prewarmed._zygote.process.poll() is None  # it went through the zygote
    expected = fresh(args, cwd=tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (expected.returncode, expected.stdout,
                                                                 expected.stderr)
    assert forked.returncode == 0 and "log_every: 5" in forked.stdout and "seed: 11" in forked.stdout

    refused = prewarmed.run(["train", "--config", "missing.yaml"], cwd=tmp_path, timeout=120)
    assert refused.returncode == 2 and "missing.yaml" in refused.stderr and refused.stdout == ""


def test_the_command_gets_its_own_environment_and_standard_input(tmp_path):
    """argparse wraps ``--help`` at the width in COLUMNS: the child reads the environment it was given."""
    narrow, wide = ({**os.environ, "COLUMNS": str(width)} for width in (60, 200))
    forked = prewarmed.run(["train", "--help"], env=narrow, input="ignored\n", timeout=120)
    assert forked.returncode == 0
    assert forked.stdout == fresh(["train", "--help"], env=narrow, input="ignored\n").stdout
    assert forked.stdout != prewarmed.run(["train", "--help"], env=wide, timeout=120).stdout
    assert max(len(line) for line in forked.stdout.splitlines()) <= 60


# ------------------------------------------------------------------ python(): a stand-in executable

# What a program sees of its interpreter; "preloaded" tells a forked child (torch imported before
# the program's first line) from a fresh interpreter.
REPORT = """import json, os, sys
print(json.dumps({"preloaded": "torch" in sys.modules, "argv": sys.argv, "path0": sys.path[0],
                  "cwd": os.getcwd(), "name": __name__, "rank": os.environ.get("RANK"),
                  "search": [p for p in sys.path if p.startswith(os.environ.get("PROBE_ROOT", "?"))]}))
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


def report(command: list[str], **kwargs) -> tuple[int, dict]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, **kwargs)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout.splitlines()[-1])


def test_only_environments_read_at_import_time_send_a_command_to_a_fresh_interpreter(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(REPORT)

    def forked(**changes: str | None) -> bool:
        env = {key: value for key, value in os.environ.items() if key not in changes}
        env.update({key: value for key, value in changes.items() if value is not None})
        return report([prewarmed.python(), str(script)], env=env)[1]["preloaded"]

    assert forked()
    assert forked(SPADE_SOMETHING="1", OMP_NUM_THREADS="1")  # read at run time / applied in the child
    assert forked(TORCHELASTIC_RUN_ID="x", PYTHON_EXEC="/bin/x", PYTHON="/bin/x")  # torchrun's and device_check's
    assert forked(TORCHINDUCTOR_CACHE_DIR=str(tmp_path))  # set by torch itself once it compiles
    assert forked(NVTE_FLASH_ATTN="0")  # Transformer Engine's, which the zygote has not imported
    assert not forked(PYTHONHASHSEED="123")
    assert not forked(CUDA_VISIBLE_DEVICES="", PATH=None)


def search_path(directory) -> str:
    """``directory`` ahead of the PYTHONPATH this test process has (where spade may come from)."""
    return os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))


def test_a_script_module_or_code_runs_forked_and_sees_what_a_fresh_interpreter_sees(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(REPORT)
    (tmp_path / "probe_module.py").write_text(REPORT)
    env = {**os.environ, "PROBE_EXIT": "3", "PYTHONPATH": search_path(tmp_path), "PROBE_ROOT": str(tmp_path)}
    for argv in ([str(script), "a", "b"], ["-u", "-m", "probe_module", "x"], ["-c", REPORT, "y"]):
        forked_code, forked = report([prewarmed.python(), *argv], cwd=tmp_path, env=env)
        fresh_code, expected = report([sys.executable, *argv], cwd=tmp_path, env=env)
        assert forked.pop("preloaded") and not expected.pop("preloaded"), argv
        assert (forked_code, forked) == (fresh_code, expected) == (3, expected), argv


def test_an_option_or_environment_it_cannot_honour_runs_in_a_fresh_interpreter(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(REPORT)

    def forked(*options: str, **changes: str) -> bool:
        return report([prewarmed.python(), *options, str(script)], env={**os.environ, **changes})[1]["preloaded"]

    assert not forked("-X", "dev")
    assert not forked(PYTHONHASHSEED="5")
    shadow = tmp_path / "shadow"  # a directory whose `torch` would be imported instead of the zygote's
    (shadow / "torch").mkdir(parents=True)
    assert not forked(PYTHONPATH=search_path(shadow))
    harmless = tmp_path / "harmless"
    harmless.mkdir()
    assert forked(PYTHONPATH=search_path(harmless))


# Short sleeps: a signal that lands between the print and a long sleep would wait for its end.
PROGRESS_BARS = """import json, sys
import huggingface_hub.utils, tqdm
print(json.dumps({"preloaded": "torch" in sys.modules, "hub": huggingface_hub.utils.are_progress_bars_disabled(),
                  "tqdm": tqdm.tqdm(range(2), file=sys.stdout).disable,
                  "tqdm_defaults": tqdm.tqdm.__dict__["__init__"].keywords}))
"""


def test_the_progress_bar_settings_spade_passes_on_are_applied_in_the_child():
    """spade sets HF_HUB_DISABLE_PROGRESS_BARS and TQDM_DISABLE for what it launches; both libraries
    read them at import, so the child sets what they would have set."""
    for extra in ({}, {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}, {"TQDM_NCOLS": "33"}):
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("TQDM_", "HF_HUB_DISABLE"))}, **extra}
        forked, expected = (report([python, "-c", PROGRESS_BARS], env=env)[1]
                            for python in (prewarmed.python(), sys.executable))
        assert forked.pop("preloaded") and not expected.pop("preloaded"), extra
        assert forked == expected, extra
    assert expected == {"hub": False, "tqdm": False, "tqdm_defaults": {"ncols": 33}}


SLEEPER = """import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
print(os.getpid(), flush=True)
for _ in range(2400):
    time.sleep(0.05)
"""


def test_signals_reach_the_program_and_it_dies_with_its_stand_in(tmp_path):
    """SIGTERM to the stand-in's group reaches the program (its handler's exit status comes back);
    SIGKILL of the stand-in takes the program with it, as it would a real interpreter's."""
    for sig, expected_code in ((signal.SIGTERM, 7), (signal.SIGKILL, -signal.SIGKILL)):
        proc = subprocess.Popen([prewarmed.python(), "-c", SLEEPER], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            program = int(proc.stdout.readline())
            assert program != proc.pid  # the forked child, not the stand-in
            kill_group(proc.pid, sig)
            assert proc.wait(timeout=30) == expected_code
            deadline = time.monotonic() + 10
            while _alive(program) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not _alive(program)
        finally:
            kill_group(proc.pid)


def test_the_zygote_outlives_clients_that_vanish():
    """A client that connects and dies before asking, and stand-ins killed while their programs run
    (the zygote may then read ECONNRESET), leave the zygote serving."""
    import socket

    zygote = prewarmed._get_zygote()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as silent:
        silent.connect(zygote.path)
    for _ in range(3):
        proc = subprocess.Popen([prewarmed.python(), "-c", SLEEPER], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        proc.stdout.readline()
        kill_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert zygote.process.poll() is None
    assert report([prewarmed.python(), "-c", REPORT])[1]["preloaded"]


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_torchrun_starts_its_ranks_forked_too(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(REPORT)
    done = subprocess.run([*prewarmed.torchrun(), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                           "--master_port", "0", str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(rank["rank"] for rank in ranks) == ["0", "1"]
    assert all(rank["preloaded"] and rank["argv"] == [str(script)] for rank in ranks)


def test_a_process_that_used_the_zygote_exits_cleanly():
    """At the exit of the process that started it, the zygote is stopped, its directory removed and
    its pipes closed: no ResourceWarning for an unclosed pipe at the end of a test run."""
    code = "import prewarmed; z = prewarmed._get_zygote(); print(z.process.pid, z.directory, flush=True)"
    path = os.pathsep.join([str(prewarmed.ROOT / "tests"), str(prewarmed.ROOT)])
    done = subprocess.run([sys.executable, "-W", "default", "-c", code], cwd=prewarmed.ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0 and "Warning" not in done.stderr, done.stderr[-3000:]
    pid, directory = done.stdout.split()
    assert not _alive(int(pid)) and not os.path.exists(directory)
