"""The judge environment that runs one program inside the sandbox, the way LiveCodeBench runs it.

This file is never imported by the host: ``code_judge.judge_source`` reads it as text, puts the
program's constants (``PROGRAM``, ``MODE``, ``FUNC``) in front and opens the result in the sandbox
service, where the environment class below is instantiated. ``reset`` loads the program once,
each ``step`` runs it on one test and returns a JSON verdict.

The execution model is that of ``lcb_runner/evaluation/testing_util.py`` at LiveCodeBench commit
28fef95 (the commit the released SPADE code pins in ``scripts/setup_lcb.sh``), re-implemented:

* the program gets LiveCodeBench's header (``import_string``: star imports from eighteen standard
  modules, typing and builtins included, plain imports of sixteen, recursion limit 50,000); the
  process allows integers of up to 50,000 digits as text (``compute_code_generation_metrics``);
* the process is guarded as ``reliability_guard`` guards it: ``quit`` is None (``exit`` is kept),
  and the ``os`` functions it clears are None; as the sandbox forbids new threads,
  ``threading.Thread.start`` runs the target at once (see ``_InlineThread``);
* stdin problems (``grade_stdio``): a last top-level ``if __name__ == '__main__':`` is inlined
  (``clean_if_name``), the top-level imports are kept at module level after the header and every
  other statement becomes the body of a function (``make_function``) that is called once per
  test; ``sys.stdin`` is replaced for the call (``MockStdinWithBuffer``, ``call_method``) and the
  stream object that was ``sys.stdin`` before has its ``read``/``readline``/``readlines`` patched
  (LiveCodeBench's ``patch`` decorators apply to it before ``sys.stdin`` itself is replaced);
  ``sys.stdout`` is a ``StringIO`` (``Capturing``: no ``buffer``); ``SystemExit`` ends the call
  and what was printed so far is the output;
* call-based problems (``grade_call_based``): the header goes before the program, the method is
  taken from one ``Solution()`` instance when the program text contains ``class Solution``, else
  from the module; each test line of the input is one JSON argument; a tuple result counts as a
  list and is compared with the JSON-decoded expected output by ``==``. ``SystemExit`` here ends
  LiveCodeBench's worker process, so every test fails.

Stdin outputs go back to the host, which compares them (``code_judge.stdio_outputs_match``).
"""

import ast
import builtins
import io
import json
import sys
import threading
import types

# LiveCodeBench's header (testing_util.import_string), reproduced as data
HEADER_STAR_IMPORTS = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                       "statistics", "itertools", "functools", "operator", "io", "sys", "json", "builtins",
                       "typing")
HEADER = ("".join("from %s import *\n" % name for name in HEADER_STAR_IMPORTS)
          + "".join("import %s\n" % name for name in HEADER_STAR_IMPORTS if name not in ("builtins", "typing"))
          + "sys.setrecursionlimit(50000)\n")
INT_MAX_STR_DIGITS = 50000
# the os functions reliability_guard sets to None
GUARDED_OS_FUNCTIONS = ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
                        "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod",
                        "fchown", "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir")
MESSAGE_CHARS = 500


def _exit(code=None):
    """``exit`` as the site module defines it: closes stdin, raises SystemExit."""
    try:
        sys.stdin.close()
    except BaseException:  # noqa: BLE001 - as site's Quitter, whatever stdin is
        pass
    raise SystemExit(code)


class _InlineThread:
    """``threading.Thread`` in the judge: the sandbox forbids new threads, so ``start`` runs the
    target at once in the calling thread. Competitive programs start one thread (with a larger
    stack) to run ``main``; LiveCodeBench's worker runs it as a thread and waits for it."""

    def __init__(self, group=None, target=None, name=None, args=(), kwargs=None, *, daemon=None):
        self._target, self._args, self._kwargs = target, tuple(args), dict(kwargs or {})
        self.name, self.daemon = name or "Thread", bool(daemon)

    def start(self):
        self.run()

    def run(self):
        if self._target is not None:
            self._target(*self._args, **self._kwargs)

    def join(self, timeout=None):
        pass

    def is_alive(self):
        return False


def _guard_process():
    threading.Thread = _InlineThread
    threading.stack_size = lambda size=0: 0
    builtins.exit = _exit
    builtins.quit = None
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(INT_MAX_STR_DIGITS)
    os_module = sys.modules.get("os")
    if os_module is not None:
        for name in GUARDED_OS_FUNCTIONS:
            if hasattr(os_module, name):
                setattr(os_module, name, None)


def _without_main_guard(code):
    """clean_if_name: a last top-level ``if __name__ == '__main__':`` gives way to its body."""
    try:
        tree = ast.parse(code)
        last = tree.body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            code = ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last.body)
    except Exception:  # noqa: BLE001 - as LiveCodeBench: any failure keeps the code as it was
        pass
    return code


def _as_function(code):
    """make_function: header, the top-level imports, then every other statement as the body of
    ``wrapped_function``. Code that does not parse is returned unchanged (and fails to compile)."""
    try:
        tree = ast.parse(code)
        imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
        others = [s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
        fields = dict(name="wrapped_function", args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                                                                   kw_defaults=[], defaults=[]),
                      body=others, decorator_list=[], lineno=-1)
        if "type_params" in ast.FunctionDef._fields:
            fields["type_params"] = []
        function = ast.FunctionDef(**fields)
        return HEADER + "\n" + ast.unparse(imports) + "\n" + ast.unparse(function)
    except Exception:  # noqa: BLE001
        return code


class _StdinBytes:
    """``sys.stdin.buffer`` of a test (MockBuffer): ``read`` gives every byte each time,
    ``readline`` the first line each time."""

    def __init__(self, text):
        self._data = text.encode("utf-8")

    def read(self, *args):
        return self._data

    def readline(self, *args):
        return self._data.split(b"\n")[0] + b"\n"


class _Stdin:
    """``sys.stdin`` of a test (MockStdinWithBuffer): ``read`` and ``readlines`` see the whole input
    each time (``readlines`` split at newlines, without them), ``readline`` and ``input`` consume
    it line by line, other attributes are a StringIO's (iteration is not supported)."""

    def __init__(self, text):
        self._text = text
        self._lines = io.StringIO(text)
        self.buffer = _StdinBytes(text)

    def read(self, *args):
        return self._text

    def readline(self, *args):
        return self._lines.readline(*args)

    def readlines(self, *args):
        return self._text.split("\n")

    def __getattr__(self, name):
        if name in ("_text", "_lines"):
            raise AttributeError(name)
        return getattr(self._lines, name)


def _patch_stream(stream, text):
    """read/readline/readlines of the stream that was sys.stdin, for one test (LiveCodeBench's
    patches of ``sys.stdin.read``, ``.readline``, ``.readlines``); returns the names set."""
    lines = iter(text.split("\n"))
    values = {"read": lambda *args: text, "readline": lambda *args: next(lines),
              "readlines": lambda *args: text.split("\n")}
    applied = []
    for name, value in values.items():
        try:
            setattr(stream, name, value)
            applied.append(name)
        except (AttributeError, TypeError):
            pass
    return applied


def _unpatch_stream(stream, names):
    for name in names:
        try:
            delattr(stream, name)
        except (AttributeError, TypeError):
            pass


def _describe(exc):
    try:
        text = "%s: %s" % (type(exc).__name__, exc)
    except BaseException:  # noqa: BLE001 - a hostile __str__
        text = type(exc).__name__
    return text[:MESSAGE_CHARS]


def _failure_status(exc):
    """import_blocked for the sandbox's import gate (LiveCodeBench: a runtime error), else runtime_error."""
    return "import_blocked" if type(exc).__name__ == "ImportBlocked" else "runtime_error"


def _short(value):
    try:
        text = repr(value)
    except BaseException:  # noqa: BLE001
        return "<unprintable>"
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS // 2] + "..." + text[-MESSAGE_CHARS // 2:]


class LiveCodeBenchJudgeEnv:
    max_turns = 1000000

    def __init__(self):
        self._target = None
        self._failure = None
        self._failure_status = "runtime_error"

    def reset(self, seed=None):
        _guard_process()
        try:
            self._target = self._load()
        except MemoryError:
            raise
        except BaseException as exc:  # noqa: BLE001 - compile errors, a raising module body, SystemExit
            self._failure, self._failure_status = "the program did not load: " + _describe(exc), _failure_status(exc)
        return json.dumps({"loaded": self._failure is None, "status": self._failure_status,
                           "message": self._failure or ""}), {}

    def _load(self):
        code = _as_function(_without_main_guard(PROGRAM)) if MODE == "stdin" else HEADER + "\n\n" + PROGRAM
        module = types.ModuleType("tmp_sol", "")
        exec(code, module.__dict__)
        if MODE == "stdin":
            return getattr(module, "wrapped_function")
        owner = module.Solution() if "class Solution" in code else module
        return getattr(owner, FUNC)

    def step(self, action):
        test = json.loads(action)
        if self._failure is not None:
            result = {"status": self._failure_status, "message": self._failure}
        elif MODE == "stdin":
            result = self._run_stdin(test["input"])
        else:
            result = self._run_call(test["input"], test["output"])
        return json.dumps(result), 0.0, False, False, {}

    def _run_stdin(self, text):
        original, saved_out = sys.stdin, sys.stdout
        patched = _patch_stream(original, text) if original is not None else []
        captured = io.StringIO()
        status, message = "ok", ""
        sys.stdin, sys.stdout = _Stdin(text), captured
        try:
            self._target()
        except SystemExit:
            pass
        except MemoryError:
            raise
        except BaseException as exc:  # noqa: BLE001 - LiveCodeBench: a runtime error
            status, message = _failure_status(exc), _describe(exc)
        finally:
            sys.stdin, sys.stdout = original, saved_out
            _unpatch_stream(original, patched)
        return {"status": status, "output": captured.getvalue(), "message": message}

    def _run_call(self, text, expected_text):
        arguments = [json.loads(line) for line in text.split("\n")]
        expected = json.loads(expected_text)
        try:
            prediction = self._target(*arguments)
            if isinstance(prediction, tuple):
                prediction = list(prediction)
            if prediction == expected:
                return {"status": "ok"}
            return {"status": "wrong_answer", "message": "returned " + _short(prediction)}
        except SystemExit as exc:
            return {"status": "exit_called", "message": "the program raised SystemExit(%s)" % _short(exc.code)}
        except MemoryError:
            raise
        except BaseException as exc:  # noqa: BLE001
            return {"status": _failure_status(exc), "message": _describe(exc)}
