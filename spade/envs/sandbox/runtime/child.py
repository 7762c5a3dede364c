"""The hardened child: one per environment, forked by the zygote, talking to the supervisor.

After fork the child locks itself down (``harden``) before it sees any generated code, then
serves requests on its socket: ``load`` (compile, execute, pick and instantiate the class; with
``released_loader_names`` the released loader's standard-library names are bound first),
``reset``, ``step``, ``probe`` (every degenerate-policy probe episode in one request, one progress
frame per episode; :mod:`.probe_play`), ``close``, and the two self-test probes. Everything the environment returns
is checked here first, so the common mistakes come back with a precise kind; the supervisor
checks again, because code running here can forge anything this process would send.
"""

from __future__ import annotations

import builtins
import gc
import inspect
import json
import math
import os
import resource
import socket
import sys
import time
import traceback
import types
from typing import Any, NoReturn

from . import framing, host_modules, landlock, loader_names, probe_play, seccomp, tool_base
from .limits import ChildLimits

EXIT_HARDENING_FAILED = 70
EXIT_MEMORY = 71
MAX_REQUEST_BYTES = 64 << 20
MODULE_NAME = "environment"
FILENAME = "<environment>"
_MESSAGE_LIMIT = 2_000
TOOL_BASE_NAME = "ToolUseBaseEnv"
MAX_TOOLS = 64
MAX_TOOL_OUTPUT_CHARS = 20_000


class ImportBlocked(ImportError):
    pass


class _StopAfterReply(Exception):
    """A handler's result, after which this process must stop (its environment failed)."""

    def __init__(self, result: dict[str, Any]):
        super().__init__("stop after reply")
        self.result = result


class Rejected(Exception):
    """A classified failure raised by the child's own checks."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


def harden(channel: socket.socket, limits: ChildLimits) -> dict[str, Any]:
    """Apply every layer that can be applied from inside; returns what was applied."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    keep = channel.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)
    applied: dict[str, Any] = {}
    _set_limit(resource.RLIMIT_AS, limits.memory_bytes)
    _set_limit(resource.RLIMIT_CPU, limits.cpu_seconds, hard=limits.cpu_seconds + 1)
    _set_limit(resource.RLIMIT_NOFILE, limits.open_files)
    _set_limit(resource.RLIMIT_FSIZE, limits.file_size_bytes)
    _set_limit(resource.RLIMIT_NPROC, 0)
    _set_limit(resource.RLIMIT_CORE, 0)
    applied["rlimits"] = True
    try:
        applied["landlock_abi"] = landlock.restrict(list(limits.readable_paths))
    except landlock.LandlockUnavailable:
        if limits.require_landlock:
            raise
        applied["landlock_abi"] = 0
    try:
        seccomp.install(os.getpid())
        applied["seccomp"] = True
    except seccomp.SeccompUnavailable:
        if limits.require_seccomp:
            raise
        applied["seccomp"] = False
    sys.setrecursionlimit(limits.recursion_limit)
    return applied


def _set_limit(which: int, soft: int, hard: int | None = None) -> None:
    resource.setrlimit(which, (soft, soft if hard is None else hard))


def run(channel: socket.socket, limits: ChildLimits) -> NoReturn:
    """Entry point after fork. Never returns."""
    try:
        applied = harden(channel, limits)
    except BaseException:  # noqa: BLE001 - any failure here means "do not run code"
        os._exit(EXIT_HARDENING_FAILED)
    try:
        EnvHost(channel, limits, applied).serve()
    except MemoryError:
        os._exit(EXIT_MEMORY)
    except BaseException:  # noqa: BLE001
        os._exit(1)
    os._exit(0)


class CapturedOutput:
    """Stands in for stdout/stderr: keeps the first ``cap`` characters, counts the rest."""

    def __init__(self, cap: int):
        self.cap = cap
        self.parts: list[str] = []
        self.kept = 0
        self.dropped = 0

    def write(self, text: Any) -> int:
        text = str(text)
        room = self.cap - self.kept
        if room > 0:
            piece = text[:room]
            self.parts.append(piece)
            self.kept += len(piece)
            self.dropped += len(text) - len(piece)
        else:
            self.dropped += len(text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def take(self) -> tuple[str, int]:
        text, dropped = "".join(self.parts), self.dropped
        self.parts, self.kept, self.dropped = [], 0, 0
        return text, dropped


class EnvHost:
    def __init__(self, channel: socket.socket, limits: ChildLimits, applied: dict[str, Any]):
        self.channel = channel
        self.limits = limits
        self.applied = applied
        self.env: Any = None
        self.output = CapturedOutput(limits.max_captured_output_bytes)
        self.tool_schema: list[dict[str, Any]] | None = None  # a tool env's schemas, fixed at reset
        sys.stdout = sys.stderr = self.output  # type: ignore[assignment]

    def serve(self) -> None:
        handlers = {
            "load": self._load,
            "reset": self._reset,
            "step": self._step,
            "probe": self._probe,
            "tools": self._tools,
            "call_tool": self._call_tool,
            "criteria": self._criteria,
            "selftest": self._selftest,
            "selftest_seccomp": self._selftest_seccomp,
        }
        while True:
            request = framing.recv_frame(self.channel, MAX_REQUEST_BYTES)
            if request is None or request.get("op") == "close":
                return
            seq = request.get("seq")
            handler = handlers.get(request.get("op"))
            if handler is None:
                self._reply(seq, error=("protocol_error", f"unknown op {request.get('op')!r}"))
                continue
            fatal = self._call(seq, handler, request)
            if fatal:
                return

    def _call(self, seq: Any, handler: Any, request: dict[str, Any]) -> bool:
        """Run one handler; reply; True when the child must stop afterwards."""
        default_kind = {"load": "init_error", "reset": "reset_error", "tools": "reset_error"}.get(
            request["op"], "step_error")
        try:
            result = handler(request)
        except Rejected as exc:
            return self._reply(seq, error=(exc.kind, exc.message))
        except _StopAfterReply as stop:
            return self._reply(seq, result=stop.result) or True
        except MemoryError:
            self.env = None
            gc.collect()
            return self._reply(seq, error=("memory_limit", "the environment ran out of memory"), fatal=True)
        except BaseException as exc:  # noqa: BLE001 - generated code may raise anything
            kind = _classify(exc, default_kind)
            return self._reply(seq, error=(kind, _describe(exc)), fatal=kind == "exit_called")
        return self._reply(seq, result=result)

    def _reply(self, seq: Any, *, result: Any = None, error: tuple[str, str] | None = None,
               fatal: bool = False) -> bool:
        output, dropped = self.output.take()
        message: dict[str, Any] = {"seq": seq, "output": output, "output_dropped": dropped}
        if error is None:
            message.update(ok=True, result=result)
            frame = _encode_or_none(message)
            if frame is None or len(frame) - framing.HEADER.size > self.limits.max_frame_bytes:
                error = ("output_too_large" if frame is not None else "not_serializable",
                         "the reply does not fit in a frame" if frame is not None
                         else "the result is not JSON-serialisable")
                fatal = True
        if error is not None:
            kind, text = error
            message = {"seq": seq, "ok": False, "output": output[:2_000], "output_dropped": dropped,
                       "error": {"kind": kind, "message": text[:_MESSAGE_LIMIT]}}
            frame = framing.encode(message)
        self.channel.sendall(frame)
        return fatal or error is not None

    # -- requests -----------------------------------------------------------------------------

    def _load(self, request: dict[str, Any]) -> dict[str, Any]:
        source = request["source"]
        try:
            code = compile(source, FILENAME, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            raise Rejected("syntax_error", _describe_syntax_error(exc)) from None
        released_names = request.get("released_loader_names", False)
        if not isinstance(released_names, bool):
            raise Rejected("protocol_error", "released_loader_names must be true or false")
        module = types.ModuleType(MODULE_NAME)
        module.__dict__["__builtins__"] = _guarded_builtins(frozenset(self.limits.allowed_imports))
        module.__dict__[TOOL_BASE_NAME] = tool_base.ToolUseBaseEnv
        if released_names:  # a fixed table of allowed modules, imported here (loader_names)
            loader_names.bind(module.__dict__, self.limits.allowed_imports)
        sys.modules[MODULE_NAME] = module
        try:
            exec(code, module.__dict__)
        except Rejected:
            raise
        except BaseException as exc:  # noqa: BLE001
            kind = _classify(exc, "init_error")
            raise Rejected(kind, "module body raised " + _describe(exc)) from None
        env_class = _choose_env_class(module)
        max_turns = request.get("max_turns")
        kwargs = {"max_turns": max_turns} if max_turns is not None and _accepts(env_class, "max_turns") else {}
        self.env = env_class(**kwargs)
        env_max_turns = getattr(self.env, "max_turns", None)
        if not isinstance(env_max_turns, int) or isinstance(env_max_turns, bool) or env_max_turns <= 0:
            env_max_turns = None
        return {"class_name": env_class.__name__, "max_turns": env_max_turns,
                "tool_use": isinstance(self.env, tool_base.ToolUseBaseEnv)}

    def _reset(self, request: dict[str, Any]) -> dict[str, Any]:
        self._require_env()
        returned = self.env.reset(seed=request.get("seed"))
        tool_env = isinstance(self.env, tool_base.ToolUseBaseEnv)
        if tool_env and isinstance(returned, str):
            returned = (returned, {})  # a tool environment may return just the first instruction
        if not isinstance(returned, tuple) or len(returned) != 2:
            raise Rejected("bad_return", f"reset() must return (observation, info), got {_shape(returned)}")
        observation, info = returned
        result = {"observation": self._check_observation(observation, "reset"), "info": _check_info(info, "reset")}
        if tool_env:
            self.tool_schema = None
            self.tool_schema = self._current_tools()
        return result

    def _step(self, request: dict[str, Any]) -> dict[str, Any]:
        self._require_env()
        action = request["action"]
        returned = self.env.step(action)
        if not isinstance(returned, tuple) or len(returned) != 5:
            raise Rejected("bad_return", "step() must return (observation, reward, terminated, truncated, "
                                         f"info), got {_shape(returned)}")
        observation, reward, terminated, truncated, info = returned
        return {
            "observation": self._check_observation(observation, "step"),
            "reward": _check_reward(reward),
            "terminated": _check_flag(terminated, "terminated"),
            "truncated": _check_flag(truncated, "truncated"),
            "info": _check_info(info, "step"),
        }

    def _probe(self, request: dict[str, Any]) -> dict[str, Any]:
        """Play the probe plan through this environment's own ``reset`` / ``step`` handlers (the
        same checks as one request each), sending a progress frame after each episode so that the
        supervisor keeps what was played if it must kill this process. After an environment fault
        every later call fails the same way and this process ends after its reply."""
        self._require_env()
        if isinstance(self.env, tool_base.ToolUseBaseEnv):
            raise Rejected("protocol_error", "the probe request is for games, not tool environments")
        parse = host_modules.parse_action()
        if parse is None:
            raise Rejected("protocol_error", "the reply parser (host.actions) was not installed in this sandbox")
        try:
            plan = probe_play.ProbePlan.from_json(request.get("plan"))
        except ValueError as exc:
            raise Rejected("protocol_error", f"probe: {exc}") from None
        failed: list[probe_play.EnvFailed] = []

        def guarded(call: Any, kind: str, timeout: float) -> Any:
            if failed:
                raise failed[0]
            start = time.monotonic()
            try:
                result = call()
            except Rejected as exc:
                failed.append(probe_play.EnvFailed(exc.kind, exc.message))
            except MemoryError:
                self.env = None
                gc.collect()
                failed.append(probe_play.EnvFailed("memory_limit", "the environment ran out of memory"))
            except BaseException as exc:  # noqa: BLE001 - generated code may raise anything
                failed.append(probe_play.EnvFailed(_classify(exc, kind), _describe(exc)))
            else:
                if time.monotonic() - start <= timeout:
                    return result
                failed.append(probe_play.EnvFailed("timeout", f"{kind.partition('_')[0]} did not finish within "
                                                               f"{timeout:g} s"))
            raise failed[0]

        def reset(seed: int) -> str:
            return guarded(lambda: self._reset({"seed": seed}), "reset_error", plan.reset_timeout_s)["observation"]

        def step(action: str) -> tuple[str, float, bool, bool]:
            result = guarded(lambda: self._step({"action": action}), "step_error", plan.step_timeout_s)
            return result["observation"], result["reward"], result["terminated"], result["truncated"]

        def progress(episode: probe_play.Episode) -> None:
            self.channel.sendall(framing.encode({"seq": request.get("seq"), "progress": episode.to_json()}))

        extra = ()
        if probe_play.REFERENCE_POLICY in plan.policies:
            method = getattr(self.env, "reference_policy", None)
            if not callable(method):
                raise Rejected("reference_missing", f"class {type(self.env).__name__} has no "
                                                    "reference_policy(observation) method")

            def reference(observation: str) -> str:
                def call() -> str:
                    reply = method(observation)
                    if not isinstance(reply, str):
                        raise Rejected("bad_return", f"reference_policy() must return str, got {type(reply).__name__}")
                    return reply
                return guarded(call, "step_error", plan.step_timeout_s)

            extra = (probe_play.reference_policy(reference),)
        if any(name in probe_play.WINNABILITY_POLICIES for name in plan.policies):
            extra = (*extra, *self._winnability_policies(guarded, plan.step_timeout_s))
        outcome = probe_play.play(plan, reset, step, parse, on_episode=progress, extra=extra)
        if failed:
            raise _StopAfterReply(outcome.to_json())
        return outcome.to_json()

    def _winnability_policies(self, guarded: Any, timeout: float) -> tuple[probe_play.ProbePolicy, ...]:
        """The winnability stage's policies: the actions ``solution()`` returns after each reset (a
        list of strings, or text whose ``\\boxed{...}`` parts are the actions; other text is a
        description: ``no_actions``), and ``reference_policy(observation)`` where the class has one
        (else ``no_method``)."""
        env = self.env

        def actions() -> list[str]:
            method = getattr(env, "solution", None)
            if not callable(method):
                raise probe_play.NothingToPlay("no_method", "the class has no solution() method")
            def call() -> Any:
                try:
                    return method()
                except NotImplementedError:
                    return NotImplemented
            offered = guarded(call, "step_error", timeout)
            if offered is NotImplemented:
                raise probe_play.NothingToPlay("no_actions", "solution() raises NotImplementedError")
            return probe_play.solution_actions(offered)

        def reference(observation: str) -> str:
            method = getattr(env, "reference_policy", None)
            if not callable(method):
                raise probe_play.NothingToPlay("no_method", "the class has no reference_policy() method")

            def call() -> str:
                reply = method(observation)
                if not isinstance(reply, str):
                    raise Rejected("bad_return", f"reference_policy() must return str, got {type(reply).__name__}")
                return reply
            return guarded(call, "step_error", timeout)

        return (probe_play.solution_policy(actions),
                probe_play.reference_policy(reference, name=probe_play.OFFERED_REFERENCE))

    # -- tool environments --------------------------------------------------------------------

    def _require_tool_env(self) -> None:
        self._require_env()
        if not isinstance(self.env, tool_base.ToolUseBaseEnv):
            raise Rejected("protocol_error", "this environment is not a tool environment (no ToolUseBaseEnv)")
        if self.tool_schema is None:
            raise Rejected("protocol_error", "reset() the tool environment first")

    def _current_tools(self) -> list[dict[str, Any]]:
        tools = self.env.get_tools()
        if not isinstance(tools, list):
            raise Rejected("bad_return", f"get_tools() must return a list, got {type(tools).__name__}")
        if len(tools) > MAX_TOOLS:
            raise Rejected("output_too_large", f"get_tools() returned {len(tools)} tools, limit {MAX_TOOLS}")
        checked = []
        for index, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                    or not function["name"]:
                raise Rejected("bad_return", f"get_tools()[{index}] is not an OpenAI function "
                                             "({\"type\": \"function\", \"function\": {\"name\": ...}})")
            checked.append(_check_info(tool, "get_tools"))
        text = json.dumps(checked)
        if len(text) > self.limits.max_observation_chars:
            raise Rejected("output_too_large", f"the tool schemas take {len(text)} characters, "
                                               f"limit {self.limits.max_observation_chars}")
        _check_text(json.dumps(checked, ensure_ascii=False), "get_tools()")  # the chat template renders them
        return checked

    def _tools(self, request: dict[str, Any]) -> dict[str, Any]:
        self._require_tool_env()
        return {"tools": self.tool_schema, **self._progress()}

    def _call_tool(self, request: dict[str, Any]) -> dict[str, Any]:
        self._require_tool_env()
        name, arguments = request.get("name"), request.get("arguments")
        before = self._progress()["current"]
        returned = self.env.execute_tool(name, arguments)
        if not isinstance(returned, dict) or set(returned) - {"output", "returncode"} \
                or not isinstance(returned.get("output"), str) or returned.get("returncode") not in (0, 1):
            raise Rejected("bad_return", "execute_tool() must return {\"output\": str, \"returncode\": 0 or 1}, "
                                         f"got {_shape(returned) if not isinstance(returned, dict) else returned!r}"[:500])
        output = returned["output"]
        if returned["returncode"] == 0 and self._progress()["current"] == before:
            # an execute_tool of the environment's own that did not advance: the notice still
            # ends the result (ToolUseBaseEnv.execute_tool already did this, then this is "")
            notice = self.env.progress_notice()
            output += notice if isinstance(notice, str) else ""
        if len(output) > MAX_TOOL_OUTPUT_CHARS:
            raise Rejected("output_too_large", f"tool {name!r} returned {len(output)} characters, "
                                               f"limit {MAX_TOOL_OUTPUT_CHARS}")
        _check_text(output, f"tool {name!r}'s result")
        if self._current_tools() != self.tool_schema:
            raise Rejected("bad_return", f"the tool schemas changed during the episode (after calling {name!r}); "
                                         "tools are fixed at reset")
        progress = self._progress()
        progress["advanced"] = progress["current"] - before
        return {"output": output, "returncode": returned["returncode"], **progress}

    def _progress(self) -> dict[str, Any]:
        """Which instruction the agent is on: ``current`` (index), ``total``, the ``instruction``
        text to give now (None once all are done) and ``all_done``."""
        messages = getattr(self.env, "_user_messages", None)
        current = getattr(self.env, "_current_msg", 0)
        if not isinstance(messages, list) or not all(isinstance(m, str) for m in messages):
            raise Rejected("bad_return", "_user_messages must be a list of strings")
        if not isinstance(current, int) or isinstance(current, bool) or current < 0:
            raise Rejected("bad_return", f"_current_msg must be an integer >= 0, got {current!r}"[:200])
        total = len(messages)
        instruction = messages[current] if current < total else None
        if instruction is not None:
            self._check_observation(instruction, "instruction")
        return {"current": min(current, total), "total": total, "instruction": instruction,
                "all_done": total > 0 and current >= total}

    def _criteria(self, request: dict[str, Any]) -> dict[str, Any]:
        """Each success criterion evaluated on the current state: ``{"value": bool | None,
        "error": str | None}`` (a raising criterion gives its error, a non-bool result is coerced)."""
        self._require_tool_env()
        criteria = getattr(self.env, "_message_criteria", None)
        if not isinstance(criteria, list):
            raise Rejected("bad_return", "_message_criteria must be a list of callables")
        state = getattr(self.env, "_state", None)
        results = []
        for criterion in criteria:
            try:
                results.append({"value": bool(criterion(state)), "error": None})
            except Rejected:
                raise
            except MemoryError:
                raise
            except (SystemExit, KeyboardInterrupt, GeneratorExit):
                raise
            except BaseException as exc:  # noqa: BLE001
                results.append({"value": None, "error": _describe(exc)[:500]})
        return {"criteria": results, **self._progress()}

    def _selftest(self, request: dict[str, Any]) -> dict[str, Any]:
        probe_path = request.get("write_probe", "/tmp/spade-selftest")
        read_probe = request.get("read_probe", "/proc/self/status")
        report = dict(self.applied)
        report["write_blocked"] = _blocked(lambda: open(probe_path, "w").close())
        report["read_blocked"] = _blocked(lambda: open(read_probe, "rb").close())
        report["uid"] = os.getuid()
        report["rlimit_as"] = resource.getrlimit(resource.RLIMIT_AS)[1]
        report["rlimit_cpu"] = resource.getrlimit(resource.RLIMIT_CPU)[1]
        report["rlimit_nofile"] = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        report["rlimit_fsize"] = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        report["rlimit_nproc"] = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        report["environ"] = sorted(os.environ)
        return report

    def _selftest_seccomp(self, request: dict[str, Any]) -> dict[str, Any]:
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()  # must be fatal under seccomp
        return {"survived": True}

    # -- checks -------------------------------------------------------------------------------

    def _require_env(self) -> None:
        if self.env is None:
            raise Rejected("protocol_error", "no environment loaded")

    def _check_observation(self, observation: Any, call: str) -> str:
        if not isinstance(observation, str):
            raise Rejected("bad_return", f"{call}() observation must be str, got {type(observation).__name__}")
        if len(observation) > self.limits.max_observation_chars:
            raise Rejected("output_too_large", f"{call}() observation has {len(observation)} characters, "
                                               f"limit {self.limits.max_observation_chars}")
        return _check_text(observation, f"{call}() observation")


def _check_text(text: str, what: str) -> str:
    """``text``, which the agent's tokenizer will read: it must be strict UTF-8 (no lone surrogate,
    such as ``chr(0xD800)``, which the tokenizer refuses and which would end the play)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Rejected("bad_return", f"{what} holds a lone surrogate ({text[exc.start]!r} at character "
                                     f"{exc.start}), which UTF-8 cannot encode") from None
    return text


def _check_reward(reward: Any) -> float:
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise Rejected("bad_return", f"reward must be a real number, got {type(reward).__name__}")
    try:
        value = float(reward)
    except OverflowError:
        raise Rejected("bad_return", "reward is an integer too large for a float") from None
    if not math.isfinite(value):
        raise Rejected("bad_return", f"reward must be finite, got {value}")
    return value


def _check_flag(flag: Any, name: str) -> bool:
    if not isinstance(flag, bool):
        raise Rejected("bad_return", f"{name} must be bool, got {type(flag).__name__}")
    return flag


def _check_info(info: Any, call: str) -> dict[str, Any]:
    if not isinstance(info, dict):
        raise Rejected("bad_return", f"{call}() info must be dict, got {type(info).__name__}")
    try:
        text = json.dumps(info, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise Rejected("not_serializable", f"{call}() info is not JSON-serialisable: {exc}"[:_MESSAGE_LIMIT]) from None
    decoded = json.loads(text)
    if framing.too_deep(decoded):
        raise Rejected("not_serializable", f"{call}() info is nested deeper than {framing.MAX_JSON_DEPTH}")
    return decoded  # what the client will see: json turns non-string keys into strings


def _encode_or_none(message: dict[str, Any]) -> bytes | None:
    try:
        return framing.encode(message)
    except (TypeError, ValueError, RecursionError):
        return None


def _blocked(action: Any) -> bool:
    try:
        action()
    except OSError:
        return True
    return False


def _shape(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a {len(value)}-tuple"
    return type(value).__name__


def _classify(exc: BaseException, default_kind: str) -> str:
    if isinstance(exc, MemoryError):
        return "memory_limit"
    if isinstance(exc, (SystemExit, KeyboardInterrupt, GeneratorExit)):
        return "exit_called"
    if isinstance(exc, ImportError):
        return "import_blocked"
    return default_kind


def _describe(exc: BaseException) -> str:
    """The exception and the lines of generated code it passed through."""
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - a hostile __str__ must not stop the report
        text = "<the exception could not be printed>"
    lines = [f"{type(exc).__name__}: {text}"[:500]]
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == FILENAME]
    for frame in frames[-3:]:
        lines.append(f"  line {frame.lineno}, in {frame.name}")
    return "\n".join(lines)


def _describe_syntax_error(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError) and exc.lineno is not None:
        return f"line {exc.lineno}: {exc.msg}"
    if isinstance(exc, SyntaxError):
        return str(exc.msg)
    return str(exc)


def _guarded_builtins(allowed: frozenset[str]) -> dict[str, Any]:
    real_import = builtins.__import__

    def guarded_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (),
                       level: int = 0) -> Any:
        top = name.partition(".")[0]
        if level != 0:
            raise ImportBlocked("relative imports are not allowed in an environment")
        if top not in allowed:
            offered = "numpy is offered only with sandbox.offer_numpy" if top == "numpy" \
                else "standard-library modules for computation only"
            raise ImportBlocked(f"import of {name!r} is not allowed in an environment ({offered})")
        return real_import(name, globals, locals, fromlist, level)

    namespace = dict(builtins.__dict__)
    namespace["__import__"] = guarded_import
    for name in ("open", "input", "breakpoint", "help", "exit", "quit"):
        namespace.pop(name, None)
    return namespace


def _choose_env_class(module: types.ModuleType) -> type:
    """The one environment class: defined here, name ends in ``Env``; the most derived, last defined."""
    candidates = [value for value in module.__dict__.values()
                  if isinstance(value, type) and value.__name__.endswith("Env")
                  and value.__module__ == MODULE_NAME]
    leaves = [cls for cls in candidates if not any(other is not cls and issubclass(other, cls) for other in candidates)]
    if not leaves:
        raise Rejected("no_env_class", "no class whose name ends in 'Env' is defined")
    chosen = leaves[-1]
    for method in ("reset", "step"):
        if not callable(getattr(chosen, method, None)):
            raise Rejected("no_env_class", f"class {chosen.__name__} has no {method}() method")
    return chosen


def _accepts(env_class: type, keyword: str) -> bool:
    try:
        parameters = inspect.signature(env_class).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == keyword or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
