"""spade train refuses bad input before it writes anything, and says how to resume when stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import prewarmed
import pytest

ROOT = Path(__file__).resolve().parents[2]
SPADE = [sys.executable, "-m", "spade", "train"]


def spade_train(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return prewarmed.run(["train", *args], cwd=ROOT, timeout=timeout)


def test_an_empty_config_is_refused_unless_defaults_are_meant(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    proc = spade_train("--config", str(empty), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2 and "--allow-defaults" in proc.stderr
    assert not (tmp_path / "run").exists()
    # --check runs a start's checks: every default cannot start (the designer reads a corpus and none is given)
    refused = spade_train("--config", str(empty), "--allow-defaults", "--check")
    assert refused.returncode == 2 and "corpus.paths is empty" in refused.stderr, refused.stderr
    checked = spade_train("--config", str(empty), "--allow-defaults", "--check", "selfplay.use_corpus=false")
    assert checked.returncode == 0 and "steps: 400" in checked.stdout, checked.stderr
    assert checked.stderr.strip().splitlines()[-1].startswith("spade train: check OK:")


@pytest.mark.parametrize("body, key", [
    ("model: {hf_dir: /no/such/model}\n", "model.hf_dir"),
    # the smoke config leaves the document out of its prompts (use_corpus: false): the corpus is read when on
    ("corpus: {paths: [/no/such/corpus.jsonl]}\nselfplay: {use_corpus: true}\n", "corpus.paths"),
    ("selfplay: {designer_enabled: false, fixed_env_dir: /no/such/pool}\n", "selfplay.fixed_env_dir"),
])
def test_bad_inputs_fail_before_the_run_directory_exists(tmp_path, body, key):
    config = tmp_path / "bad.yaml"
    config.write_text("include: " + str(ROOT / "examples" / "smoke_cpu.yaml") + "\n" + body)
    run = tmp_path / "run"
    proc = spade_train("--config", str(config), "--run-dir", str(run))
    assert proc.returncode == 2 and key in proc.stderr, proc.stderr
    assert not run.exists()  # a retry with the same --run-dir works


def test_a_corpus_without_usable_records_is_refused_early(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"title": "no text field"}\n')
    config = tmp_path / "c.yaml"
    config.write_text(f"include: {ROOT / 'examples' / 'smoke_cpu.yaml'}\ncorpus: {{paths: [{corpus}]}}\n"
                      "selfplay: {use_corpus: true}\n")
    proc = spade_train("--config", str(config), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2 and "corpus" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_failed_resume_leaves_the_config_untouched(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    config = (ROOT / "examples" / "smoke_cpu.yaml").read_text().replace("hf_dir: embedded", "hf_dir: /no/such/model")
    (run / "config.yaml").write_text(config)
    proc = spade_train("--resume", str(run), "run.steps=9")
    assert proc.returncode == 2 and "model.hf_dir" in proc.stderr
    assert (run / "config.yaml").read_text() == config


@pytest.mark.timeout(300)
def test_sigterm_stops_the_run_with_the_resume_command(tmp_path):
    """The smoke config with the embedded model; SIGTERM once the run directory is announced."""
    run = tmp_path / "run"
    proc = subprocess.Popen([*SPADE, "--config", str(ROOT / "examples" / "smoke_cpu.yaml"), "--run-dir", str(run)],
                            cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "SPADE_SHOW_WARNINGS": "0"})
    try:
        for line in proc.stderr:
            if "run directory" in line:
                break
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        code = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 143, rest[-2000:]
    assert f"spade train --resume {run}" in rest


UNUSABLE_BWRAP = """#!/bin/sh
echo "bwrap: setting up uid map: Permission denied" >&2
exit 1
"""


def test_an_unusable_bubblewrap_exits_3_before_the_run_directory_exists(tmp_path):
    """The sandbox self-test runs before anything is written: a bubblewrap that cannot start (what
    a kernel without unprivileged user namespaces gives) is found first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bwrap").write_text(UNUSABLE_BWRAP)
    (bin_dir / "bwrap").chmod(0o755)
    run = tmp_path / "run"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SPADE_SANDBOX_ISOLATION", None)
    proc = subprocess.run([*SPADE, "--config", str(ROOT / "examples" / "smoke_cpu.yaml"), "--run-dir", str(run)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "refusing to run generated code" in proc.stderr
    assert "setting up uid map: Permission denied" in proc.stderr  # bubblewrap's own words
    assert "Traceback" not in proc.stderr
    assert not run.exists()


def test_rlve_without_its_package_is_refused_before_anything(monkeypatch):
    """rlve-gym hidden from this process (find_spec says it is absent): the check names the key and
    the install command; with the package present the same config passes."""
    import importlib.util

    from spade.run.preflight import preflight
    from spade.run.run_dir import RunDirError
    from spade.train_config import from_dict

    config = from_dict({"selfplay": {"env_source": "rlve", "use_corpus": False, "use_memory": False,
                                     "train_designer": False, "g_hint": 0}})
    preflight(config)  # installed by make setup
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "Gym" else real(name, *a))
    with pytest.raises(RunDirError, match=r"selfplay\.env_source: rlve.*pip install rlve-gym==0\.0\.1"):
        preflight(config)


SWALLOWING_LOOP = """
import sys, time
from pathlib import Path
from spade.cli.train import _interrupts_say_how_to_resume, _terminate_by_exception
_terminate_by_exception()
with _interrupts_say_how_to_resume(Path(sys.argv[1])):
    print("ready", flush=True)
    while True:  # what a library's retry loop or import fallback does
        try:
            time.sleep(0.01)
        except Exception:
            pass
"""


def test_sigterm_is_not_swallowed_by_an_except_exception_block(tmp_path):
    """SIGTERM arriving inside library code that catches Exception still stops the run, with 143."""
    proc = subprocess.Popen([sys.executable, "-c", SWALLOWING_LOOP, str(tmp_path / "run")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 143, proc.stderr.read()[-2000:]
    assert f"spade train --resume {tmp_path / 'run'}" in proc.stderr.read()
