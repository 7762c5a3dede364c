"""Running generated programs against tests inside the sandbox service, with time and memory limits.

The sandbox service runs environment classes, so a program is judged through one: the judge
source below (an environment class with the candidate program embedded as a string literal) is
opened in the sandbox; each ``step`` runs the program once on one test and returns what it printed
(stdin form) or the JSON of its return value (functional form). The program runs in the sandboxed
child, under all of the sandbox's layers and its import gate (the sandbox's builtins have no ``input``: the judge
supplies one reading the test's stdin); this needs nothing new from the sandbox. The limits are those of the judge's own service (:func:`judge_config`): the time limit of
a test is ``step_timeout_s`` (the supervisor kills the child when it passes), the memory limit is
``memory_limit_mb`` (RLIMIT_AS: an allocation past it raises MemoryError, the child exits and the
supervisor reports ``memory_limit``). The first failing test ends the problem (pass@1 needs all).

Outputs are compared outside the sandbox: stdin form line by line with trailing whitespace and
trailing blank lines ignored, falling back to token-wise comparison with numbers equal within
1e-6 (as LiveCodeBench's own checker allows); functional form by JSON value equality.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..envs.protocol import EnvFault, ErrorKind
from ..envs.sandbox.client import SandboxService
from ..envs.sandbox.config import SandboxConfig
from ..envs.sandbox.runtime.limits import DEFAULT_ALLOWED_IMPORTS

# what competitive programs import beyond the environment allow-list (pure-Python or builtin modules)
EXTRA_IMPORTS = ("io", "queue", "copy", "string", "builtins")

_JUDGE = r'''
import json
import sys

PROGRAM = __PROGRAM__
MODE = __MODE__
FUNC = __FUNC__


class _StdinReader:
    """stdin for the program: text (``input``, ``sys.stdin.readline``) over a bytes ``buffer``."""

    def __init__(self, data, newline):
        self._data = data
        self._newline = newline
        self._pos = 0
        if isinstance(data, str):
            self.buffer = _StdinReader(data.encode(), b"\n")

    def read(self, n=-1):
        end = len(self._data) if n is None or n < 0 else self._pos + n
        chunk, self._pos = self._data[self._pos:end], min(end, len(self._data))
        return chunk

    def readline(self, n=-1):
        end = self._data.find(self._newline, self._pos)
        end = len(self._data) if end < 0 else end + 1
        chunk, self._pos = self._data[self._pos:end], end
        return chunk

    def readlines(self):
        out = []
        while True:
            line = self.readline()
            if not line:
                return out
            out.append(line)

    def __iter__(self):
        return iter(self.readlines())

    def isatty(self):
        return False


class _Out:
    def __init__(self):
        self.parts = []

    def write(self, text):
        self.parts.append(str(text))
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        pass

    def isatty(self):
        return False


def _input(prompt=""):
    line = sys.stdin.readline()
    if not line:
        raise EOFError("EOF when reading a line")
    return line[:-1] if line.endswith("\n") else line


class ProgramJudgeEnv:
    max_turns = 100000

    def reset(self, seed=None):
        return "ready", {}

    def step(self, action):
        test = json.loads(action)
        saved_in, saved_out = sys.stdin, sys.stdout
        out = _Out()
        namespace = {"__builtins__": __builtins__, "__name__": "__main__", "input": _input}
        sys.stdin, sys.stdout = _StdinReader(test.get("stdin", ""), "\n"), out
        try:
            try:
                exec(compile(PROGRAM, "<solution>", "exec"), namespace)
                if MODE == "functional":
                    owner = namespace["Solution"]() if "Solution" in namespace else None
                    target = getattr(owner, FUNC) if owner is not None else namespace[FUNC]
                    value = target(*test["args"])
                    out.parts = [json.dumps(value)]
            except SystemExit as stop:
                if stop.code not in (None, 0):
                    raise RuntimeError("the program exited with status %r" % (stop.code,))
        finally:
            sys.stdin, sys.stdout = saved_in, saved_out
        return "".join(out.parts), 0.0, False, False, {}
'''


def judge_source(program: str, mode: str = "stdin", func_name: Optional[str] = None) -> str:
    if mode not in ("stdin", "functional"):
        raise ValueError(f"mode must be stdin or functional, got {mode!r}")
    return (_JUDGE.replace("__PROGRAM__", repr(program)).replace("__MODE__", repr(mode))
            .replace("__FUNC__", repr(func_name)))


def judge_config(base: Optional[SandboxConfig] = None, *, time_limit_s: float = 6.0,
                 memory_limit_mb: int = 1024) -> SandboxConfig:
    """The sandbox settings of a judge service: the per-test time limit, the memory limit, room for
    large test inputs and outputs, and the extra standard modules programs import."""
    from dataclasses import replace

    base = base or SandboxConfig()
    imports = tuple(dict.fromkeys((*base.allowed_imports, *DEFAULT_ALLOWED_IMPORTS, *EXTRA_IMPORTS)))
    return replace(base, step_timeout_s=float(time_limit_s), memory_limit_mb=int(memory_limit_mb),
                   cpu_limit_s=max(base.cpu_limit_s, int(math.ceil(time_limit_s)) + 1),
                   max_action_chars=max(base.max_action_chars, 8 << 20),
                   max_observation_chars=max(base.max_observation_chars, 8 << 20),
                   max_frame_bytes=max(base.max_frame_bytes, 64 << 20), allowed_imports=imports)


@dataclass(frozen=True)
class ProgramTest:
    input: str
    output: str
    kind: str = "stdin"  # or "functional"


@dataclass(frozen=True)
class Verdict:
    """``passed``: every test passed. ``status``: accepted, wrong_answer, time_limit, memory_limit,
    runtime_error, import_blocked, sandbox_violation, or another sandbox ErrorKind value."""

    passed: bool
    status: str
    tests_run: int
    message: str = ""
    detail: dict = field(default_factory=dict)


_STATUS = {ErrorKind.TIMEOUT: "time_limit", ErrorKind.CPU_LIMIT: "time_limit",
           ErrorKind.MEMORY_LIMIT: "memory_limit", ErrorKind.STEP_ERROR: "runtime_error",
           ErrorKind.INIT_ERROR: "runtime_error", ErrorKind.SYNTAX_ERROR: "compile_error"}


def outputs_match(expected: str, actual: str) -> bool:
    def lines(text: str) -> list[str]:
        rows = [line.rstrip() for line in text.strip("\n").split("\n")]
        while rows and not rows[-1]:
            rows.pop()
        return rows

    if lines(expected) == lines(actual):
        return True
    want, got = expected.split(), actual.split()
    if len(want) != len(got):
        return False
    for a, b in zip(want, got):
        if a == b:
            continue
        try:
            if not math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-6):
                return False
        except ValueError:
            return False
    return True


def functional_match(expected: str, actual: str) -> bool:
    try:
        return json.loads(expected) == json.loads(actual)
    except ValueError:
        return expected.strip() == actual.strip()


def _functional_args(text: str) -> list[Any]:
    return [json.loads(line) for line in text.split("\n") if line.strip()]


async def judge(service: SandboxService, program: str, tests: Sequence[ProgramTest],
                func_name: Optional[str] = None) -> Verdict:
    """Run ``program`` on each test in the sandbox; stop at the first failure."""
    mode = "functional" if tests and tests[0].kind == "functional" else "stdin"
    try:
        env = await service.open(judge_source(program, mode, func_name))
    except EnvFault as exc:
        return Verdict(False, _STATUS.get(exc.error.kind, exc.error.kind.value), 0, exc.error.message)
    try:
        await env.reset()
        for index, test in enumerate(tests):
            action = {"args": _functional_args(test.input)} if mode == "functional" else {"stdin": test.input}
            try:
                result = await env.step(json.dumps(action))
            except EnvFault as exc:
                return Verdict(False, _STATUS.get(exc.error.kind, exc.error.kind.value), index + 1,
                               exc.error.message[:500], {"failed_test": index})
            match = functional_match if mode == "functional" else outputs_match
            if not match(test.output, result.observation):
                return Verdict(False, "wrong_answer", index + 1, "", {"failed_test": index})
        return Verdict(True, "accepted", len(tests))
    finally:
        await env.close()
