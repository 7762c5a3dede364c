"""The async API the orchestrator uses: open generated environments and play them, sandboxed.

    async with await SandboxService.start(SandboxConfig()) as service:
        env = await service.open(source, max_turns=25)
        first = await env.reset(seed=42)
        result = await env.step("\\boxed{3}")
        await env.close()

Failures raise :class:`EnvFault` (the environment's fault: penalise it) or
:class:`InfrastructureFault` (the sandbox's: retry). One service holds hundreds of environments;
calls on different environments run concurrently.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from ..protocol import EnvError, ErrorKind, InfrastructureFault, ResetResult, Stage, StepResult, raise_for
from ..tool_use.protocol import CriteriaResult, CriterionValue, Progress, ToolResult, ToolSchemas, call_problem
from .config import SandboxConfig
from .runtime import framing
from .runtime.probe_play import Episode, ProbeOutcome, ProbePlan

log = logging.getLogger("spade.sandbox")
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@dataclass(frozen=True)
class ProbeRun:
    """What a ``probe`` request gave: the whole outcome, or, when the child was killed on the way
    (``cut``: why), only the episodes it had reported."""

    outcome: ProbeOutcome | None
    episodes: tuple[Episode, ...] = ()
    cut: EnvError | None = None


class ActionRefused(ValueError):
    """The host did not send an action or a tool call: the policy wrote something the sandbox
    cannot take (too long, not strict JSON, nested too deep). Nothing ran; the environment is
    unchanged and still usable."""


class SandboxUnavailable(RuntimeError):
    """The service refused to start: an isolation layer is missing (named in the message)."""


@dataclass(frozen=True)
class IsolationReport:
    layers: dict[str, bool]
    warnings: list[str] = field(default_factory=list)


class SandboxService:
    def __init__(self, config: SandboxConfig):
        self.config = config
        self.report = IsolationReport({})
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._reader_task: asyncio.Task[None] | None = None
        self._restart_lock = asyncio.Lock()
        self._closed = False
        self.generation = 0  # counts supervisor launches; environments belong to one generation

    @classmethod
    async def start(cls, config: SandboxConfig | None = None) -> "SandboxService":
        service = cls(config or SandboxConfig())
        await service._launch()
        return service

    async def _launch(self) -> None:
        self.generation += 1
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {**os.environ, "PYTHONPATH": PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        if threading.current_thread() is threading.main_thread():
            # the supervisor arms a parent-death signal, which follows the thread that forks it
            env["SPADE_SANDBOX_PARENT"] = str(os.getpid())
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "spade.envs.sandbox.supervisor", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        finally:
            theirs.close()
        self._reader, self._writer = await asyncio.open_unix_connection(sock=ours, limit=1 << 20)
        self._writer.write(framing.encode({"config": self.config.to_json()}))
        try:
            status = await asyncio.wait_for(self._read(), self.config.start_timeout_s * 2)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, framing.FrameError) as exc:
            self._kill_process()
            raise SandboxUnavailable(f"the sandbox supervisor did not start: {exc!r}") from None
        if not isinstance(status, dict) or status.get("op") != "ready":
            self._kill_process()
            problems = status.get("problems") if isinstance(status, dict) else None
            raise SandboxUnavailable("refusing to run generated code; isolation self-test failed: "
                                     + "; ".join(problems or ["the supervisor exited"]))
        self.report = IsolationReport(status.get("layers", {}), status.get("warnings", []))
        for warning in self.report.warnings:
            log.warning("sandbox: %s", warning)
        self._reader_task = asyncio.create_task(self._dispatch_replies())

    async def _read(self) -> Any:
        assert self._reader is not None
        header = await self._reader.readexactly(framing.HEADER.size)
        (length,) = framing.HEADER.unpack(header)
        return framing.decode_payload(await self._reader.readexactly(length))

    async def _dispatch_replies(self) -> None:
        try:
            while True:
                reply = await self._read()
                future = self._pending.pop(reply.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(reply)
        except (asyncio.IncompleteReadError, ConnectionError, framing.FrameError):
            pass
        finally:
            error = EnvError(ErrorKind.CRASHED, Stage.SERVICE, "the sandbox supervisor exited", True)
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(InfrastructureFault(error))
            self._pending.clear()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None and self._reader_task is not None \
            and not self._reader_task.done()

    async def _request(self, op: str, *, generation: int | None = None, **payload: Any) -> dict[str, Any]:
        if not self.running:
            error = EnvError(ErrorKind.CRASHED, Stage.SERVICE, "the sandbox supervisor is not running", True)
            raise InfrastructureFault(error)
        if generation is not None and generation != self.generation:
            error = EnvError(ErrorKind.CRASHED, Stage.SERVICE,
                             "the sandbox supervisor restarted; this environment went with the old one", True)
            raise InfrastructureFault(error)
        request_id = next(self._ids)
        frame = framing.encode({"id": request_id, "op": op, **payload})
        if len(frame) > self.config.request_frame_bytes:
            raise ValueError(f"{op} request of {len(frame)} bytes exceeds the sandbox's request limit")
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        assert self._writer is not None
        self._writer.write(frame)
        reply = await future
        if not reply.get("ok"):
            raise_for(_error_from_json(reply.get("error", {})))
        return reply.get("result", {})

    async def _ensure_running(self) -> None:
        async with self._restart_lock:
            if not self.running and not self._closed:
                log.warning("sandbox: the supervisor is gone; starting a new one")
                self._kill_process()
                await self._launch()

    async def open(self, source: str, *, max_turns: int | None = None,
                   released_loader_names: bool = False) -> "SandboxedEnv":
        """Load ``source`` in a fresh sandboxed process and instantiate its environment class.

        ``released_loader_names``: the child binds the released loader's standard-library names
        in the module before running it (:mod:`.runtime.loader_names`; pool games only)."""
        size = len(source.encode("utf-8", "surrogatepass"))
        if size > self.config.max_source_bytes:
            raise_for(EnvError(ErrorKind.SOURCE_TOO_LARGE, Stage.LOAD,
                               f"source is {size} bytes, limit {self.config.max_source_bytes}"))
        await self._ensure_running()
        generation = self.generation
        options = {"released_loader_names": True} if released_loader_names else {}
        result = await self._request("open", generation=generation, source=source, max_turns=max_turns, **options)
        return SandboxedEnv(self, generation, result["env"], result["class_name"], result["max_turns"],
                            tool_use=result.get("tool_use") is True)

    async def stats(self) -> dict[str, Any]:
        return await self._request("stats")

    async def close(self) -> None:
        self._closed = True
        if self._writer is not None:
            self._writer.close()
        if self._process is not None:
            try:
                await asyncio.wait_for(asyncio.to_thread(self._process.wait), 10)
            except asyncio.TimeoutError:
                self._kill_process()
        if self._reader_task is not None:
            self._reader_task.cancel()

    def _kill_process(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    async def __aenter__(self) -> "SandboxService":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class SandboxedEnv:
    """One live environment in the sandbox. Calls on it are serialised by the supervisor."""

    def __init__(self, service: SandboxService, generation: int, env_id: int, class_name: str,
                 max_turns: int | None, *, tool_use: bool = False):
        self._service = service
        self.tool_use = tool_use  # the class subclasses ToolUseBaseEnv: the tool operations apply
        self._generation = generation
        self.env_id = env_id
        self.class_name = class_name
        self.max_turns = max_turns
        self.closed = False

    async def reset(self, seed: int | None = None) -> ResetResult:
        result = await self._call("reset", seed=seed)
        return ResetResult(result["observation"], result["info"], result.get("output", ""))

    async def step(self, action: str) -> StepResult:
        """Raises ActionRefused for an action longer than ``sandbox.max_action_chars``."""
        if len(action) > self._service.config.max_action_chars:
            raise ActionRefused(f"action of {len(action)} characters exceeds sandbox.max_action_chars "
                             f"({self._service.config.max_action_chars})")
        result = await self._call("step", action=action)
        return StepResult(result["observation"], float(result["reward"]), result["terminated"],
                          result["truncated"], result["info"], result.get("output", ""))

    async def probe(self, plan: ProbePlan) -> ProbeRun:
        """Play the degenerate-policy probes' ``plan`` in the sandbox, in one request
        (:mod:`.runtime.probe_play`). The plan's call timeouts are the sandbox's own."""
        result = await self._call("probe", plan=plan.to_json())
        episodes = tuple(Episode.from_json(e) for e in result["episodes"])
        if result.get("cut") is not None:
            return ProbeRun(None, episodes, _error_from_json(result["cut"]))
        fault = result.get("fault")
        outcome = ProbeOutcome(list(episodes), result["steps"], result["budget_exhausted"],
                               None if fault is None else (fault["kind"], fault["message"]))
        return ProbeRun(outcome, episodes)

    # -- tool environments (spade.envs.tool_use.protocol) ----------------------------------------

    async def tools(self) -> ToolSchemas:
        """The tool schemas fixed at the last reset, and the instruction progress."""
        result = await self._call("tools")
        return ToolSchemas(result["tools"], Progress.from_json(result))

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """One tool call with structured arguments. Raises ActionRefused, sending nothing, for a
        call the sandbox cannot take (``tool_use.protocol.call_problem``: arguments that are not
        a strict-JSON object, nested too deep, a name too long; a frame the supervisor refused
        would end every environment it serves) or arguments larger than
        ``sandbox.max_action_chars`` once encoded."""
        problem = call_problem(name, arguments)
        if problem is not None:
            raise ActionRefused(problem)
        size = len(framing.encode(arguments))
        if size > self._service.config.max_action_chars:
            raise ActionRefused(f"tool arguments of {size} bytes exceed sandbox.max_action_chars "
                                f"({self._service.config.max_action_chars})")
        result = await self._call("call_tool", name=name, arguments=arguments)
        return ToolResult(result["output"], int(result["returncode"]), Progress.from_json(result),
                          int(result["advanced"]), result.get("printed", ""))

    async def criteria(self) -> CriteriaResult:
        """Every success criterion evaluated on the current state."""
        result = await self._call("criteria")
        return CriteriaResult([CriterionValue(c.get("value"), c.get("error")) for c in result["criteria"]],
                              Progress.from_json(result))

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await self._call("close")
        except InfrastructureFault:
            pass

    async def _call(self, op: str, **payload: Any) -> dict[str, Any]:
        return await self._service._request(op, generation=self._generation, env=self.env_id, **payload)

    async def __aenter__(self) -> "SandboxedEnv":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


def _error_from_json(data: dict[str, Any]) -> EnvError:
    try:
        kind = ErrorKind(data.get("kind"))
        stage = Stage(data.get("stage"))
    except ValueError:
        kind, stage = ErrorKind.PROTOCOL_ERROR, Stage.SERVICE
    return EnvError(kind, stage, str(data.get("message", "")), bool(data.get("infrastructure", False)))
