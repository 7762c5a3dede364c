"""Programs the tests start, run in processes forked from one that has imported the libraries.

Each ``spade train``, torchrun rank or rollout server the suite starts spent about 4 of its CPU
seconds importing torch, transformers and megatron-core before doing anything, and the suite starts
hundreds. This module keeps, per test process, one *prewarmed* interpreter (a zygote: ``python
tests/prewarmed.py SOCKET``) that imports those libraries once, and runs each program in a child
forked from it: a real, separate process with its own pid, session, working directory, environment
and standard streams, running the real entry point (``runpy`` of a module or script, or ``exec`` of
``-c`` code, as the interpreter does) and ending as an interpreter does (non-daemon threads joined,
``atexit`` run, exit status). Two ways in:

* :func:`run`: ``python -m spade ARGS`` run to completion, for the heavy commands
  (:data:`HEAVY_COMMANDS`), with output captured as ``subprocess.run`` does;
* :func:`python` (and :func:`torchrun`): an executable that stands in for ``sys.executable`` where
  spade or torchrun start a program (``engine.sglang.server_command``, torchrun's ranks through
  PYTHON_EXEC) or a test starts one and signals it (tests/prewarmed_python.py forwards signals and
  the exit status, and the program dies with it).

What differs from a fresh interpreter is only what was decided while importing, so a program runs
in a fresh ``sys.executable`` process instead whenever its command line has other options or its
environment differs from the zygote's in a variable read then (:data:`READ_AT_IMPORT`; a
PYTHONPATH is honoured where the zygote's modules resolve to the same files under it). The few
settings such a variable makes are applied in the child instead (:data:`APPLIED_IN_CHILD`:
torch's thread count, as torch does at start-up, and the progress-bar switches spade sets for
what it launches). Tests of killing, orphans or process trees keep real interpreters.
``SPADE_TEST_PREWARMED=0`` turns it all off; ``SPADE_TEST_PREWARMED_LOG=FILE`` logs each decision.

The zygote is single-threaded (``selectors`` over its socket, connections and children's pidfds), so
forking it is safe; it exits, killing its children's sessions, when its test process goes away.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import selectors
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path

from spade.process_group import kill_group

ROOT = Path(__file__).resolve().parent.parent
PRELOAD = ("spade", "torch", "transformers", "transformers.models.auto.modeling_auto",
           "transformers.models.auto.tokenization_auto", "transformers.models.qwen3.modeling_qwen3",
           "transformers.generation.utils", "megatron_patches")
READ_AT_IMPORT = ("PYTHON", "MKL_", "OPENBLAS_", "GOMP_", "KMP_", "CUDA_", "TORCH", "TRANSFORMERS", "HF_",
                  "NVTE_", "TOKENIZERS_", "LD_", "TQDM_", "SPADE_TEST_PREWARMED")
# Variables with those prefixes that are only read later, while the program runs: torchrun's settings
# for its workers (and PYTHON_EXEC, the interpreter it starts them with), and the inductor cache
# directory, which torch writes into its own environment the first time it compiles.
SEARCH_PATH = "PYTHONPATH"
READ_LATER = ("PYTHON_EXEC", "TORCHELASTIC_", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHINDUCTOR_CACHE_DIR")
NOT_READ = ("PYTHON",)  # names under those prefixes that nothing reads at import: device_check.sh's interpreter
THREADS_VARIABLE = "OMP_NUM_THREADS"
HUB_PROGRESS_BARS = "HF_HUB_DISABLE_PROGRESS_BARS"  # huggingface_hub.constants, copied into utils.tqdm
TQDM_PREFIX = "TQDM_"  # tqdm's __init__ defaults (tqdm.utils.envwrap at import)
TQDM_TYPES = {"total": float, "ncols": int, "miniters": float, "position": int, "nrows": int}  # tqdm/std.py
UNBUFFERED = "PYTHONUNBUFFERED"  # the standard streams' buffering, as -u
APPLIED_IN_CHILD = (THREADS_VARIABLE, HUB_PROGRESS_BARS, TQDM_PREFIX, UNBUFFERED)
# Prefixes read at import by a module the zygote may not have (then they are read later, if ever):
# Transformer Engine's NVTE_* (megatron-core sets them while it builds a model; no TE on CPU).
READ_BY_MODULE = {"NVTE_": "transformer_engine"}
LOG_VARIABLE = "SPADE_TEST_PREWARMED_LOG"  # a file: one line per command, forked or fresh and why
# The commands that import the libraries; the others (env, memory, demo, ...) start in under half a
# second on their own, less than a fork of the zygote costs them.
HEAVY_COMMANDS = ("train", "score", "eval")
MAX_MESSAGE = 1 << 20
_MINE = ROOT / "tests" / "prewarmed.py"
_CLIENT = ROOT / "tests" / "prewarmed_python.py"


# ---------------------------------------------------------------------------------------- zygote

def _preload() -> None:
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in PRELOAD:
            importlib.import_module(name)


def _parse(argv: list[str]) -> tuple[bool, str, str, list[str]] | None:
    """``(unbuffered, "module" | "code" | "script", target, rest)`` of a Python command line the
    zygote can run (``[-u] -m MODULE ARGS``, ``[-u] -c CODE ARGS`` or ``[-u] SCRIPT ARGS``); ``None``
    for any other option."""
    unbuffered = False
    while argv and argv[0] == "-u":
        unbuffered, argv = True, argv[1:]
    if len(argv) >= 2 and argv[0] == "-m":
        return unbuffered, "module", argv[1], argv[2:]
    if len(argv) >= 2 and argv[0] == "-c":
        return unbuffered, "code", argv[1], argv[2:]
    if argv and not argv[0].startswith("-"):
        return unbuffered, "script", argv[0], argv[1:]
    return None


def _read_at_import() -> tuple[str, ...]:
    """:data:`READ_AT_IMPORT`, less the prefixes of modules this process has not imported."""
    return tuple(prefix for prefix in READ_AT_IMPORT
                 if prefix not in READ_BY_MODULE or READ_BY_MODULE[prefix] in sys.modules)


def _differs_at_import(env: dict[str, str], started: dict[str, str], read_at_import: tuple[str, ...]) -> list[str]:
    """The variables read at start-up (PYTHONPATH aside: :func:`_search_path`) in which ``env``
    differs from ``started``."""
    keys = {key for key in (*env, *started) if key.startswith(read_at_import)
            and not key.startswith((*READ_LATER, *APPLIED_IN_CHILD)) and key not in (SEARCH_PATH, *NOT_READ)}
    return sorted(key for key in keys if env.get(key) != started.get(key))


def _why_fresh(request: dict, started: dict[str, str], read_at_import: tuple[str, ...],
               search_path: list[str] | None) -> str | None:
    """Why the zygote cannot run ``request`` as a fresh interpreter would; ``None`` when it can."""
    if _parse(request["argv"]) is None:
        return f"options {request['argv'][:2]}"
    if differs := _differs_at_import(request["env"], started, read_at_import):
        return f"environment {differs}"
    if search_path is None:
        return f"PYTHONPATH {request['env'].get(SEARCH_PATH)!r}"
    return None


def _log(line: str) -> None:
    """One line in the file that SPADE_TEST_PREWARMED_LOG names (unset: nothing is written)."""
    if path := os.environ.get(LOG_VARIABLE):
        with open(path, "a") as log:
            log.write(line + "\n")


def _path_entries(value: str | None) -> list[str] | None:
    """PYTHONPATH's entries; ``None`` where one is empty or relative (then no comparison is made)."""
    entries = value.split(os.pathsep) if value else []
    if not all(entry and os.path.isabs(entry) for entry in entries):
        return None
    return [os.path.normpath(entry) for entry in entries]


def _search_path(value: str | None, started: str | None) -> list[str] | None:
    """A command's PYTHONPATH entries where every module the zygote has imported would be found in
    the same file under them (a fresh interpreter would import the same code); otherwise ``None``.
    An entry added may hold only modules imported from that very entry, and no module may have
    come from an entry removed."""
    new, old = _path_entries(value), _path_entries(started)
    if new is None or old is None:
        return None
    if new == old:
        return new
    loaded = {name: getattr(module, "__file__", None) for name, module in list(sys.modules.items()) if "." not in name}
    for entry in set(new) - set(old):
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        for name in names:
            top = name.partition(".")[0] if name.endswith((".py", ".pyc", ".so")) else name
            if top in loaded and not (loaded[top] or "").startswith(os.path.join(entry, top)):
                return None
    removed = [os.path.join(entry, "") for entry in set(old) - set(new)]
    if any((file or "").startswith(tuple(removed)) for file in loaded.values()):
        return None
    return new


def _standard_streams(unbuffered: bool) -> None:
    sys.stdin = open(0, closefd=False)
    if unbuffered:  # what `python -u` (or PYTHONUNBUFFERED) gives: nothing held back in either layer
        sys.stdout, sys.stderr = (io.TextIOWrapper(open(fd, "wb", buffering=0, closefd=False), write_through=True,
                                                   errors=errors)
                                  for fd, errors in ((1, "strict"), (2, "backslashreplace")))
    else:
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False, errors="backslashreplace", buffering=1)


def _apply_in_child(env: dict[str, str], started: dict[str, str]) -> None:
    """What the variables of :data:`APPLIED_IN_CHILD` would have set in a fresh interpreter."""
    if THREADS_VARIABLE in env:
        import torch

        torch.set_num_threads(int(env[THREADS_VARIABLE]))
    if env.get(HUB_PROGRESS_BARS) != started.get(HUB_PROGRESS_BARS):
        from huggingface_hub import constants

        value = env.get(HUB_PROGRESS_BARS)
        disabled = None if value is None else constants._is_true(value)
        constants.HF_HUB_DISABLE_PROGRESS_BARS = disabled
        if "huggingface_hub.utils.tqdm" in sys.modules:
            sys.modules["huggingface_hub.utils.tqdm"].HF_HUB_DISABLE_PROGRESS_BARS = disabled

    def tqdm_settings(variables: dict[str, str]) -> dict[str, str]:
        return {key: value for key, value in variables.items() if key.startswith(TQDM_PREFIX)}

    if tqdm_settings(env) != tqdm_settings(started) and "tqdm.std" in sys.modules:
        from tqdm import std, utils

        init = std.tqdm.__dict__["__init__"].func  # undecorated; envwrap reads os.environ, now env
        std.tqdm.__init__ = utils.envwrap("tqdm", is_method=True, types=TQDM_TYPES)(init)


def _child(request: dict, fds: list[int], keep_closed: list[int], started: dict[str, str],
           search_path: list[str], base_path: list[str]) -> None:
    """In the forked child: become the command's process and never return. ``started`` is the
    zygote's environment at start-up; ``base_path``, its sys.path after the PYTHONPATH entries."""
    code = 1
    try:
        os.setsid()
        for fd in keep_closed:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _apply_in_child(request["env"], started)
        sys.path[1:] = search_path + base_path
        unbuffered, kind, target, rest = _parse(request["argv"])
        _standard_streams(unbuffered or bool(request["env"].get(UNBUFFERED)))
        code = _run_main(kind, target, rest)
        threading._shutdown()  # type: ignore[attr-defined]  # what interpreter exit does first
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
    finally:
        os._exit(code)


def _run_main(kind: str, target: str, rest: list[str]) -> int:
    import runpy
    import traceback

    try:
        if kind == "module":
            sys.argv = ["-m", *rest]  # runpy puts the module's path first
            sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif kind == "code":
            sys.argv = ["-c", *rest]
            sys.path[0] = ""  # as `python -c` does: the working directory
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
        else:
            sys.argv = [target, *rest]
            sys.path[0] = os.path.dirname(os.path.realpath(target))  # as `python SCRIPT` does
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:  # noqa: BLE001  # what an uncaught exception does: traceback, status 1
        traceback.print_exc()
        return 1
    return 0


def serve(path: str) -> None:
    started = dict(os.environ)
    _preload()
    read_at_import = _read_at_import()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, ("accept", None))
    selector.register(0, selectors.EVENT_READ, ("parent", None))  # EOF: the test process is gone
    children: dict[int, tuple[socket.socket, int | None]] = {}  # pid -> (connection, pidfd)
    sys.stdout.write("ready\n")
    sys.stdout.flush()

    def open_fds() -> list[int]:
        fds = [listener.fileno(), 0]
        for connection, pidfd in children.values():
            fds += [connection.fileno()] + ([pidfd] if pidfd is not None else [])
        return fds

    while True:
        for key, _ in selector.select():
            what, pid = key.data
            if what == "parent":
                if not os.read(0, 4096):
                    for child in children:
                        kill_group(child)
                    return
            elif what == "accept":
                connection, _ = listener.accept()
                try:
                    message, fds, _, _ = socket.recv_fds(connection, MAX_MESSAGE, 3)
                    request = json.loads(message)
                except (OSError, ValueError):  # the client went away before it asked
                    connection.close()
                    continue
                search_path = _search_path(request["env"].get(SEARCH_PATH), started.get(SEARCH_PATH))
                reason = _why_fresh(request, started, read_at_import, search_path)
                command = " ".join(request["argv"])[:160]
                _log(f"fresh {command!r}  ({reason})" if reason else f"forked {command!r}")
                if reason:
                    connection.send(b"fresh")  # the client runs it in a fresh interpreter instead
                    for fd in fds:
                        os.close(fd)
                    connection.close()
                    continue
                child = os.fork()
                if child == 0:
                    selector.close()
                    _child(request, fds, [connection.fileno(), *open_fds()], started, search_path,
                           sys.path[1 + len(_path_entries(started.get(SEARCH_PATH)) or []):])
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(child)
                children[child] = (connection, pidfd)
                selector.register(pidfd, selectors.EVENT_READ, ("exited", child))
                selector.register(connection, selectors.EVENT_READ, ("client", child))
                try:
                    connection.send(f"pid {child}".encode())
                except OSError:  # gone already: its "client" event follows
                    pass
            elif what == "client":  # the client went away before its command ended
                connection, pidfd = children[pid]
                try:
                    gone = not connection.recv(64)
                except OSError:  # ECONNRESET: it died with a message unread
                    gone = True
                if gone:
                    selector.unregister(connection)
                    kill_group(pid)
            elif what == "exited":
                connection, pidfd = children.pop(pid)
                selector.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                try:
                    connection.send(f"exit {os.waitstatus_to_exitcode(status)}".encode())
                except OSError:
                    pass
                try:
                    selector.unregister(connection)
                except KeyError:  # the client had gone already
                    pass
                connection.close()


# ---------------------------------------------------------------------------------------- client

class _Zygote:
    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="spade-prewarmed-")
        self.path = os.path.join(self.directory, "socket")
        with open(os.path.join(self.directory, "zygote.log"), "w") as log:  # the zygote's own errors
            self.process = subprocess.Popen([sys.executable, str(_MINE), self.path], cwd=ROOT, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log, text=True)
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError("the prewarmed interpreter did not start")
        atexit.register(self.close)
        self.python = os.path.join(self.directory, "python")
        with open(self.python, "w") as script:
            client = " ".join(shlex.quote(str(part)) for part in (sys.executable, "-S", _CLIENT, self.path))
            script.write(f"#!/bin/sh\nexport PYTHON_EXEC=\"$0\"\n"  # torchrun starts its workers with it too
                         f"exec {client} \"$@\"\n")
        os.chmod(self.python, 0o755)

    def close(self) -> None:
        """Stop the zygote (it kills what it still runs) and remove its directory, unless its log
        holds an error worth reading."""
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process.stdout.close()
        if not os.path.getsize(os.path.join(self.directory, "zygote.log")):
            shutil.rmtree(self.directory, ignore_errors=True)


_zygote: _Zygote | None = None


def _get_zygote() -> _Zygote | None:
    global _zygote
    if os.environ.get("SPADE_TEST_PREWARMED", "1") == "0":
        return None
    if _zygote is None or _zygote.process.poll() is not None:
        _zygote = _Zygote()
    return _zygote


def python() -> str:
    """An executable that stands in for ``sys.executable`` (``[-u] -m MODULE ...``, ``[-u] -c CODE
    ...`` or ``[-u] SCRIPT ...``): the program runs forked from the prewarmed interpreter, or in
    ``sys.executable`` itself where its command line or environment asks for a fresh one. Signals
    sent to it reach the program, it exits as the program did, and the program dies with it, a few
    milliseconds later where it is SIGKILLed (tests/prewarmed_python.py): tests that must see the
    process tree itself keep ``sys.executable``."""
    zygote = _get_zygote()
    return sys.executable if zygote is None else zygote.python


def torchrun() -> list[str]:
    """``torchrun``, itself run by :func:`python`, which it also starts its ranks with. A rank that
    arms its parent-death signal (``spade train`` does) arms it against the zygote, its parent, not
    torchrun: tests that kill torchrun use the real one."""
    return [python(), "-m", "torch.distributed.run"]


def run(args: list[str], *, timeout: float, cwd: str | Path = ROOT, env: dict[str, str] | None = None,
        input: str | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-m", "spade", *args], capture_output=True, text=True, ...)``,
    by :func:`python` for the commands that import the libraries (:data:`HEAVY_COMMANDS`)."""
    command = [sys.executable, "-m", "spade", *args]
    interpreter = python() if args and args[0] in HEAVY_COMMANDS else sys.executable
    try:
        done = subprocess.run([interpreter, *command[1:]], cwd=cwd, env=env, input=input, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        raise subprocess.TimeoutExpired(command, timeout, expired.output, expired.stderr) from None
    return subprocess.CompletedProcess(command, done.returncode, done.stdout, done.stderr)


if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # the repository, as for `python -m spade` run from it (not tests/)
    serve(sys.argv[1])
