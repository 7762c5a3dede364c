"""The ``spade`` command as a user runs it: real subprocesses, real sandbox, exit codes and JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import prewarmed
from conftest import EXAMPLE_ENVS, ROOT

TIMEOUT = 120


def spade(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spade", *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=TIMEOUT, env=env)


COUNTER = textwrap.dedent('''
    class CounterEnv:
        def __init__(self, max_turns=5):
            self.max_turns = max_turns
        def reset(self, seed=None):
            self.total = 0
            return f"total 0 (seed {seed})", {}
        def step(self, action):
            digits = "".join(ch for ch in action if ch.isdigit())
            self.total += int(digits or 0)
            done = self.total >= 10
            return f"total {self.total}", 1.0 if done else 0.1, done, False, {"total": self.total}
''')


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_check_json_admits_examples_and_rejects_broken(tmp_path):
    broken = write(tmp_path, "broken.py", "class XEnv:\n    def reset(self, seed=None):\n        return 1, {}\n"
                                          "    def step(self, a):\n        return 'x', 0.0, True, False, {}\n")
    result = spade("env", "check", "--json", str(EXAMPLE_ENVS[0]), str(broken))
    assert result.returncode == 1, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["admitted"] for line in lines] == [True, False]
    assert set(lines[0]) == {"path", "admitted", "class_name", "error", "first_observation", "timings_ms",
                             "probe_report", "winnability_report"}
    assert lines[1]["error"]["kind"] == "bad_return" and lines[1]["error"]["stage"] == "smoke"
    assert lines[1]["class_name"] == "XEnv"


def test_check_exit_zero_when_all_admitted():
    result = spade("env", "check", *map(str, EXAMPLE_ENVS))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert sum(": admitted (" in line for line in lines) == len(EXAMPLE_ENVS)
    # one verdict line per file, then the summary; the probe lines only with -v
    assert len(lines) == len(EXAMPLE_ENVS) + 1 and not any("degenerate-policy probes" in line for line in lines)
    assert lines[-1] == f"checked {len(EXAMPLE_ENVS)}: {len(EXAMPLE_ENVS)} admitted, 0 rejected"


def test_check_takes_a_folder_and_summarises_the_rejections(tmp_path):
    folder = tmp_path / "envs"
    folder.mkdir()
    (folder / "a_good.py").write_text(EXAMPLE_ENVS[0].read_text())
    write(folder, "b_syntax.py", "class Broken(:\n    pass\n")
    write(folder, "c_reply.txt", "I could not write a game this time.")
    write(folder, "notes.json", "{}")  # not an environment file: not checked
    result = spade("env", "check", str(folder))
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(": ")[0] for line in lines[:-1]] == [str(folder / n) for n in ("a_good.py", "b_syntax.py",
                                                                                       "c_reply.txt")]
    assert ": admitted (" in lines[0] and ": rejected at " in lines[1] and ": rejected at " in lines[2]
    assert lines[-1].startswith("checked 3: 1 admitted, 2 rejected (") and "syntax_error" in lines[-1]
    verbose = spade("env", "check", "-v", str(folder / "a_good.py"))
    assert "degenerate-policy probes" in verbose.stdout and verbose.stdout.splitlines()[-1].startswith("checked 1: 1")
    json_lines = spade("env", "check", "--json", str(folder))
    assert len(json_lines.stdout.splitlines()) == 3 and "checked 3: 1 admitted, 2 rejected" in json_lines.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = spade("env", "check", str(empty))
    assert refused.returncode == 2 and "no *.py, *.txt, *.md file" in refused.stderr


def test_usage_errors_exit_two(tmp_path):
    assert spade("env", "check").returncode == 2
    missing = spade("env", "check", str(tmp_path / "nope.py"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    bad_config = write(tmp_path, "c.yaml", "sandbox:\n  isolation: docker\n")
    result = spade("env", "check", "--config", str(bad_config), str(EXAMPLE_ENVS[0]))
    assert result.returncode == 2 and "sandbox.isolation" in result.stderr and "unsafe-local" in result.stderr


def test_run_plays_actions_and_applies_return_rule(tmp_path):
    env = write(tmp_path, "counter.py", COUNTER)
    result = spade("env", "run", str(env), "--seed", "7", "--json", "--actions", "\\boxed{4}", "add \\boxed{5}",
                   "\\boxed{3}", "\\boxed{9}")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["error"] is None
    assert [s["action"] for s in report["steps"]] == ["\\boxed{4}", "\\boxed{5}", "\\boxed{3}"]  # stops at the end
    assert report["steps"][-1] == {"action": "\\boxed{3}", "observation": "total 12", "reward": 1.0,
                                   "terminated": True, "truncated": False}
    assert report["return"] == 1.0
    assert report["first_observation"] == "total 0 (seed 7)"


def test_run_from_actions_file_reports_environment_error(tmp_path):
    env = write(tmp_path, "counter.py", COUNTER.replace("self.total += int(digits or 0)", "self.total += int(action)"))
    actions = write(tmp_path, "actions.txt", "2\n\nthree\n")
    result = spade("env", "run", str(env), "--actions-file", str(actions), "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert len(report["steps"]) == 1 and report["return"] == 0.0
    assert report["error"]["kind"] == "step_error" and "ValueError" in report["error"]["message"]


def test_play_reads_actions_from_the_terminal(tmp_path):
    env = write(tmp_path, "counter.py", COUNTER)
    result = spade("env", "play", str(env), "--seed", "1", stdin="5\n\\boxed{6}\n")
    assert result.returncode == 0, result.stderr
    assert "total 0 (seed 1)" in result.stdout and "total 11" in result.stdout
    assert "return: 1" in result.stdout


def test_extract_prints_repaired_code_from_stdin():
    response = "Sure!\n```python\nclass AEnv:\n    def reset(self, seed=None):\n" \
               "        return f'pick {one cell}', {}\n```\n"
    result = spade("env", "extract", stdin=response)
    assert result.returncode == 0
    assert result.stdout == "class AEnv:\n    def reset(self, seed=None):\n        return f'pick {{one cell}}', {}\n"
    assert "escaped 1" in result.stderr


def test_unsafe_local_warns_on_start(tmp_path):
    result = spade("env", "check", "--isolation", "unsafe-local", str(EXAMPLE_ENVS[0]))
    assert result.returncode == 0
    assert "unsafe-local" in result.stderr and "WARNING" in result.stderr


def test_demo_admits_and_wins_every_example():
    result = spade("demo", "--episodes", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(EXAMPLE_ENVS)}/{len(EXAMPLE_ENVS)} environments admitted" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if line.endswith("1.00")]
    assert len(rows) == len(EXAMPLE_ENVS)  # the reference solver wins each one through the sandbox


def test_engine_check_passes_against_a_working_server(tmp_path):
    """``spade engine check`` launches the server as spade train does (here the tests' SGLang
    stand-in: SGLang needs a GPU) and walks through generation, seeds, an IPC weight update and a
    release/resume: every line ok, exit status 0."""
    from support.hf_fixtures import save_tiny_hf

    model = save_tiny_hf("qwen3", tmp_path / "model")
    standin = f"{prewarmed.python()} {ROOT / 'tests' / 'sglang_standin' / 'server.py'}"
    proc = subprocess.run([sys.executable, "-m", "spade", "engine", "check", "--model-path", str(model),
                           "--server-command", standin, "--tp", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for check in ("start", "generate", "seeds", "weight update", "release/resume"):
        assert any(line.startswith(check) and " ok " in line for line in lines), (check, proc.stdout)
    assert "weight version 1" in proc.stdout and "all checks passed" in proc.stdout


def test_engine_check_reports_a_server_that_cannot_start(tmp_path):
    from support.hf_fixtures import save_tiny_hf

    model = save_tiny_hf("qwen3", tmp_path / "model")
    fake = f"{sys.executable} -c \"import sys; print('CUDA error: no kernel image'); sys.exit(4)\""
    proc = subprocess.run([sys.executable, "-m", "spade", "engine", "check", "--model-path", str(model),
                           "--server-command", fake], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "FAILED" in proc.stdout and "exited with code 4" in proc.stdout and "no kernel image" in proc.stdout
