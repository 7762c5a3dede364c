"""Judging generated programs against tests inside the sandbox service, as LiveCodeBench judges them.

The sandbox service runs environment classes, so a program is judged through one: the judge
environment (``code_judge_harness.py``, read as text, with the program embedded as a string
literal) is opened in the sandbox; ``reset`` loads the program the way LiveCodeBench's
``testing_util`` does (its import header, its process guard, the stdin program wrapped in a
function), and each ``step`` runs it on one test. The program runs in the sandboxed child under all
of the sandbox's layers and its import gate.

Limits (``judge_config``): the time limit of a test is the service's ``step_timeout_s`` (LiveCodeBench:
``signal.alarm(timeout)`` per test, 6 s, wall clock; the supervisor kills the child when it passes);
loading the program (module body) gets the same limit (LiveCodeBench's ``compile_code`` alarm).
LiveCodeBench sets no memory limit (``reliability_guard()`` is called without one); the sandbox needs
one: ``memory_limit_mb`` (RLIMIT_AS). The CPU limit of the child is a safety net only, far above
what LiveCodeBench's worker may spend on one problem. The first failing test ends the problem.

Outputs of stdin programs are compared here, outside the sandbox, by ``grade_stdio``'s rule
(:func:`stdio_outputs_match`); call-based results are compared in the sandbox, by ``==`` on Python
values as ``grade_call_based`` does.

A failure of the sandbox itself (:class:`InfrastructureFault`: the supervisor died, the service
restarted under a running problem) is not the program's: the problem is judged again from the
start, up to ``infra_retries`` more times; when every try fails that way the verdict is
``infrastructure`` (``Verdict.infrastructure``), which callers keep out of the score.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence

from ..envs.protocol import EnvFault, ErrorKind, InfrastructureFault
from ..envs.sandbox.config import SandboxConfig
from ..envs.sandbox.runtime.limits import DEFAULT_ALLOWED_IMPORTS

HARNESS = Path(__file__).with_name("code_judge_harness.py")
# modules programs import beyond the environment allow-list (LiveCodeBench's header needs io and
# builtins; the harness itself needs ast); LiveCodeBench's worker imports anything installed, the
# sandbox's zygote (python -I -S) only the standard library
EXTRA_IMPORTS = ("io", "queue", "copy", "string", "builtins", "ast", "os", "threading", "gc")
LCB_TIME_LIMIT_S = 6.0  # lcb_runner/runner/parser.py --timeout
DEFAULT_MEMORY_LIMIT_MB = 4096
CPU_LIMIT_S = 3600
INFRA_RETRIES = 2
# the largest test input or output the judge hands to the sandbox; escaped twice on its way it stays
# under the sandboxed child's request limit (64 MiB); a larger test leaves the problem unjudged
TEST_TEXT_LIMIT = 16 << 20


class JudgeService(Protocol):
    async def open(self, source: str, *, max_turns: Optional[int] = None) -> Any: ...


def judge_source(program: str, mode: str = "stdin", func_name: Optional[str] = None) -> str:
    if mode not in ("stdin", "functional"):
        raise ValueError(f"mode must be stdin or functional, got {mode!r}")
    constants = f"PROGRAM = {program!r}\nMODE = {mode!r}\nFUNC = {func_name!r}\n"
    return constants + HARNESS.read_text(encoding="utf-8")


def judge_config(base: Optional[SandboxConfig] = None, *, time_limit_s: float = LCB_TIME_LIMIT_S,
                 memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB) -> SandboxConfig:
    """The sandbox settings of a judge service: the per-test time limit (also for loading the
    program), the memory limit, room for large test inputs and outputs, the modules programs import."""
    base = base or SandboxConfig()
    imports = tuple(dict.fromkeys((*base.allowed_imports, *DEFAULT_ALLOWED_IMPORTS, *EXTRA_IMPORTS)))
    return replace(base, step_timeout_s=float(time_limit_s), reset_timeout_s=float(time_limit_s),
                   memory_limit_mb=int(memory_limit_mb), cpu_limit_s=max(base.cpu_limit_s, CPU_LIMIT_S),
                   max_source_bytes=max(base.max_source_bytes, 1 << 20),
                   max_action_chars=max(base.max_action_chars, TEST_TEXT_LIMIT),
                   max_observation_chars=max(base.max_observation_chars, TEST_TEXT_LIMIT),
                   max_frame_bytes=max(base.max_frame_bytes, 4 * TEST_TEXT_LIMIT), allowed_imports=imports)


@dataclass(frozen=True)
class ProgramTest:
    input: str
    output: str
    kind: str = "stdin"  # or "functional"


@dataclass(frozen=True)
class Verdict:
    """``passed``: every test passed. ``status``: accepted, wrong_answer, time_limit, memory_limit,
    runtime_error, exit_called, import_blocked, output_too_large, another sandbox ErrorKind value, or
    ``infrastructure`` (the sandbox failed on every try: ``infrastructure`` True, not a verdict on
    the program). ``attempts``: how many times the problem was started."""

    passed: bool
    status: str
    tests_run: int
    message: str = ""
    detail: dict = field(default_factory=dict)
    infrastructure: bool = False
    attempts: int = 1


_STATUS = {ErrorKind.TIMEOUT: "time_limit", ErrorKind.CPU_LIMIT: "time_limit",
           ErrorKind.MEMORY_LIMIT: "memory_limit", ErrorKind.STEP_ERROR: "runtime_error",
           ErrorKind.RESET_ERROR: "runtime_error", ErrorKind.INIT_ERROR: "runtime_error",
           ErrorKind.SYNTAX_ERROR: "compile_error", ErrorKind.CRASHED: "runtime_error"}


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> Optional[list[Decimal]]:
    try:
        return [Decimal(token) for token in line.split()]
    except (InvalidOperation, ValueError):
        return None


def stdio_outputs_match(expected: str, actual: str) -> bool:
    """LiveCodeBench's ``grade_stdio`` rule: both texts stripped and split into lines, each line
    stripped; the same number of lines; each pair equal as text, or else equal as lists of
    ``Decimal`` (one per whitespace-separated token; a token that is no number fails the line)."""
    want, got = _stripped_lines(expected), _stripped_lines(actual)
    if len(want) != len(got):
        return False
    for a, b in zip(want, got):
        if a == b:
            continue
        decimals_a, decimals_b = _decimals(a), _decimals(b)
        try:
            if decimals_a is None or decimals_b is None or decimals_a != decimals_b:
                return False
        except InvalidOperation:  # a signalling NaN (LiveCodeBench: the grading raises, the test fails)
            return False
    return True


def _reply(observation: str) -> dict[str, Any]:
    """The harness's JSON reply; anything else means the program broke the harness."""
    try:
        reply = json.loads(observation)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        return {"status": "runtime_error", "message": "the program broke the judge's reply"}
    return reply


class _Unjudged(Exception):
    """The judge could not deliver a test to the sandbox (larger than the service's frame)."""


async def judge(service: JudgeService, program: str, tests: Sequence[ProgramTest],
                func_name: Optional[str] = None, *, infra_retries: int = INFRA_RETRIES) -> Verdict:
    """Run ``program`` on each test in the sandbox; stop at the first failure. The form follows
    LiveCodeBench: call-based when the problem names a function (``func_name``), stdin otherwise."""
    mode = "functional" if func_name else "stdin"
    message = ""
    for attempt in range(1, infra_retries + 2):
        try:
            return replace(await _judge_once(service, program, tests, mode, func_name), attempts=attempt)
        except InfrastructureFault as exc:
            message = exc.error.message
        except _Unjudged as exc:
            return Verdict(False, "infrastructure", 0, str(exc), infrastructure=True, attempts=attempt)
    return Verdict(False, "infrastructure", 0, f"the sandbox failed on every try: {message}"[:500],
                   infrastructure=True, attempts=infra_retries + 1)


async def _judge_once(service: JudgeService, program: str, tests: Sequence[ProgramTest], mode: str,
                      func_name: Optional[str]) -> Verdict:
    try:
        env = await service.open(judge_source(program, mode, func_name))
    except InfrastructureFault:
        raise
    except EnvFault as exc:
        return Verdict(False, _STATUS.get(exc.error.kind, exc.error.kind.value), 0, exc.error.message[:500])
    try:
        try:
            loaded = _reply((await env.reset()).observation)
        except InfrastructureFault:
            raise
        except EnvFault as exc:
            return Verdict(False, _STATUS.get(exc.error.kind, exc.error.kind.value), 0, exc.error.message[:500])
        if not loaded.get("loaded"):
            return Verdict(False, str(loaded.get("status", "runtime_error")), 0, str(loaded.get("message", ""))[:500])
        for index, test in enumerate(tests):
            action = {"input": test.input} if mode == "stdin" else {"input": test.input, "output": test.output}
            try:
                observation = (await env.step(json.dumps(action))).observation
            except InfrastructureFault:
                raise
            except EnvFault as exc:
                status = _STATUS.get(exc.error.kind, exc.error.kind.value)
                return Verdict(False, status, index + 1, exc.error.message[:500], {"failed_test": index})
            except ValueError as exc:  # the test is larger than the judge service accepts
                raise _Unjudged(f"test {index}: {exc}") from None
            result = _reply(observation)
            status = result.get("status")
            if status == "ok" and mode == "stdin" and not stdio_outputs_match(test.output, result.get("output", "")):
                status = "wrong_answer"
            if status != "ok":
                return Verdict(False, str(status), index + 1, str(result.get("message", ""))[:500],
                               {"failed_test": index})
        return Verdict(True, "accepted", len(tests))
    finally:
        try:
            await env.close()
        except EnvFault:
            pass
