"""``spade env run`` / ``spade env play`` as a person drives them (issue 43): the real command in a
subprocess (a pseudo-terminal for the prompt), the real sandbox.

* replies a model can write that no strict encoder takes (JSON's ``NaN``/``Infinity``, ``"\\ud800"``,
  NUL) are format errors of their turn, never a traceback;
* a tool environment's actions file writes a new line as ``\\n`` (and a backslash as ``\\\\``), as
  the play prompt does; a game's lines are taken as written;
* the play prompt edits lines with readline and answers Ctrl-C with one line and exit status 130.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from spade.cli.env_input import decode_escapes

TIMEOUT = 120
BANKING = ROOT / "examples" / "envs" / "tool_use" / "banking.py"
FORMAT_ERROR = "Format error: call a tool as"


def spade(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spade", *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=TIMEOUT)


def call(name: str, arguments_json: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments_json}}}\n</tool_call>'


UNENCODABLE = [
    call("transfer", '{"source": "savings", "target": "checking", "amount": NaN}'),
    call("transfer", '{"source": "savings", "target": "checking", "amount": -Infinity}'),
    call("get_balance", '{"account": "\\ud800"}'),  # the six characters a model writes
    call("\\udfff", "{}"),
]


def test_run_makes_unencodable_calls_format_errors_not_tracebacks():
    # NUL is JSON and UTF-8: that call runs (the environment refuses the account)
    nul = call("get_balance", '{"account": "sav\\u0000ings"}')
    responses = [*UNENCODABLE, nul, call("get_balance", '{"account": "savings"}')]
    text = spade("env", "run", str(BANKING), "--seed", "0", "--actions", *responses)
    assert text.returncode == 0, text.stderr
    assert "Traceback" not in text.stderr
    assert text.stdout.count("format error") == len(UNENCODABLE)
    assert "NaN or an infinite number" in text.stdout and "lone surrogate" in text.stdout
    assert "call get_balance({\"account\": \"savings\"}) -> returncode 0: savings: 4104" in text.stdout

    report = json.loads(spade("env", "run", str(BANKING), "--seed", "0", "--json", "--actions", *responses).stdout)
    kinds = [step["kind"] for step in report["steps"]]
    assert kinds == ["format_error"] * len(UNENCODABLE) + ["calls", "calls"]
    assert [step["reward"] for step in report["steps"]] == [-0.1] * len(UNENCODABLE) + [0.0, 0.0]
    assert report["steps"][-2]["calls"][0]["arguments"] == {"account": "sav\0ings"}
    assert report["steps"][-2]["calls"][0]["returncode"] == 1
    assert report["error"] is None and report["end_reason"] == "policy_stopped"


def test_escapes_are_decoded_as_documented():
    assert decode_escapes("a\\nb") == "a\nb"
    assert decode_escapes("a\\\\nb") == "a\\nb"  # an escaped backslash, then a plain n
    assert decode_escapes("\\boxed{x \\neq 1}") == "\\boxed{x \neq 1}"  # \b stays, \n does not
    assert decode_escapes("C:\\\\dir\\t") == "C:\\dir\\t"


def test_a_tool_actions_file_holds_multi_line_calls(tmp_path):
    lines = [
        "I check first.\\n<tool_call>\\n" + json.dumps({"name": "get_balance", "arguments": {"account": "savings"}})
        + "\\n</tool_call>",
        # JSON's own escape for a new line inside a string is written \\n
        "<tool_call>\\n" + '{"name": "decline_request", "arguments": {"reason": "one\\\\ntwo"}}' + "\\n</tool_call>",
        "<answer>done</answer>",
    ]
    actions = tmp_path / "actions.txt"
    actions.write_text("\n".join(lines) + "\n\n")
    result = spade("env", "run", str(BANKING), "--seed", "0", "--json", "--actions-file", str(actions))
    assert result.returncode == 0, result.stderr
    steps = json.loads(result.stdout)["steps"]
    assert [s["kind"] for s in steps] == ["calls", "calls", "answer"]
    assert steps[0]["response"].startswith("I check first.\n<tool_call>\n{")
    assert steps[0]["calls"][0]["output"] == "savings: 4104"
    assert steps[1]["calls"][0]["arguments"] == {"reason": "one\ntwo"}


ECHO_GAME = '''
class EchoEnv:
    def __init__(self, max_turns=3):
        self.max_turns = max_turns
    def reset(self, seed=None):
        return "say something", {}
    def step(self, action):
        return "got " + repr(action), 0.0, False, False, {}
'''


def test_a_game_actions_file_is_taken_as_written(tmp_path):
    env = tmp_path / "echo.py"
    env.write_text(ECHO_GAME)
    actions = tmp_path / "actions.txt"
    actions.write_text("\\boxed{a\\nb}\n")  # \boxed{a\nb}, backslashes and all
    result = spade("env", "run", str(env), "--json", "--actions-file", str(actions))
    assert result.returncode == 0, result.stderr
    (step,) = json.loads(result.stdout)["steps"]
    assert "a\\nb" in step["action"] and "\n" not in step["action"]  # no new line: the backslash is kept


def test_play_decodes_escapes_in_a_typed_call():
    typed = '<tool_call>\\n{"name": "get_balance", "arguments": {"account": "savings"}}\\n</tool_call>\nquit\n'
    result = spade("env", "play", str(BANKING), "--seed", "0", stdin=typed)
    assert result.returncode == 0, result.stderr
    assert "tool: savings: 4104" in result.stdout and FORMAT_ERROR not in result.stdout


class Terminal:
    """``spade ARGS`` on a pseudo-terminal of its own (its controlling terminal, so ^C is a SIGINT)."""

    def __init__(self, *args: str):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: become spade
            os.chdir(ROOT)
            os.execve(sys.executable, [sys.executable, "-m", "spade", *args], {**os.environ, "TERM": "xterm"})
        self.output = b""

    def read_until(self, marker: bytes, timeout: float = TIMEOUT) -> bytes:
        deadline = time.monotonic() + timeout
        while marker not in self.output:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {marker!r} within {timeout} s; got:\n{self.output.decode(errors='replace')}")
            ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # the child is gone
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"ended before {marker!r}:\n{self.output.decode(errors='replace')}")
                self.output += chunk
        return self.output

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def exit_status(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if ready:
                try:
                    self.output += os.read(self.fd, 65536)
                except OSError:
                    pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        raise AssertionError(f"still running after {timeout} s:\n{self.output.decode(errors='replace')}")

    def close(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(self.fd)


@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("readline") is None, reason="this Python has no readline module")
def test_play_edits_the_line_and_ctrl_c_stops_it_cleanly():
    terminal = Terminal("env", "play", str(BANKING), "--seed", "0")
    try:
        terminal.read_until(b"[1] > ")
        # readline: Ctrl-A goes to the start of the line, so "nswer done" becomes "answer done"
        terminal.type(b"nswer done\x01a\r")
        terminal.read_until(b"Not accepted: step 1 of 3 is still open")
        terminal.read_until(b"[2] > ")
        terminal.type(b"\x03")  # Ctrl-C at the prompt
        code = terminal.exit_status()
        text = terminal.output.decode(errors="replace")
        assert code == 130, text
        assert "interrupted (Ctrl-C)" in text and "Traceback" not in text and "[3] > " not in text
    finally:
        terminal.close()


def test_actions_that_are_not_utf8_are_refused_in_one_line(tmp_path):
    actions = tmp_path / "actions.txt"
    actions.write_bytes(b"I check.\n<answer>caf\xff</answer>\n")
    result = spade("env", "run", str(BANKING), "--actions-file", str(actions))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"spade: error: {actions}: action 2 holds byte 0xff, which is not UTF-8\n"
