"""The supervisor process: owns the sandboxes, checks every frame, enforces the wall clock.

Started once by :class:`spade.envs.sandbox.client.SandboxService` (``python -m
spade.envs.sandbox.supervisor FD``), it serves one client over a Unix socket. Each environment is a
hardened child in one of the pool's sandboxes; the supervisor talks to it directly, treats every
reply as untrusted (frame size, JSON depth, schema, sequence number), kills it with SIGKILL when a
call outlives its timeout, and turns every way a child can end into one classified error.
Infrastructure faults (a sandbox died, could not start) are flagged so callers retry them.

It dies with the process that started it: it stops when its socket closes, and when the client
names itself in ``SPADE_SANDBOX_PARENT`` (it does when it launches from its main thread: the
signal follows the thread that forked) the kernel sends it SIGKILL the moment that process dies
(``PR_SET_PDEATHSIG``), however it died. Its sandboxes follow (bubblewrap ``--die-with-parent``;
without bubblewrap the zygote stops when its channel closes and kills its children).
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import math
import os
import resource
import signal
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from ..protocol import EnvError, ErrorKind, Stage
from .config import SandboxConfig
from .sandbox_process import ChildExit, Sandbox, SandboxDied
from .runtime import child as child_runtime
from .runtime import framing
from .runtime.probe_play import Episode, ProbePlan
from .selftest import SelfTestReport, check_probe_child, check_seccomp_probe, check_zygote

CHILD_REPORTABLE_KINDS = frozenset({
    ErrorKind.SYNTAX_ERROR, ErrorKind.NO_ENV_CLASS, ErrorKind.IMPORT_BLOCKED, ErrorKind.INIT_ERROR,
    ErrorKind.RESET_ERROR, ErrorKind.STEP_ERROR, ErrorKind.BAD_RETURN, ErrorKind.NOT_SERIALIZABLE,
    ErrorKind.OUTPUT_TOO_LARGE, ErrorKind.EXIT_CALLED, ErrorKind.MEMORY_LIMIT,
    ErrorKind.REFERENCE_MISSING,  # a probe request for the reference policy of a class without one
})
EXIT_WAIT_S = 3.0
MAX_TOOL_NAME_CHARS = 200


class Fault(Exception):
    def __init__(self, error: EnvError):
        super().__init__(error.message)
        self.error = error


def fault(kind: ErrorKind, stage: Stage, message: str, *, infrastructure: bool = False) -> Fault:
    return Fault(EnvError(kind, stage, message, infrastructure))


@dataclass
class ChildEnv:
    env_id: int
    sandbox: Sandbox
    pid: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    seq: int = 0
    failed: EnvError | None = None
    closed: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Supervisor:
    def __init__(self, config: SandboxConfig):
        self.config = config
        self.slots: list[Sandbox | None] = [None] * config.pool_size
        self.slot_locks = [asyncio.Lock() for _ in range(config.pool_size)]
        self.envs: dict[int, ChildEnv] = {}
        self.env_ids = itertools.count(1)
        self.capacity = asyncio.Semaphore(config.pool_size * config.max_envs_per_sandbox)
        self.report = SelfTestReport()
        self.counters = {"opened": 0, "faults": 0, "sandboxes_started": 0, "children_killed": 0}

    # -- sandboxes ------------------------------------------------------------------------------

    async def start(self) -> SelfTestReport:
        results = await asyncio.gather(*(self._start_slot(i) for i in range(len(self.slots))),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, Fault):
                self.report.problems.append(f"bubblewrap: {result.error.message}")
            elif isinstance(result, BaseException):
                self.report.problems.append(f"bubblewrap: {result!r}")
        return self.report

    async def _start_slot(self, index: int) -> Sandbox:
        sandbox = Sandbox(index, self.config)
        try:
            await sandbox.start()
        except SandboxDied as exc:
            raise fault(ErrorKind.CRASHED, Stage.SERVICE, str(exc), infrastructure=True) from None
        except OSError as exc:
            raise fault(ErrorKind.CRASHED, Stage.SERVICE, f"cannot start a sandbox: {exc}",
                        infrastructure=True) from None
        report = SelfTestReport()
        await self._self_test(sandbox, report)
        self.report.layers.update(report.layers)
        for warning in report.warnings:
            if warning not in self.report.warnings:
                self.report.warnings.append(warning)
        if report.problems:
            self.report.problems.extend(p for p in report.problems if p not in self.report.problems)
            await sandbox.destroy()
            raise fault(ErrorKind.CRASHED, Stage.SERVICE, "isolation self-test failed: " + "; ".join(report.problems),
                        infrastructure=True)
        self.slots[index] = sandbox
        self.counters["sandboxes_started"] += 1
        return sandbox

    async def _self_test(self, sandbox: Sandbox, report: SelfTestReport) -> None:
        strict = self.config.isolation == "bubblewrap"
        check_zygote(report, sandbox.hello, bubblewrap=sandbox.bubblewrap, tmp_probe=sandbox.tmp_probe)
        limits = self.config.child_limits(sandbox.readable_paths)
        probe = await self._probe(sandbox, "selftest", {"write_probe": "/tmp/spade-selftest-write",
                                                        "read_probe": "/proc/self/status"})
        if isinstance(probe, dict):
            check_probe_child(report, probe, limits, strict=strict)
        else:
            report.check("hardening", False, f"the probe child failed: {probe}")
        ended = await self._probe(sandbox, "selftest_seccomp", {})
        check_seccomp_probe(report, ended if isinstance(ended, int) else None, strict=strict)

    async def _probe(self, sandbox: Sandbox, op: str, payload: dict[str, Any]) -> dict[str, Any] | int | str:
        """The probe's result, or the signal that ended it, or a description of what went wrong."""
        pid, sock = await sandbox.spawn()
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        try:
            writer.write(framing.encode({"op": op, "seq": 1, **payload}))
            await writer.drain()
            reply = await asyncio.wait_for(_read_frame(reader, self.config.max_frame_bytes), 10)
            if reply is not None:
                return reply.get("result") if reply.get("ok") else str(reply.get("error"))
        except (asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError, framing.FrameError) as exc:
            return repr(exc)
        finally:
            writer.close()
        status = await sandbox.wait_exit(pid, EXIT_WAIT_S)
        if status is None:
            return "no exit status"
        return status.signal if status.signal is not None else f"exit code {status.code}"

    async def _pick_sandbox(self) -> Sandbox:
        best: Sandbox | None = None
        for index in range(len(self.slots)):
            sandbox = self.slots[index]
            if sandbox is None or not sandbox.alive:
                sandbox = await self._replace(index)
            if sandbox is not None and sandbox.live_envs < self.config.max_envs_per_sandbox and (
                    best is None or sandbox.live_envs < best.live_envs):
                best = sandbox
        if best is None:
            raise fault(ErrorKind.CRASHED, Stage.SERVICE, "no sandbox could be started", infrastructure=True)
        return best

    async def _replace(self, index: int) -> Sandbox | None:
        async with self.slot_locks[index]:
            current = self.slots[index]
            if current is not None and current.alive:
                return current
            if current is not None:
                await current.destroy()
                self.slots[index] = None
            try:
                return await self._start_slot(index)
            except Fault:
                return None

    # -- environments ---------------------------------------------------------------------------

    async def open_env(self, source: str, max_turns: int | None, released_loader_names: bool = False) -> dict[str, Any]:
        size = len(source.encode("utf-8", "surrogatepass"))
        if size > self.config.max_source_bytes:
            raise fault(ErrorKind.SOURCE_TOO_LARGE, Stage.LOAD,
                        f"source is {size} bytes, limit {self.config.max_source_bytes}")
        try:
            await asyncio.wait_for(self.capacity.acquire(), self.config.load_timeout_s)
        except asyncio.TimeoutError:
            raise fault(ErrorKind.CRASHED, Stage.SERVICE, "every environment slot stayed busy",
                        infrastructure=True) from None
        try:
            sandbox = await self._pick_sandbox()
            try:
                pid, sock = await sandbox.spawn()
            except SandboxDied as exc:
                raise fault(ErrorKind.CRASHED, Stage.SERVICE, str(exc), infrastructure=True) from None
            reader, writer = await asyncio.open_unix_connection(sock=sock)
        except BaseException:
            self.capacity.release()
            raise
        env = ChildEnv(next(self.env_ids), sandbox, pid, reader, writer)
        sandbox.live_envs += 1
        self.envs[env.env_id] = env
        self.counters["opened"] += 1
        load = {"source": source, "max_turns": max_turns}
        if released_loader_names:
            load["released_loader_names"] = True
        reply = await self.call(env, "load", load,
                                self.config.load_timeout_s, Stage.LOAD)
        result = reply["result"]
        return {"env": env.env_id, "class_name": result["class_name"], "max_turns": result["max_turns"],
                "tool_use": result.get("tool_use") is True}

    async def call(self, env: ChildEnv, op: str, payload: dict[str, Any], timeout: float, stage: Stage) -> dict[str, Any]:
        async with env.lock:
            if env.failed is not None:
                raise Fault(env.failed)
            if env.closed:
                raise fault(ErrorKind.PROTOCOL_ERROR, stage, "the environment is closed")
            env.seq += 1
            try:
                reply = await self._exchange(env, op, env.seq, payload, timeout, stage)
            except Fault as exc:
                env.failed = exc.error
                self.counters["faults"] += 1
                await self._discard(env)
                raise
            return reply

    async def _exchange(self, env: ChildEnv, op: str, seq: int, payload: dict[str, Any], timeout: float,
                        stage: Stage) -> dict[str, Any]:
        try:
            reply = await asyncio.wait_for(self._round_trip(env, {"op": op, "seq": seq, **payload}), timeout)
        except asyncio.TimeoutError:
            await self._kill(env)
            raise fault(ErrorKind.TIMEOUT, stage, f"{op} did not finish within {timeout:g} s") from None
        except framing.FrameError as exc:
            await self._kill(env)
            raise fault(ErrorKind.PROTOCOL_ERROR, stage, str(exc)) from None
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            status = await env.sandbox.wait_exit(env.pid, EXIT_WAIT_S)
            raise Fault(self._classify_exit(env, status, stage)) from None
        problem = _reply_problem(reply, op, seq, self.config)
        if problem is not None:
            await self._kill(env)
            raise fault(ErrorKind.PROTOCOL_ERROR, stage, problem)
        if not reply["ok"]:
            error = reply["error"]
            raise fault(ErrorKind(error["kind"]), stage, error["message"])
        return reply

    async def _round_trip(self, env: ChildEnv, request: dict[str, Any]) -> Any:
        env.writer.write(framing.encode(request))
        await env.writer.drain()
        reply = await _read_frame(env.reader, self.config.max_frame_bytes)
        if reply is None:
            raise ConnectionError("the child closed its socket")
        return reply

    async def probe(self, env: ChildEnv, plan: ProbePlan) -> dict[str, Any]:
        """One ``probe`` request (:mod:`.runtime.probe_play`): the child plays every episode and
        sends one progress frame per episode. It is bounded by the probes' time budget plus one
        call's timeout; a child killed on the way (that timeout, a crash, the memory limit) gives
        the episodes it reported and ``cut``, the error, for the caller to finish the loop with
        (every later call fails). After an environment fault the environment is discarded, as
        after a failed call."""
        plan = replace(plan, reset_timeout_s=self.config.reset_timeout_s, step_timeout_s=self.config.step_timeout_s)
        timeout = plan.max_seconds + max(plan.reset_timeout_s, plan.step_timeout_s)
        async with env.lock:
            if env.failed is not None:
                raise Fault(env.failed)
            if env.closed:
                raise fault(ErrorKind.PROTOCOL_ERROR, Stage.STEP, "the environment is closed")
            env.seq += 1
            episodes: list[Episode] = []
            cut: EnvError | None = None
            try:
                reply = await asyncio.wait_for(self._probe_frames(env, env.seq, plan, episodes), timeout)
            except asyncio.TimeoutError:
                await self._kill(env)
                cut = EnvError(ErrorKind.TIMEOUT, Stage.STEP, f"the probe episodes did not finish within {timeout:g} s")
            except (framing.FrameError, ValueError) as exc:
                await self._kill(env)
                await self._fail(env, EnvError(ErrorKind.PROTOCOL_ERROR, Stage.STEP, str(exc)))
            except (asyncio.IncompleteReadError, ConnectionError, OSError):
                status = await env.sandbox.wait_exit(env.pid, EXIT_WAIT_S)
                cut = self._classify_exit(env, status, Stage.STEP)
                if cut.infrastructure:
                    await self._fail(env, cut)
            if cut is not None:
                await self._fail(env, cut, raise_it=False)
                return {"episodes": [e.to_json() for e in episodes], "cut": cut.to_json()}
            problem = _reply_problem(reply, "probe", env.seq, self.config)
            if problem is not None:
                await self._kill(env)
                await self._fail(env, EnvError(ErrorKind.PROTOCOL_ERROR, Stage.STEP, problem))
            if not reply["ok"]:
                error = reply["error"]
                await self._fail(env, EnvError(ErrorKind(error["kind"]), Stage.STEP, error["message"]))
            result = reply["result"]
            if result["fault"] is not None:
                await self._fail(env, EnvError(ErrorKind(result["fault"]["kind"]), Stage.STEP,
                                               result["fault"]["message"]), raise_it=False)
            return result

    async def _probe_frames(self, env: ChildEnv, seq: int, plan: ProbePlan, episodes: list[Episode]) -> Any:
        """Send the probe request; collect progress frames into ``episodes``; return the final reply."""
        env.writer.write(framing.encode({"op": "probe", "seq": seq, "plan": plan.to_json()}))
        await env.writer.drain()
        while True:
            frame = await _read_frame(env.reader, self.config.max_frame_bytes)
            if frame is None:
                raise ConnectionError("the child closed its socket")
            if not (isinstance(frame, dict) and "progress" in frame):
                return frame
            if frame.get("seq") != seq:
                raise framing.FrameError(f"progress frame carries sequence number {frame.get('seq')!r}, expected {seq}")
            if len(episodes) >= len(plan.policies) * len(plan.seeds):  # the child may be hostile: bound it
                raise framing.FrameError("more progress frames than the plan has episodes")
            episodes.append(Episode.from_json(frame["progress"]))

    async def _fail(self, env: ChildEnv, error: EnvError, *, raise_it: bool = True) -> None:
        """Mark ``env`` failed with ``error`` and discard it (later calls raise it); raise it as a Fault."""
        env.failed = error
        self.counters["faults"] += 1
        await self._discard(env)
        if raise_it:
            raise Fault(error)

    def _classify_exit(self, env: ChildEnv, status: ChildExit | None, stage: Stage) -> EnvError:
        if status is None:
            if not env.sandbox.alive:
                return EnvError(ErrorKind.CRASHED, stage, "the sandbox died: " + env.sandbox.describe_stderr(), True)
            return EnvError(ErrorKind.CRASHED, stage, "the environment process vanished without an exit status")
        if status.signal is not None:
            name = _signal_name(status.signal)
            if status.signal == signal.SIGSYS:
                return EnvError(ErrorKind.SANDBOX_VIOLATION, stage,
                                "killed by seccomp: the environment made a forbidden system call "
                                "(process creation, exec, sockets, signals to other processes, mounts, ...)")
            if status.signal == signal.SIGXCPU:
                return EnvError(ErrorKind.CPU_LIMIT, stage, f"used more than {self.config.cpu_limit_s} s of CPU time")
            if status.signal == signal.SIGXFSZ:
                return EnvError(ErrorKind.SANDBOX_VIOLATION, stage, "tried to write a file")
            if status.signal == signal.SIGKILL:
                return EnvError(ErrorKind.CRASHED, stage, "killed by SIGKILL (the kernel's out-of-memory killer "
                                                          "or the CPU hard limit)")
            return EnvError(ErrorKind.CRASHED, stage, f"the environment process died by {name}")
        if status.code == child_runtime.EXIT_MEMORY:
            return EnvError(ErrorKind.MEMORY_LIMIT, stage, "ran out of memory "
                                                           f"(limit {self.config.memory_limit_mb} MiB)")
        if status.code == child_runtime.EXIT_HARDENING_FAILED:
            return EnvError(ErrorKind.CRASHED, stage, "the sandboxed child could not apply its isolation layers",
                            True)
        return EnvError(ErrorKind.EXIT_CALLED, stage, f"the environment exited the process (exit code {status.code})")

    async def _kill(self, env: ChildEnv) -> None:
        self.counters["children_killed"] += 1
        try:
            env.sandbox.kill(env.pid)
        except SandboxDied:
            return
        if await env.sandbox.wait_exit(env.pid, EXIT_WAIT_S) is None and env.sandbox.alive:
            await env.sandbox.destroy()  # the zygote did not act: replace the whole sandbox

    async def _discard(self, env: ChildEnv) -> None:
        if env.closed:
            return
        env.closed = True
        env.writer.close()
        env.sandbox.live_envs -= 1
        self.envs.pop(env.env_id, None)
        self.capacity.release()

    async def close_env(self, env_id: int) -> None:
        env = self.envs.get(env_id)
        if env is None:
            return
        async with env.lock:
            if not env.closed:
                try:
                    env.writer.write(framing.encode({"op": "close"}))
                except (ConnectionError, OSError):
                    pass
                await self._discard(env)
        asyncio.get_running_loop().call_later(EXIT_WAIT_S, env.sandbox.forget_exit, env.pid)

    def get_env(self, env_id: Any, stage: Stage) -> ChildEnv:
        env = self.envs.get(env_id) if isinstance(env_id, int) else None
        if env is None:
            raise fault(ErrorKind.PROTOCOL_ERROR, stage, f"no open environment {env_id!r}")
        return env

    async def shutdown(self) -> None:
        for env in list(self.envs.values()):
            await self._discard(env)
        await asyncio.gather(*(s.destroy() for s in self.slots if s is not None), return_exceptions=True)

    # -- client ---------------------------------------------------------------------------------

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "open":
            source, max_turns = request.get("source"), request.get("max_turns")
            released_names = request.get("released_loader_names", False)
            if not isinstance(source, str) or not (max_turns is None or _is_int(max_turns)):
                raise fault(ErrorKind.PROTOCOL_ERROR, Stage.LOAD, "open needs a string 'source'")
            if not isinstance(released_names, bool):
                raise fault(ErrorKind.PROTOCOL_ERROR, Stage.LOAD, "released_loader_names must be true or false")
            return await self.open_env(source, max_turns, released_names)
        if op == "reset":
            env = self.get_env(request.get("env"), Stage.RESET)
            seed = request.get("seed")
            if not (seed is None or _is_int(seed)):
                raise fault(ErrorKind.PROTOCOL_ERROR, Stage.RESET, "seed must be an integer or null")
            reply = await self.call(env, "reset", {"seed": seed}, self.config.reset_timeout_s, Stage.RESET)
            return _with_output(reply)
        if op == "step":
            env = self.get_env(request.get("env"), Stage.STEP)
            action = request.get("action")
            if not isinstance(action, str) or len(action) > self.config.max_action_chars:
                raise fault(ErrorKind.PROTOCOL_ERROR, Stage.STEP,
                            f"action must be a string of at most {self.config.max_action_chars} characters")
            reply = await self.call(env, "step", {"action": action}, self.config.step_timeout_s, Stage.STEP)
            return _with_output(reply)
        if op == "probe":
            env = self.get_env(request.get("env"), Stage.STEP)
            try:
                plan = ProbePlan.from_json(request.get("plan"))
            except ValueError as exc:
                raise fault(ErrorKind.PROTOCOL_ERROR, Stage.STEP, f"probe: {exc}") from None
            return await self.probe(env, plan)
        if op in ("tools", "criteria"):
            stage = Stage.RESET if op == "tools" else Stage.STEP
            env = self.get_env(request.get("env"), stage)
            reply = await self.call(env, op, {}, self.config.step_timeout_s, stage)
            return _with_output(reply)
        if op == "call_tool":
            env = self.get_env(request.get("env"), Stage.STEP)
            name, arguments = request.get("name"), request.get("arguments")
            if not isinstance(name, str) or len(name) > MAX_TOOL_NAME_CHARS or not isinstance(arguments, dict):
                raise fault(ErrorKind.PROTOCOL_ERROR, Stage.STEP, "call_tool needs a tool name (a string of at most "
                            f"{MAX_TOOL_NAME_CHARS} characters) and an arguments object")
            reply = await self.call(env, "call_tool", {"name": name, "arguments": arguments},
                                    self.config.step_timeout_s, Stage.STEP)
            # "output" is the tool's answer here; what the environment printed travels as "printed"
            return {**reply["result"], "printed": reply["output"], "output_dropped": reply["output_dropped"]}
        if op == "close":
            await self.close_env(request.get("env"))
            return {}
        if op == "stats":
            return {**self.counters, "live_envs": len(self.envs),
                    "sandboxes_alive": sum(1 for s in self.slots if s is not None and s.alive)}
        raise fault(ErrorKind.PROTOCOL_ERROR, Stage.SERVICE, f"unknown op {op!r}")

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks: set[asyncio.Task[None]] = set()
        limit = self.config.request_frame_bytes
        while True:
            try:
                request = await _read_frame(reader, limit)
            except (framing.FrameError, asyncio.IncompleteReadError, ConnectionError):
                break
            if request is None:
                break
            task = asyncio.create_task(self._answer(request, writer))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        for task in tasks:
            task.cancel()

    async def _answer(self, request: Any, writer: asyncio.StreamWriter) -> None:
        request_id = request.get("id") if isinstance(request, dict) else None
        try:
            result = await self.handle(request if isinstance(request, dict) else {})
            response: dict[str, Any] = {"id": request_id, "ok": True, "result": result}
        except Fault as exc:
            response = {"id": request_id, "ok": False, "error": exc.error.to_json()}
        except Exception as exc:  # noqa: BLE001 - a bug here must not take the service down
            error = EnvError(ErrorKind.PROTOCOL_ERROR, Stage.SERVICE, f"supervisor error: {exc!r}", True)
            response = {"id": request_id, "ok": False, "error": error.to_json()}
        try:
            writer.write(framing.encode(response))
        except (ConnectionError, OSError):
            pass


def _with_output(reply: dict[str, Any]) -> dict[str, Any]:
    return {**reply["result"], "output": reply["output"], "output_dropped": reply["output_dropped"]}


async def _read_frame(reader: asyncio.StreamReader, max_bytes: int) -> Any:
    try:
        header = await reader.readexactly(framing.HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    (length,) = framing.HEADER.unpack(header)
    if length > max_bytes:
        raise framing.FrameError(f"frame of {length} bytes exceeds the limit of {max_bytes}")
    return framing.decode_payload(await reader.readexactly(length))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _reply_problem(reply: Any, op: str, seq: int, config: SandboxConfig) -> str | None:
    """Why a child's reply breaks the protocol, or None. The child may be hostile: check it all."""
    if not isinstance(reply, dict):
        return "reply is not an object"
    if reply.get("seq") != seq or not _is_int(reply.get("seq")):
        return f"reply carries sequence number {reply.get('seq')!r}, expected {seq}"
    if not isinstance(reply.get("ok"), bool) or not isinstance(reply.get("output"), str) \
            or not _is_int(reply.get("output_dropped")):
        return "reply lacks ok/output fields"
    if len(reply["output"]) > config.max_captured_output_bytes:
        return "captured output exceeds its cap"
    if not reply["ok"]:
        error = reply.get("error")
        if not isinstance(error, dict) or not isinstance(error.get("message"), str):
            return "error reply without a message"
        if error.get("kind") not in {kind.value for kind in CHILD_REPORTABLE_KINDS}:
            return f"error reply with kind {error.get('kind')!r}, which a child may not report"
        return None
    result = reply.get("result")
    if not isinstance(result, dict):
        return "reply without a result object"
    if op == "load":
        if not isinstance(result.get("class_name"), str) or not (
                result.get("max_turns") is None or _is_int(result.get("max_turns"))):
            return "load result needs class_name and max_turns"
        return None
    if op in ("tools", "call_tool", "criteria"):
        return _tool_reply_problem(result, op, config)
    if op == "probe":
        return _probe_reply_problem(result)
    observation = result.get("observation")
    if not isinstance(observation, str) or not isinstance(result.get("info"), dict):
        return f"{op} result needs observation (str) and info (object)"
    if len(observation) > config.max_observation_chars:
        return "observation exceeds the size limit"
    if op == "step":
        if not _is_real(result.get("reward")):
            return "step reward is not a finite number"
        if not isinstance(result.get("terminated"), bool) or not isinstance(result.get("truncated"), bool):
            return "step terminated/truncated must be booleans"
    return None


PROBE_FAULT_KINDS = frozenset({kind.value for kind in CHILD_REPORTABLE_KINDS} | {ErrorKind.TIMEOUT.value})


def _probe_reply_problem(result: dict[str, Any]) -> str | None:
    episodes, fault_ = result.get("episodes"), result.get("fault")
    if not isinstance(episodes, list) or not _is_int(result.get("steps")) \
            or not isinstance(result.get("budget_exhausted"), bool):
        return "probe result needs episodes (list), steps (int) and budget_exhausted (bool)"
    try:
        for episode in episodes:
            Episode.from_json(episode)
    except ValueError as exc:
        return str(exc)
    if fault_ is not None and not (isinstance(fault_, dict) and fault_.get("kind") in PROBE_FAULT_KINDS
                                   and isinstance(fault_.get("message"), str)):
        return "probe result's fault needs a kind a child may report and a message"
    return None


def _tool_reply_problem(result: dict[str, Any], op: str, config: SandboxConfig) -> str | None:
    """The tool operations' results: progress fields on all three, then each op's own."""
    total, current, instruction = result.get("total"), result.get("current"), result.get("instruction")
    if not (_is_int(total) and _is_int(current) and 0 <= current <= total) \
            or not isinstance(result.get("all_done"), bool) \
            or not (instruction is None or (isinstance(instruction, str)
                                            and len(instruction) <= config.max_observation_chars)):
        return f"{op} result needs current/total/instruction/all_done progress fields"
    if op == "tools":
        tools = result.get("tools")
        if not isinstance(tools, list) or not all(
                isinstance(t, dict) and isinstance(t.get("function"), dict)
                and isinstance(t["function"].get("name"), str) for t in tools):
            return "tools result needs a list of OpenAI function objects"
    elif op == "call_tool":
        if not isinstance(result.get("output"), str) or result.get("returncode") not in (0, 1) \
                or isinstance(result.get("returncode"), bool) or not _is_int(result.get("advanced")):
            return "call_tool result needs output (str), returncode (0 or 1) and advanced (int)"
        if len(result["output"]) > config.max_observation_chars:
            return "tool output exceeds the size limit"
    else:
        criteria = result.get("criteria")
        if not isinstance(criteria, list) or not all(
                isinstance(c, dict) and (c.get("value") is None or isinstance(c.get("value"), bool))
                and (c.get("error") is None or isinstance(c.get("error"), str)) for c in criteria):
            return "criteria result needs a list of {value, error}"
    return None


async def _main(channel_fd: int) -> int:
    import socket

    sock = socket.socket(fileno=channel_fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
    hello = await _read_frame(reader, 1 << 20)
    if not isinstance(hello, dict):
        return 2
    try:
        config = SandboxConfig.from_mapping(hello.get("config"))
    except ValueError as exc:
        writer.write(framing.encode({"op": "failed", "problems": [f"config: {exc}"], "warnings": []}))
        await writer.drain()
        return 2
    supervisor = Supervisor(config)
    report = await supervisor.start()
    status = {"op": "ready" if report.ok else "failed", "problems": report.problems,
              "warnings": report.warnings, "layers": report.layers}
    writer.write(framing.encode(status))
    await writer.drain()
    if report.ok:
        await supervisor.serve(reader, writer)
    await supervisor.shutdown()
    return 0 if report.ok else 1


def _raise_open_file_limit() -> None:
    """One socket per live environment: allow as many as the hard limit permits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 16, hard))


PARENT_ENV = "SPADE_SANDBOX_PARENT"
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL when the process named in ``SPADE_SANDBOX_PARENT`` dies; exit now if it is gone."""
    parent = os.environ.pop(PARENT_ENV, None)
    if not parent:
        return
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # not Linux: the closed socket still stops us
    if os.getppid() != int(parent):  # it died before the signal was armed
        os._exit(0)


def main() -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client decides when we stop
    _raise_open_file_limit()
    sys.exit(asyncio.run(_main(int(sys.argv[1]))))


if __name__ == "__main__":
    main()
