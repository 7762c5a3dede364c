"""Hostile environments (notes/sandbox.md): each ends in one classified error, nothing escapes.

Every test runs model-written-style hostile code through the real sandbox service (bubblewrap,
Landlock, seccomp, rlimits, the supervisor's wall clock) and checks three things: the exact
:class:`ErrorKind` (and stage), that nothing leaked out (no file on the host, no secret in any
observation, info, output or error message), and that the supervisor is still up and a benign
environment still opens, resets and steps correctly afterwards.

The Python-level import gate is deliberately bypassed in most tests (``sys.modules['os']``,
``random._os``, ``().__class__.__base__.__subclasses__()``, ``importlib``): the OS layers are what
must hold. ``ctypes`` is import-blocked but already loaded in every child (the runtime's Landlock
and seccomp code use it), so ``sys.modules['ctypes']`` reaches it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any, Iterable

import pytest

from conftest import SandboxHarness, make_harness
from spade.envs.protocol import EnvError, EnvFault, ErrorKind, InfrastructureFault, Stage
from spade.envs.sandbox.launcher import MOUNT_ROOT, RUNTIME_DIR

# Set before any sandbox service starts (module import happens at collection, before fixtures run),
# so the supervisor on the host side of the sandbox really holds it in its environment.
SECRET = f"spade-secret-{uuid.uuid4().hex}"
os.environ["SPADE_TEST_SECRET"] = SECRET

REPO = Path(__file__).resolve().parents[2]
PREFIX = Path(os.path.realpath(sys.base_prefix))
RUNTIME_INSIDE = f"{MOUNT_ROOT}/runtime"  # where the sandbox sees RUNTIME_DIR
QUICK_TIMEOUTS = dict(load_timeout_s=1.5, reset_timeout_s=1.5, step_timeout_s=1.5)
K = ErrorKind

BENIGN = '''
class CounterEnv:
    def __init__(self):
        self.count = 0

    def reset(self, seed=None):
        self.count = 0
        return f"count={self.count}", {"seed": seed}

    def step(self, action):
        self.count += 1
        return f"count={self.count}", 1.0, self.count >= 2, False, {"action": action}
'''


def env_source(*, module: str = "", init: str = "", reset: str = "", step: str = "") -> str:
    """An environment whose module body / __init__ / reset / step start with the given code.

    Snippets are written at column 0; a snippet may ``return`` to replace the normal result.
    """

    def block(code: str, indent: int) -> str:
        return textwrap.indent(textwrap.dedent(code).strip("\n") or "pass", " " * indent)

    return (f"{block(module, 0)}\n\n"
            "class HostileEnv:\n"
            "    def __init__(self):\n"
            f"{block(init, 8)}\n"
            "    def reset(self, seed=None):\n"
            f"{block(reset, 8)}\n"
            "        return 'start', {}\n"
            "    def step(self, action):\n"
            f"{block(step, 8)}\n"
            "        return 'obs', 0.0, False, False, {}\n")


def case_ids(cases: list[tuple[Any, ...]]) -> list[str]:
    """Readable test ids for (where, code, ...) cases: the place and a slug of the code."""
    return [f"{case[0]}:" + re.sub(r"[^A-Za-z0-9]+", "_", case[1])[:40].strip("_") for case in cases]


# -- helpers ------------------------------------------------------------------------------------


def texts_of(value: Any) -> str:
    """Everything a caller could read from a result or error, as one string."""
    if isinstance(value, EnvError):
        return value.message
    return json.dumps({k: getattr(value, k) for k in ("observation", "info", "output") if hasattr(value, k)},
                      default=repr)


def assert_no_secret(*values: Any) -> None:
    for value in values:
        text = texts_of(value) if not isinstance(value, str) else value
        assert SECRET not in text, "the host secret leaked into what the environment returned"


# The quick service's 1.5 s limits also bound the benign game that checks its health right after
# a hog. That game needs milliseconds, but a loaded 2-core CI machine can stall one call past
# 1.5 s: on the quick service a benign game that times out is played again, at most
# QUICK_BENIGN_TRIES times. Any other fault, a wrong value, or a timeout every time fails: a
# service the hog left broken (dead supervisor, a slot never freed, a sandbox still busy with
# the hog) fails each try the same way.
QUICK_BENIGN_TRIES = 3


def _play_benign(harness: SandboxHarness) -> None:
    env = harness.run(harness.service.open(BENIGN))
    try:
        first = harness.run(env.reset(seed=7))
        assert (first.observation, first.info) == ("count=0", {"seed": 7})
        one = harness.run(env.step("a"))
        assert one.as_tuple() == ("count=1", 1.0, False, False, {"action": "a"})
        two = harness.run(env.step("b"))
        assert two.as_tuple() == ("count=2", 1.0, True, False, {"action": "b"})
    finally:
        with contextlib.suppress(EnvFault):  # a timed-out environment is already gone
            harness.run(env.close())


def assert_healthy(harness: SandboxHarness) -> None:
    """The supervisor is up, every sandbox is alive, and a benign env works end to end."""
    service = harness.service
    assert service.running, "the supervisor died"
    tries = QUICK_BENIGN_TRIES if harness.config.step_timeout_s == QUICK_TIMEOUTS["step_timeout_s"] else 1
    for attempt in range(1, tries + 1):
        try:
            _play_benign(harness)
            break
        except EnvFault as exc:
            if exc.error.kind is not K.TIMEOUT or attempt == tries:
                raise
    stats = harness.run(service.stats())
    assert stats["sandboxes_alive"] == harness.config.pool_size
    assert service.running


def expect_fault(harness: SandboxHarness, source: str, kind: ErrorKind | Iterable[ErrorKind],
                 stage: Stage | None = None, *, action: str = "a", seed: int | None = 1) -> EnvError:
    """Open ``source``, reset, step once; the first call that fails must fail with ``kind`` at ``stage``.

    Also: the fault is the environment's (not an infrastructure fault), no secret leaks, the dead
    environment refuses further calls, and the service stays healthy.
    """
    kinds = {kind} if isinstance(kind, ErrorKind) else set(kind)
    env = None
    reached = Stage.LOAD
    results: list[Any] = []
    try:
        env = harness.run(harness.service.open(source))
        reached = Stage.RESET
        results.append(harness.run(env.reset(seed=seed)))
        reached = Stage.STEP
        results.append(harness.run(env.step(action)))
    except EnvFault as exc:
        error = exc.error
    else:
        harness.run(env.close())
        pytest.fail(f"expected {sorted(k.value for k in kinds)}, but every call succeeded: {results!r}"[:2000])
    assert_no_secret(error, *results)
    assert not isinstance(error, InfrastructureFault) and not error.infrastructure, error
    if env is not None:
        with pytest.raises(EnvFault):  # a faulted environment is dead
            harness.run(env.step("again"))
    assert_healthy(harness)
    assert error.kind in kinds, f"expected {sorted(k.value for k in kinds)} at {reached.value}, got {error}"
    assert error.stage is reached, f"the fault was raised at {error.stage.value}, the call was {reached.value}"
    if stage is not None:
        assert error.stage is stage, error
    return error


def run_ok(harness: SandboxHarness, source: str, *, action: str = "a", seed: int | None = 1):
    """Open, reset and step an environment that must not fault; return (reset, step) results."""
    env = harness.run(harness.service.open(source))
    try:
        first = harness.run(env.reset(seed=seed))
        result = harness.run(env.step(action))
    finally:
        harness.run(env.close())
    assert_no_secret(first, result)
    return first, result


@pytest.fixture(scope="module")
def quick() -> Iterable[SandboxHarness]:
    """A service with 1.5 s wall-clock limits, for the tests that must run into them."""
    harness = make_harness(**QUICK_TIMEOUTS)
    yield harness
    harness.close()


# -- load-time failures -------------------------------------------------------------------------

SYNTAX_ERRORS = {
    "unclosed_paren": "class BrokenEnv:\n    def reset(self, seed=None:\n        return 'x', {}\n",
    "bad_indent": "class BrokenEnv:\ndef reset(self):\n    pass\n",
    "nul_in_literal": "class BrokenEnv:\n    def reset(self, seed=None):\n        return 'a\x00b', {}\n",
    "only_nul": "\x00",
    "nul_after_valid_code": BENIGN + "\x00\x00",
    "lone_surrogate": "x = '\ud800'\n" + BENIGN,
    "garbage": "}{][)(::",
    "fstring": "x = f'{'\n",
}


@pytest.mark.parametrize("name", SYNTAX_ERRORS)
def test_syntax_errors_and_nul_bytes(sandbox, name):
    """Sources that do not compile (incl. NUL bytes, lone surrogates) -> syntax_error at load."""
    expect_fault(sandbox, SYNTAX_ERRORS[name], K.SYNTAX_ERROR, Stage.LOAD)


NO_ENV_CLASS = {
    "empty": "",
    "functions_only": "def reset(seed=None):\n    return 'x', {}\n",
    "wrong_name": "class Game:\n    def reset(self, seed=None): return 'x', {}\n    def step(self, a): return 'x', 0.0, True, False, {}\n",
    "not_a_class": "GameEnv = 3\n",
    "no_step": "class HalfEnv:\n    def reset(self, seed=None): return 'x', {}\n",
    "step_not_callable": "class HalfEnv:\n    step = 3\n    def reset(self, seed=None): return 'x', {}\n",
    "imported_only": "from collections import OrderedDict as OrderedEnv\n",
}


@pytest.mark.parametrize("name", NO_ENV_CLASS)
def test_no_env_class(sandbox, name):
    """Modules without a usable *Env class (none, not a class, no step, imported) -> no_env_class."""
    expect_fault(sandbox, NO_ENV_CLASS[name], K.NO_ENV_CLASS, Stage.LOAD)


BLOCKED_IMPORTS = {
    "os": "import os",
    "subprocess": "import subprocess",
    "socket": "import socket",
    "ctypes": "import ctypes",
    "from_os": "from os import system",
    "os_path": "import os.path",
    "importlib": "import importlib",
    "builtins": "import builtins",
    "dunder_import": "__import__('os')",
    "relative": "from . import sibling",
    "pickle": "import pickle",
}


@pytest.mark.parametrize("name", BLOCKED_IMPORTS)
def test_blocked_imports_in_module_body(sandbox, name):
    """Importing os/subprocess/socket/ctypes/... in the module body -> import_blocked at load."""
    error = expect_fault(sandbox, env_source(module=BLOCKED_IMPORTS[name]), K.IMPORT_BLOCKED, Stage.LOAD)
    assert "not allowed" in error.message


@pytest.mark.parametrize("where,stage", [("init", Stage.LOAD), ("reset", Stage.RESET), ("step", Stage.STEP)])
def test_blocked_imports_at_runtime(sandbox, where, stage):
    """An import of os inside __init__/reset/step -> import_blocked at that stage."""
    expect_fault(sandbox, env_source(**{where: "import os"}), K.IMPORT_BLOCKED, stage)


# -- exceptions ---------------------------------------------------------------------------------

EXCEPTION_CASES = [
    ("module", "raise ValueError('boom in module')", K.INIT_ERROR, Stage.LOAD),
    ("init", "raise ValueError('boom in init')", K.INIT_ERROR, Stage.LOAD),
    ("init", "self.x = 1 / 0", K.INIT_ERROR, Stage.LOAD),
    ("reset", "raise RuntimeError('boom in reset')", K.RESET_ERROR, Stage.RESET),
    ("reset", "return undefined_name, {}", K.RESET_ERROR, Stage.RESET),
    ("step", "raise RuntimeError('boom in step')", K.STEP_ERROR, Stage.STEP),
    ("step", "[][5]", K.STEP_ERROR, Stage.STEP),
    ("step", "raise Exception('x' * 100_000)", K.STEP_ERROR, Stage.STEP),
]


@pytest.mark.parametrize("where,code,kind,stage", EXCEPTION_CASES, ids=case_ids(EXCEPTION_CASES))
def test_exceptions(sandbox, where, code, kind, stage):
    """An exception in module/__init__ -> init_error, in reset -> reset_error, in step -> step_error."""
    error = expect_fault(sandbox, env_source(**{where: code}), kind, stage)
    assert len(error.message) <= 2_000  # a huge exception message is cut


def test_init_requiring_arguments(sandbox):
    """An env class whose __init__ needs arguments the service does not pass -> init_error."""
    source = "class NeedyEnv:\n    def __init__(self, board): pass\n" \
             "    def reset(self, seed=None): return 'x', {}\n    def step(self, a): return 'x', 0.0, True, False, {}\n"
    expect_fault(sandbox, source, K.INIT_ERROR, Stage.LOAD)


def test_exception_with_broken_str(sandbox):
    """An exception whose __str__ itself raises, thrown from step -> step_error (not exit_called)."""
    code = """
    class Nasty(Exception):
        def __str__(self):
            raise ValueError('no str for you')
    raise Nasty()
    """
    expect_fault(sandbox, env_source(step=code), K.STEP_ERROR, Stage.STEP)


@pytest.mark.parametrize("where,kind,stage", [("module", K.INIT_ERROR, Stage.LOAD),
                                              ("reset", K.RESET_ERROR, Stage.RESET),
                                              ("step", K.STEP_ERROR, Stage.STEP)])
def test_deep_recursion(sandbox, where, kind, stage):
    """Unbounded Python recursion under the default limit -> RecursionError, classified per stage."""
    code = "def dive(n):\n    return dive(n + 1)\ndive(0)"
    error = expect_fault(sandbox, env_source(**{where: code}), kind, stage)
    assert "RecursionError" in error.message


C_STACK_OVERFLOWS = {
    "map_recursion": "import sys\nsys.setrecursionlimit(10**8)\n"
                     "def dive(n):\n    return list(map(dive, [n + 1]))\ndive(0)",
    "repr_recursion": "import sys\nsys.setrecursionlimit(10**8)\n"
                      "class R:\n    def __repr__(self):\n        return repr(self)\nrepr(R())",
}


@pytest.mark.parametrize("name", C_STACK_OVERFLOWS)
def test_c_stack_overflow(sandbox, name):
    """A huge recursion limit (via sys) plus recursion through C frames -> crashed or step_error."""
    expect_fault(sandbox, env_source(step=C_STACK_OVERFLOWS[name]), {K.CRASHED, K.STEP_ERROR}, Stage.STEP)


# -- return values ------------------------------------------------------------------------------

BAD_RETURNS = [
    ("reset", "return 'just a string'", Stage.RESET),
    ("reset", "return None", Stage.RESET),
    ("reset", "return ('obs', {}, 'extra')", Stage.RESET),
    ("reset", "return ['obs', {}]", Stage.RESET),
    ("reset", "return 42, {}", Stage.RESET),
    ("reset", "return b'bytes', {}", Stage.RESET),
    ("reset", "return 'obs', []", Stage.RESET),
    ("reset", "return 'obs', None", Stage.RESET),
    ("step", "return 'obs', 0.0, False, {}", Stage.STEP),
    ("step", "return None", Stage.STEP),
    ("step", "return ['obs', 0.0, False, False, {}]", Stage.STEP),
    ("step", "return 'obs', 0.0, False, False, {}, 'extra'", Stage.STEP),
    ("step", "return None, 0.0, False, False, {}", Stage.STEP),
    ("step", "return 'obs', '1.0', False, False, {}", Stage.STEP),
    ("step", "return 'obs', None, False, False, {}", Stage.STEP),
    ("step", "return 'obs', True, False, False, {}", Stage.STEP),
    ("step", "return 'obs', 1j, False, False, {}", Stage.STEP),
    ("step", "return 'obs', [1.0], False, False, {}", Stage.STEP),
    ("step", "return 'obs', 0.0, 1, False, {}", Stage.STEP),
    ("step", "return 'obs', 0.0, False, None, {}", Stage.STEP),
    ("step", "return 'obs', 0.0, 'yes', False, {}", Stage.STEP),
    ("step", "return 'obs', 0.0, False, False, [('a', 1)]", Stage.STEP),
    ("step", "return 'obs', 0.0, False, False, None", Stage.STEP),
]


@pytest.mark.parametrize("where,code,stage", BAD_RETURNS, ids=case_ids(BAD_RETURNS))
def test_wrong_return_shapes_and_types(sandbox, where, code, stage):
    """reset/step returning the wrong shape or element types -> bad_return at that stage."""
    expect_fault(sandbox, env_source(**{where: code}), K.BAD_RETURN, stage)


@pytest.mark.parametrize("reward", ["float('nan')", "float('inf')", "float('-inf')", "1e308 * 10",
                                    "-float('nan')"])
def test_nan_and_inf_rewards(sandbox, reward):
    """A NaN or infinite reward -> bad_return at step."""
    expect_fault(sandbox, env_source(step=f"return 'obs', {reward}, False, False, {{}}"), K.BAD_RETURN, Stage.STEP)


def test_reward_int_too_large_for_float(sandbox):
    """An integer reward with no finite float value (10**400) -> bad_return, like inf."""
    expect_fault(sandbox, env_source(step="return 'obs', 10**400, False, False, {}"), K.BAD_RETURN, Stage.STEP)


INFO_HELPERS = """
def circular():
    d = {}
    d["self"] = d
    return d

def nested(depth):
    d = {}
    for _ in range(depth):
        d = {"a": d}
    return d
"""
UNSERIALISABLE_INFO = {
    "set": "{'s': {1, 2}}",
    "object": "{'o': object()}",
    "bytes": "{'b': b'raw'}",
    "nan_value": "{'x': float('nan')}",
    "inf_value": "{'x': [1.0, float('-inf')]}",
    "tuple_key": "{(1, 2): 'v'}",
    "circular": "circular()",
    "deep_nesting": "nested(200)",
    "huge_int": "{'x': 10**5000}",
    "function": "{'f': len}",
}


@pytest.mark.parametrize("name", UNSERIALISABLE_INFO)
@pytest.mark.parametrize("where", ["reset", "step"])
def test_unserialisable_info(sandbox, name, where):
    """info that JSON cannot carry (sets, objects, NaN, cycles, 200 levels deep, ...) -> not_serializable."""
    info = UNSERIALISABLE_INFO[name]
    code = f"return 'obs', {info}" if where == "reset" else f"return 'obs', 0.0, False, False, {info}"
    stage = Stage.RESET if where == "reset" else Stage.STEP
    expect_fault(sandbox, env_source(module=INFO_HELPERS, **{where: code}), K.NOT_SERIALIZABLE, stage)


HUGE_OUTPUTS = [
    ("reset", "return 'o' * 100_000, {}", Stage.RESET),
    ("step", "return 'o' * 100_000, 0.0, False, False, {}", Stage.STEP),
    ("step", "return 'o' * 10_000_000, 0.0, False, False, {}", Stage.STEP),
    ("step", "return 'obs', 0.0, False, False, {'blob': 'y' * 2_000_000}", Stage.STEP),
    ("step", "return 'obs', 0.0, False, False, {'many': list(range(400_000))}", Stage.STEP),
    ("reset", "return 'obs', {'blob': '\\x01' * 300_000}", Stage.RESET),  # 6 bytes each in JSON
]


@pytest.mark.parametrize("where,code,stage", HUGE_OUTPUTS, ids=case_ids(HUGE_OUTPUTS))
def test_huge_observations(sandbox, where, code, stage):
    """Observations over max_observation_chars, or results over max_frame_bytes -> output_too_large."""
    expect_fault(sandbox, env_source(**{where: code}), K.OUTPUT_TOO_LARGE, stage)


def test_observation_str_subclass_lying_about_length(sandbox):
    """A str subclass whose __len__ lies to slip a 100k observation past the child's check -> refused."""
    code = """
    class Small(str):
        def __len__(self):
            return 1
    return Small('o' * 100_000), 0.0, False, False, {}
    """
    expect_fault(sandbox, env_source(step=code), {K.OUTPUT_TOO_LARGE, K.PROTOCOL_ERROR}, Stage.STEP)


def test_largest_allowed_observation_passes(sandbox):
    """Control: an observation of exactly max_observation_chars (worst-case JSON escaping) is delivered."""
    limit = sandbox.config.max_observation_chars
    _, result = run_ok(sandbox, env_source(step=f"return '\\x01' * {limit}, 0.5, True, False, {{'n': 1}}"))
    assert result.observation == "\x01" * limit and result.reward == 0.5 and result.terminated


# -- exits and crashes --------------------------------------------------------------------------

EXIT_CASES = [
    ("module", "raise SystemExit(3)", Stage.LOAD),
    ("init", "import sys\nsys.exit(0)", Stage.LOAD),
    ("reset", "raise KeyboardInterrupt", Stage.RESET),
    ("reset", "import sys\nsys.exit('bye')", Stage.RESET),
    ("step", "raise SystemExit", Stage.STEP),
    ("step", "raise KeyboardInterrupt", Stage.STEP),
    ("step", "raise GeneratorExit", Stage.STEP),
]


@pytest.mark.parametrize("where,code,stage", EXIT_CASES, ids=case_ids(EXIT_CASES))
def test_system_exit_and_keyboard_interrupt(sandbox, where, code, stage):
    """SystemExit / KeyboardInterrupt / GeneratorExit anywhere -> exit_called at that stage."""
    expect_fault(sandbox, env_source(**{where: code}), K.EXIT_CALLED, stage)


OS_EXIT_ROUTES = {
    "random._os": "import random\nrandom._os._exit(0)",
    "sys.modules": "import sys\nsys.modules['os']._exit(7)",
    "subclasses": "g = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close']"
                  "[0].__init__.__globals__\ng['_exit'](9)",
    "random.__builtins__": "import random\nrandom.__builtins__['__import__']('os')._exit(1)",
}


@pytest.mark.parametrize("name", OS_EXIT_ROUTES)
@pytest.mark.parametrize("where,stage", [("module", Stage.LOAD), ("step", Stage.STEP)])
def test_os_exit_via_escapes(sandbox, name, where, stage):
    """os._exit reached around the import gate (random._os, sys.modules, __subclasses__) -> exit_called."""
    expect_fault(sandbox, env_source(**{where: OS_EXIT_ROUTES[name]}), K.EXIT_CALLED, stage)


SEGFAULTS = {
    "ctypes_via_sys_modules": "import sys\nsys.modules['ctypes'].string_at(0)",
    "ctypes_via_importlib": "import sys\nsys.modules['importlib'].import_module('ctypes').memset(0, 1, 64)",
    "ctypes_via_subclasses": "g = [k for k in object.__subclasses__() if k.__name__ == 'CDLL'][0].__init__.__globals__\n"
                             "g['string_at'](0)",
    "faulthandler": "import sys\nsys.modules['importlib'].import_module('faulthandler')._sigsegv()",
    "abort": "import sys\nsys.modules['os'].abort()",
}


@pytest.mark.parametrize("name", SEGFAULTS)
def test_segfault_via_ctypes(sandbox, name):
    """A segfault (ctypes reached through sys.modules/importlib; faulthandler; abort) -> crashed."""
    error = expect_fault(sandbox, env_source(step=SEGFAULTS[name]), K.CRASHED, Stage.STEP)
    assert "SIGSEGV" in error.message or "SIGABRT" in error.message


# -- wall clock, CPU and memory -----------------------------------------------------------------

TIMEOUTS = [
    ("module", "while True:\n    pass", Stage.LOAD),
    ("init", "while True:\n    pass", Stage.LOAD),
    ("reset", "while True:\n    pass", Stage.RESET),
    ("step", "while True:\n    pass", Stage.STEP),
    ("step", "import re\nre.match('(a*)*b', 'a' * 40)", Stage.STEP),  # a loop in C, no bytecode boundary
    ("step", "x = 0\nwhile True:\n    try:\n        x += 1\n    except BaseException:\n        pass", Stage.STEP),
]


@pytest.mark.parametrize("where,code,stage", TIMEOUTS, ids=case_ids(TIMEOUTS))
def test_infinite_loops(quick, where, code, stage):
    """Infinite loops in module body, __init__, reset, step (also inside C) -> timeout at that stage."""
    error = expect_fault(quick, env_source(**{where: code}), K.TIMEOUT, stage)
    assert "did not finish" in error.message


@pytest.mark.parametrize("where,stage", [("module", Stage.LOAD), ("reset", Stage.RESET), ("step", Stage.STEP)])
def test_sleeps(quick, where, stage):
    """time.sleep longer than the call's wall-clock limit -> timeout at that stage."""
    expect_fault(quick, env_source(**{where: "import time\ntime.sleep(3600)"}), K.TIMEOUT, stage)


SWALLOWED_MEMORY_ERRORS = {
    "hoard_and_retry": "hoard = []\nwhile True:\n    try:\n        hoard.append(' ' * 10**6)\n"
                       "    except MemoryError:\n        pass",
    "retry_huge": "while True:\n    try:\n        x = bytearray(10**10)\n    except MemoryError:\n        pass",
    "hoard_then_return": "hoard = []\ntry:\n    while True:\n        hoard.append(' ' * 10**6)\n"
                        "except MemoryError:\n    pass\nself.hoard = hoard\nreturn 'x' * 1000, 0.0, False, False, "
                        "{'n': [0] * 10**5}",
}


@pytest.mark.parametrize("name", SWALLOWED_MEMORY_ERRORS)
def test_swallowing_memory_error(quick, name):
    """Catching MemoryError and carrying on (retrying, or hoarding the heap) -> memory_limit or timeout."""
    expect_fault(quick, env_source(step=SWALLOWED_MEMORY_ERRORS[name]), {K.MEMORY_LIMIT, K.TIMEOUT}, Stage.STEP)


ALLOCATIONS = [
    ("module", "x = bytearray(10**10)", Stage.LOAD),
    ("init", "self.x = ' ' * 10**12", Stage.LOAD),
    ("reset", "x = [0] * 10**10", Stage.RESET),
    ("step", "x = bytearray(10**10)", Stage.STEP),
    ("step", "x = []\nwhile True:\n    x.append(' ' * 10**6)", Stage.STEP),
    # many small objects: 80 KB lists (below malloc's mmap threshold), so the limit is reached in a few
    # thousand iterations, well inside the step timeout on a loaded machine (8 KB lists timed out at 3 s there)
    ("step", "d = {}\ni = 0\nwhile True:\n    d[i] = [i] * 10000\n    i += 1", Stage.STEP),
    ("step", "s = 'x'\nwhile True:\n    s = s + s", Stage.STEP),
]


@pytest.mark.parametrize("where,code,stage", ALLOCATIONS, ids=case_ids(ALLOCATIONS))
def test_huge_and_growing_allocations(sandbox, where, code, stage):
    """One huge allocation or steady growth past memory_limit_mb -> memory_limit at that stage."""
    expect_fault(sandbox, env_source(**{where: code}), K.MEMORY_LIMIT, stage)


@pytest.fixture(scope="module")
def cpu_limited() -> Iterable[SandboxHarness]:
    """A service whose children get 1 s of CPU time and a generous wall clock."""
    harness = make_harness(cpu_limit_s=1, load_timeout_s=8.0, reset_timeout_s=8.0, step_timeout_s=8.0)
    yield harness
    harness.close()


def test_cpu_limit(cpu_limited):
    """A busy loop that outlives RLIMIT_CPU (but not the wall clock) -> cpu_limit (SIGXCPU)."""
    expect_fault(cpu_limited, env_source(step="while True:\n    pass"), K.CPU_LIMIT, Stage.STEP)


def test_cpu_limit_with_sigxcpu_ignored(cpu_limited):
    """Ignoring SIGXCPU does not buy more CPU: the hard limit kills the child -> crashed (SIGKILL)."""
    code = "import sys\nsig = sys.modules['signal']\nsig.signal(sig.SIGXCPU, sig.SIG_IGN)\nwhile True:\n    pass"
    expect_fault(cpu_limited, env_source(step=code), {K.CRASHED, K.CPU_LIMIT}, Stage.STEP)


# -- process creation, sockets, signals ---------------------------------------------------------

VIOLATIONS = {
    # fork and thread bombs
    "fork": "import sys\nsys.modules['os'].fork()",
    "fork_bomb": "import sys\nos = sys.modules['os']\nwhile True:\n    os.fork()",
    "thread": "import sys\nsys.modules['_thread'].start_new_thread(print, ('hi',))",
    "thread_bomb": "import sys\nthreading = sys.modules['importlib'].import_module('threading')\n"
                   "while True:\n    threading.Thread(target=lambda: None).start()",
    "thread_pool": "import sys\ncf = sys.modules['importlib'].import_module('concurrent.futures')\n"
                   "cf.ThreadPoolExecutor(8).submit(print, 1).result()",
    # subprocesses
    "os_system": "import sys\nsys.modules['os'].system('touch /tmp/pwned')",
    "os_system_subclasses": "g = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close']"
                            "[0].__init__.__globals__\ng['system']('id')",
    "posix_spawn": "import sys\nsys.modules['os'].posix_spawn('/bin/true', ['true'], {})",
    "execv": "import sys\nsys.modules['os'].execv('/bin/sh', ['sh', '-c', 'id'])",
    "popen": "import random\nrandom._os.popen('id').read()",
    "subprocess_run": "import sys\nsys.modules['importlib'].import_module('subprocess').run(['id'])",
    "mkfifo": "import sys\nsys.modules['os'].mkfifo('/tmp/fifo')",  # mknod is denied outright
    # sockets
    "socket_inet": "import sys\ns = sys.modules['socket']\ns.socket(s.AF_INET, s.SOCK_STREAM)",
    "socket_unix": "import sys\ns = sys.modules['socket']\ns.socket(s.AF_UNIX, s.SOCK_DGRAM)",
    "socketpair": "import sys\nsys.modules['socket'].socketpair()",
    "create_connection": "import sys\nsys.modules['socket'].create_connection(('127.0.0.1', 22), timeout=1)",
}


@pytest.mark.parametrize("name", VIOLATIONS)
def test_process_creation_and_sockets(sandbox, name):
    """fork/thread bombs, os.system/posix_spawn/exec/subprocess, mknod, new sockets -> sandbox_violation."""
    error = expect_fault(sandbox, env_source(step=VIOLATIONS[name]), K.SANDBOX_VIOLATION, Stage.STEP)
    assert "seccomp" in error.message


def test_socket_in_module_body(sandbox):
    """Opening a socket while the module loads -> sandbox_violation at load."""
    code = "import sys\ns = sys.modules['socket']\ns.socket(s.AF_INET, s.SOCK_STREAM).connect(('10.0.0.1', 80))"
    expect_fault(sandbox, env_source(module=code), K.SANDBOX_VIOLATION, Stage.LOAD)


SIGNALS = {
    "parent_sigkill": "os.kill(os.getppid(), 9)",
    "everyone_sigkill": "os.kill(-1, 9)",
    "own_group": "os.kill(0, 9)",
    "killpg": "os.killpg(os.getpgrp(), 15)",
    "pid_1": "os.kill(1, 9)",
    "parent_sigstop": "os.kill(os.getppid(), 19)",
    "probe_signal_0": "os.kill(os.getppid(), 0)",
}


@pytest.mark.parametrize("name", SIGNALS)
def test_signals_to_others(sandbox, name):
    """Signals to the parent (zygote), to -1, to the process group or pid 1 -> sandbox_violation."""
    code = "import sys\nos = sys.modules['os']\n" + SIGNALS[name]
    expect_fault(sandbox, env_source(step=code), K.SANDBOX_VIOLATION, Stage.STEP)


# -- the filesystem -----------------------------------------------------------------------------

WRITE_PROBE = '''
import sys, json
os = sys.modules["os"]
io = sys.modules["io"]

def attempt(action):
    try:
        action()
    except OSError as exc:
        return [type(exc).__name__, exc.errno]
    return ["succeeded", 0]

def try_writes(target):
    return {
        "io.open": attempt(lambda: io.open(target, "w").write("pwned")),
        "os.open": attempt(lambda: os.write(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644), b"pwned")),
        "os.mkdir": attempt(lambda: os.mkdir(target + ".d")),
        "os.symlink": attempt(lambda: os.symlink("/etc/passwd", target + ".lnk")),
    }
'''
WRITE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT}


def write_targets(tag: str) -> dict[str, tuple[str, Path]]:
    """name -> (path as the sandbox sees it, the same place on the host)."""
    name = f"spade-hostile-{tag}-{uuid.uuid4().hex}"
    return {
        "tmp": (f"/tmp/{name}", Path("/tmp") / name),
        "repo": (str(REPO / name), REPO / name),
        "runtime_dir": (f"{RUNTIME_INSIDE}/{name}.py", RUNTIME_DIR / f"{name}.py"),
        "python_prefix": (str(PREFIX / name), PREFIX / name),
        "root_home": (f"/root/{name}", Path("/root") / name),
    }


def host_leftovers(host: Path) -> list[Path]:
    return [p for p in (host, *(Path(str(host) + s) for s in (".d", ".lnk"))) if os.path.lexists(p)]


@pytest.mark.parametrize("place", ["tmp", "repo", "runtime_dir", "python_prefix", "root_home"])
def test_writes_to_the_filesystem_fail(sandbox, place):
    """File writes/mkdir/symlink anywhere fail inside (env reports the OSError); nothing on the host."""
    inside, host = write_targets(place)[place]
    source = env_source(module=WRITE_PROBE, step=f"return json.dumps(try_writes({inside!r})), 0.0, False, False, {{}}")
    try:
        _, result = run_ok(sandbox, source)
        outcomes = json.loads(result.observation)
        for how, (name, code) in outcomes.items():
            assert name != "succeeded", f"{how} on {inside} succeeded inside the sandbox"
            assert code in WRITE_ERRNOS, (how, name, code)
        if place == "tmp":  # /tmp exists inside (a private tmpfs): Landlock is what refuses
            assert outcomes["io.open"] == ["PermissionError", errno.EACCES]
        assert not host_leftovers(host), "a write from inside the sandbox reached the host"
    finally:
        for path in host_leftovers(host):
            path.unlink() if not path.is_dir() or path.is_symlink() else path.rmdir()
    assert_healthy(sandbox)


def test_uncaught_write_is_a_step_error(sandbox):
    """A write whose PermissionError the env does not catch -> step_error; no file on the host."""
    inside, host = write_targets("uncaught")["tmp"]
    code = f"import sys\nsys.modules['io'].open({inside!r}, 'w').write('pwned')"
    error = expect_fault(sandbox, env_source(step=code), K.STEP_ERROR, Stage.STEP)
    assert "PermissionError" in error.message
    assert not host.exists()


@pytest.fixture()
def victim_file() -> Iterable[Path]:
    """A file on the host inside the (read-only-bound) Python prefix, visible to the sandbox."""
    if not os.access(PREFIX, os.W_OK):
        pytest.skip("the Python prefix is not writable by this user: no host file to plant")
    path = PREFIX / f"spade-hostile-victim-{uuid.uuid4().hex}.txt"
    path.write_text("original")
    yield path
    path.unlink(missing_ok=True)


def test_tampering_with_visible_host_files_fails(sandbox, victim_file):
    """Truncating, appending, unlinking, renaming, chmod-ing a host file visible inside all fail."""
    target = str(victim_file)
    code = f"""
    target = {target!r}
    outcomes = {{
        "truncate_open": attempt(lambda: io.open(target, "w")),
        "append": attempt(lambda: io.open(target, "a").write("x")),
        "os.truncate": attempt(lambda: os.truncate(target, 0)),
        "unlink": attempt(lambda: os.unlink(target)),
        "rename": attempt(lambda: os.rename(target, target + ".moved")),
        "chmod": attempt(lambda: os.chmod(target, 0o777)),
        "utime": attempt(lambda: os.utime(target, (0, 0))),
    }}
    return json.dumps(outcomes), 0.0, False, False, {{}}
    """
    _, result = run_ok(sandbox, env_source(module=WRITE_PROBE, step=code))
    for how, (name, _code) in json.loads(result.observation).items():
        assert name != "succeeded", f"{how} on a host file succeeded"
    assert victim_file.read_text() == "original"
    assert oct(victim_file.stat().st_mode & 0o777) != oct(0o777)
    assert not Path(target + ".moved").exists()
    assert_healthy(sandbox)


# -- secrets ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secret_files() -> Iterable[list[Path]]:
    """The secret in host files: in /tmp, in /root, and next to (not inside) the bound Python prefix."""
    name = f"spade-hostile-{uuid.uuid4().hex}-secret"
    paths = [d / name for d in (Path("/tmp"), Path("/root"), PREFIX.parent) if os.access(d, os.W_OK)]
    for path in paths:
        path.write_text(SECRET)
    yield paths
    for path in paths:
        path.unlink(missing_ok=True)


READ_PROBE = '''
import sys, json
os = sys.modules["os"]
io = sys.modules["io"]

def read(path):
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return "READ:" + os.read(fd, 1 << 16).decode("utf-8", "replace")
        finally:
            os.close(fd)
    except OSError as exc:
        return f"{type(exc).__name__}:{exc.errno}"

def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return f"{type(exc).__name__}:{exc.errno}"
'''


def test_reading_secrets_finds_nothing(sandbox, secret_files):
    """Reading host secret files, /etc/shadow, /etc/passwd, /proc/*/environ, os.environ reveals no secret."""
    supervisor_env = Path(f"/proc/{sandbox.service._process.pid}/environ").read_bytes()
    assert SECRET.encode() in supervisor_env, "test setup: the secret must be in the host-side environment"
    paths = [str(p) for p in secret_files] + [
        "/etc/shadow", "/etc/passwd", "/etc/hostname", "/proc/1/environ", "/proc/self/environ",
        "/proc/1/cmdline", "/proc/self/status", "/root/.bash_history", "/root/.ssh/id_rsa",
        str(REPO / "README.md"), "/proc/sys/kernel/hostname"]
    code = f"""
    found = {{path: read(path) for path in {paths!r}}}
    found["ppid_environ"] = read(f"/proc/{{os.getppid()}}/environ")
    found["environ"] = dict(os.environ)
    found["getenv"] = os.getenv("SPADE_TEST_SECRET")
    try:
        found["io_open"] = io.open({str(secret_files[0])!r}).read()
    except OSError as exc:
        found["io_open"] = type(exc).__name__
    found["ls_root"] = listing("/")
    found["ls_tmp"] = listing("/tmp")
    found["ls_root_home"] = listing("/root")
    return json.dumps(found)[:60000], 0.0, False, False, {{"environ": dict(os.environ)}}
    """
    first, result = run_ok(sandbox, env_source(module=READ_PROBE, step=code))
    assert_no_secret(first, result)
    found = json.loads(result.observation)
    for path in [str(p) for p in secret_files] + ["/etc/shadow", "/etc/passwd", "/proc/1/environ",
                                                  "/proc/self/environ", "/root/.ssh/id_rsa", str(REPO / "README.md")]:
        assert not found[path].startswith("READ:"), f"{path} was readable inside the sandbox: {found[path][:200]}"
    assert not found["ppid_environ"].startswith("READ:")
    assert set(found["environ"]) <= {"LANG", "LC_CTYPE", "PWD"}, found["environ"]
    assert found["getenv"] is None and found["io_open"] in ("PermissionError", "FileNotFoundError")
    host_passwd_first_line = Path("/etc/passwd").read_text().splitlines()[0]
    assert host_passwd_first_line not in result.observation
    assert "SPADE_TEST_SECRET" not in result.observation
    assert_healthy(sandbox)


@pytest.mark.parametrize("where,stage", [("module", Stage.LOAD), ("reset", Stage.RESET), ("step", Stage.STEP)])
def test_secrets_do_not_leak_through_error_messages(sandbox, secret_files, where, stage):
    """An env that reads a secret file and raises with its contents: the read fails, no secret in the error."""
    kinds = {Stage.LOAD: K.INIT_ERROR, Stage.RESET: K.RESET_ERROR, Stage.STEP: K.STEP_ERROR}
    for secret_file in secret_files:
        code = f"import sys\nos = sys.modules['os']\nraise ValueError(os.read(os.open({str(secret_file)!r}, 0), 999))"
        error = expect_fault(sandbox, env_source(**{where: code}), kinds[stage], stage)
        assert "PermissionError" in error.message or "FileNotFoundError" in error.message


# -- forged protocol frames ---------------------------------------------------------------------

FORGE = '''
import sys, json, struct
os = sys.modules["os"]
stat = sys.modules["stat"]

def channel():
    """The child's own socket to the supervisor, found by scanning descriptors."""
    socks = []
    for fd in range(3, 1024):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                socks.append(fd)
        except OSError:
            pass
    return socks

def send_raw(data):
    os.write(channel()[0], data)

def send_frame(payload):
    send_raw(struct.pack(">I", len(payload)) + payload)

def current_seq():
    """The sequence number of the request being served, read from the runtime's stack frames."""
    frame = sys._getframe()
    while frame is not None:
        request = frame.f_locals.get("request")
        if isinstance(request, dict) and "seq" in request:
            return request["seq"]
        frame = frame.f_back
    raise RuntimeError("no request on the stack")

def reply(seq, **fields):
    base = {"seq": seq, "ok": True, "output": "", "output_dropped": 0,
            "result": {"observation": "forged", "reward": 1.0, "terminated": True, "truncated": False, "info": {}}}
    base.update(fields)
    return json.dumps(base).encode()
'''

FORGERIES = {
    "huge_length_header": "send_raw(b'\\xff\\xff\\xff\\xff')",
    "length_over_frame_limit": "send_raw(struct.pack('>I', (1 << 20) + 1) + b'{}')",
    "deeply_nested_json": "send_frame(b'[' * 200_000 + b']' * 200_000)",
    "nested_past_depth_limit": "d = {}\nfor _ in range(100):\n    d = {'a': d}\n"
                               "send_frame(reply(current_seq(), result={'observation': 'o', 'reward': 0, "
                               "'terminated': False, 'truncated': False, 'info': d}))",
    "not_json": "send_frame(b'\\xff\\xfe not json at all')",
    "wrong_sequence_number": "send_frame(reply(current_seq() + 100))",
    "stale_sequence_number": "send_frame(reply(current_seq() - 1))",
    "sequence_number_as_string": "send_frame(reply(str(current_seq())))",
    "forbidden_error_kind": "send_frame(reply(current_seq(), ok=False, error={'kind': 'timeout', 'message': 'x'}))",
    "infrastructure_error_kind": "send_frame(reply(current_seq(), ok=False, "
                                 "error={'kind': 'crashed', 'message': 'blame the sandbox'}))",
    "nan_reward": "send_frame(reply(current_seq()).replace(b'\"reward\": 1.0', b'\"reward\": NaN'))",
    "bool_reward": "send_frame(reply(current_seq()).replace(b'\"reward\": 1.0', b'\"reward\": true'))",
    "output_over_cap": "send_frame(reply(current_seq(), output='x' * 100_000))",
    "observation_over_limit": "send_frame(reply(current_seq(), result={'observation': 'o' * 100_000, "
                              "'reward': 0, 'terminated': False, 'truncated': False, 'info': {}}))",
    "missing_fields": "send_frame(json.dumps({'seq': current_seq(), 'ok': True}).encode())",
    "not_an_object": "send_frame(b'[1, 2, 3]')",
}


@pytest.mark.parametrize("name", FORGERIES)
def test_forged_protocol_frames(sandbox, name):
    """The env writes its own frame on its socket (huge length, deep JSON, wrong seq, ...) -> protocol_error."""
    error = expect_fault(sandbox, env_source(module=FORGE, step=FORGERIES[name]), K.PROTOCOL_ERROR, Stage.STEP)
    assert not error.infrastructure


def test_forged_valid_frame_desynchronises_and_is_caught(sandbox):
    """A well-formed forged reply is indistinguishable, but the real reply left behind -> protocol_error next call."""
    source = env_source(module=FORGE, step="send_frame(reply(current_seq()))")
    env = sandbox.run(sandbox.service.open(source))
    sandbox.run(env.reset(seed=1))
    forged = sandbox.run(env.step("a"))
    assert forged.observation == "forged"  # the env controls its own results anyway
    with pytest.raises(EnvFault) as caught:
        sandbox.run(env.step("b"))
    assert caught.value.error.kind is K.PROTOCOL_ERROR and caught.value.error.stage is Stage.STEP
    assert_healthy(sandbox)


def test_only_its_own_socket_is_reachable(sandbox):
    """Scanning every descriptor finds exactly one socket (its own): no zygote channel, no siblings."""
    _, result = run_ok(sandbox, env_source(module=FORGE, step="return json.dumps(channel()), 0.0, False, False, {}"))
    assert len(json.loads(result.observation)) == 1


# -- sources ------------------------------------------------------------------------------------


def test_huge_source(sandbox):
    """A source over max_source_bytes -> source_too_large at load, before any sandbox work."""
    source = BENIGN + "# " + "x" * sandbox.config.max_source_bytes + "\n"
    expect_fault(sandbox, source, K.SOURCE_TOO_LARGE, Stage.LOAD)


def test_huge_source_past_the_client_check(sandbox):
    """A huge source sent straight to the supervisor (bypassing the client's check) -> source_too_large."""
    source = BENIGN + "# " + "é" * (sandbox.config.max_source_bytes // 2) + "\n"  # 2 bytes each in UTF-8
    with pytest.raises(EnvFault) as caught:
        sandbox.run(sandbox.service._request("open", source=source, max_turns=None))
    assert caught.value.error.kind is K.SOURCE_TOO_LARGE and caught.value.error.stage is Stage.LOAD
    assert_healthy(sandbox)


def test_source_at_the_limit_loads(sandbox):
    """Control: a valid source padded to just under max_source_bytes loads and runs."""
    padding = sandbox.config.max_source_bytes - len(BENIGN.encode()) - 10
    run_ok(sandbox, BENIGN + "# " + "x" * padding + "\n")


@pytest.fixture()
def own_harness() -> Iterable[SandboxHarness]:
    harness = make_harness()
    yield harness
    harness.close()


def test_source_inflated_by_json_escaping(own_harness):
    """A 400 KB source of control characters (under the limit) -> loads or is refused; other envs survive."""
    harness = own_harness
    other = harness.run(harness.service.open(BENIGN))
    harness.run(other.reset(seed=1))
    source = BENIGN + "# " + "\x01" * 400_000 + "\n"
    assert len(source.encode()) <= harness.config.max_source_bytes
    try:
        run_ok(harness, source)
    except EnvFault as exc:
        assert not exc.error.infrastructure, exc
    assert harness.service.running, "the supervisor died"
    assert harness.run(other.step("a")).observation == "count=1"


def test_huge_action_does_not_kill_the_supervisor(own_harness):
    """A 1 MB action is refused before it is sent; one at the limit arrives whole; other envs survive."""
    harness = own_harness
    other = harness.run(harness.service.open(BENIGN))
    harness.run(other.reset(seed=1))
    env = harness.run(harness.service.open(env_source(step="return str(len(action)), 0.0, False, False, {}")))
    harness.run(env.reset(seed=1))
    with pytest.raises(ValueError, match="max_action_chars"):
        harness.run(env.step("\x00" * 1_000_000))
    longest = "\x00" * harness.config.max_action_chars  # 6 bytes each once JSON-escaped
    assert harness.run(env.step(longest)).observation == str(len(longest))
    assert harness.service.running, "the supervisor died"
    assert harness.run(other.step("a")).observation == "count=1"


# -- isolation between environments -------------------------------------------------------------

PATCHER = '''
import sys, random, json
# Patches the runtime survives: the env's own builtins, random, the import path, the environment.
__builtins__["len"] = lambda obj: 42
__builtins__["print"] = None
random.random = lambda: 0.5
random.seed = lambda *a, **k: None
random.Random.random = lambda self: 0.25
sys.path.insert(0, "/tmp/evil")
sys.modules["os"].environ["PATCHED"] = "1"

class PatcherEnv:
    def reset(self, seed=None):
        # Patches that break this child's own runtime too (it may fault; it must not leak).
        sys.modules["builtins"].sorted = lambda *a, **k: ["patched"]
        sys.modules["math"] = None
        sys.setrecursionlimit(150)
        json.dumps = lambda *a, **k: "patched"
        sys.modules["builtins"].len = lambda obj: 43
        return "patched", {}

    def step(self, action):
        return "patched", 0.0, True, False, {}
'''

CHECKER = '''
import sys, random, json as _json

class CheckerEnv:
    def reset(self, seed=None):
        import math
        random.seed(1234)
        facts = {
            "len": len([1, 2]),
            "sorted": sorted([3, 1, 2]),
            "builtin_len": sys.modules["builtins"].len([1, 2, 3]),
            "print_is_builtin": type(print).__name__,
            "random_is_method": type(random.random).__name__,
            "random_value": random.random(),
            "instance_value": random.Random(99).random(),
            "dumps": _json.dumps({"a": 1}),
            "sqrt": math.sqrt(16),
            "recursion_limit": sys.getrecursionlimit(),
            "patched_env": "PATCHED" in sys.modules["os"].environ,
            "evil_path": "/tmp/evil" in sys.path,
        }
        return _json.dumps(facts), {}
    def step(self, action):
        return "ok", 0.0, True, False, {}
'''


def test_monkeypatching_does_not_leak_between_environments(sandbox):
    """Patching builtins, random, json, sys in one env never shows in the next (same zygotes reused)."""
    expected = {
        "len": 2, "sorted": [1, 2, 3], "builtin_len": 3, "print_is_builtin": "builtin_function_or_method",
        "random_is_method": "builtin_function_or_method", "random_value": random.Random(1234).random(),
        "instance_value": random.Random(99).random(), "dumps": '{"a": 1}', "sqrt": 4.0,
        "recursion_limit": sandbox.config.recursion_limit, "patched_env": False, "evil_path": False,
    }
    live_patchers = []
    for round_ in range(4):  # more rounds than sandboxes and warm children: zygotes are reused
        patcher = sandbox.run(sandbox.service.open(PATCHER))
        live_patchers.append(patcher)  # keep it alive while the next env is checked
        try:
            sandbox.run(patcher.reset(seed=round_))
        except EnvFault as exc:  # it broke its own runtime: its problem, but classified
            assert isinstance(exc.error.kind, ErrorKind) and not exc.error.infrastructure, exc
        checker = sandbox.run(sandbox.service.open(CHECKER))
        facts = json.loads(sandbox.run(checker.reset(seed=round_)).observation)
        sandbox.run(checker.close())
        assert facts == expected, f"round {round_}: a patch leaked into a fresh environment"
    for patcher in live_patchers:
        sandbox.run(patcher.close())
    assert_healthy(sandbox)


# -- output -------------------------------------------------------------------------------------

PRINTS = {
    "step_same_string": ("step", "s = 'x' * (1 << 20)\nfor _ in range(200):\n    print(s)"),
    "step_distinct_strings": ("step", "for i in range(200):\n    print(str(i % 10) * (1 << 20))"),
    "reset_stderr": ("reset", "import sys\nfor i in range(200):\n    sys.stderr.write('e' * (1 << 20))"),
    "step_sys_stdout_write": ("step", "import sys\nw = sys.stdout.write\nfor i in range(200):\n    w('w' * (1 << 20))"),
}


@pytest.mark.parametrize("name", PRINTS)
def test_200mb_of_prints(quick, name):
    """200 MB printed in one call: completes (or times out); captured output stays within its cap."""
    where, code = PRINTS[name]
    cap = quick.config.max_captured_output_bytes
    env = quick.run(quick.service.open(env_source(**{where: code})))
    try:
        try:
            first = quick.run(env.reset(seed=1))
            result = quick.run(env.step("a"))
        except EnvFault as exc:
            assert exc.error.kind is K.TIMEOUT, exc
        else:
            assert len(first.output) <= cap and len(result.output) <= cap
            printed = first.output if where == "reset" else result.output
            assert len(printed) == cap and set(printed) <= set("0123456789xew\n")
            assert result.observation == "obs"
    finally:
        quick.run(env.close())
    assert_healthy(quick)


def test_prints_before_a_fault_are_capped(sandbox):
    """Printing megabytes and then raising -> step_error; the error message stays bounded."""
    code = "for _ in range(50):\n    print('p' * (1 << 20))\nraise RuntimeError('after printing')"
    error = expect_fault(sandbox, env_source(step=code), K.STEP_ERROR, Stage.STEP)
    assert len(error.message) <= 2_000
