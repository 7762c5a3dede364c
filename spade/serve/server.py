"""A ``ModelService`` over an engine it is handed (``spade.run.engines`` opens engines), run over HTTP."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, TypeVar

from spade.rollout.conversation import thinking_template_kwargs

from .http import HTTPServer
from ..agent.reasoning import resolve_parser
from .service import ModelService

T = TypeVar("T")


class ServeError(Exception):
    """The server cannot be set up as asked (a usage error)."""


@dataclass(frozen=True)
class ServiceOptions:
    """How the service answers, whatever engine it is handed."""

    served_model_name: str
    aliases: tuple[str, ...] = ()  # other names requests may use (the --model given)
    max_context_tokens: Optional[int] = None  # None: the engine's
    default_max_tokens: Optional[int] = None
    reasoning_parser: str = "auto"  # auto | qwen3 | deepseek-r1 | none (spade.agent.reasoning)
    thinking: str = "auto"  # auto | on | off: enable_thinking for prompts, as model.thinking


def check_template(tokenizer: Any, reasoning_parser: str, thinking: str) -> None:
    """Refuse, before an engine loads the model, a reasoning parser or thinking switch that the
    tokenizer's chat template cannot take."""
    try:
        resolve_parser(reasoning_parser, getattr(tokenizer, "chat_template", None))
        thinking_template_kwargs(getattr(tokenizer, "chat_template", None), thinking, key="--thinking")
    except ValueError as exc:
        raise ServeError(str(exc)) from None


def check_port(host: str, port: int) -> None:
    """Refuse a port another process listens on, before anything loads (the server binds it as
    asyncio does, with SO_REUSEADDR, so a port left in TIME_WAIT is not refused)."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ServeError(f"--host {host}: {exc.strerror}") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise ServeError(f"--port {port}: cannot listen on {host}:{port} ({exc.strerror}); "
                                 "is another server running there? Choose another --port (0: any free port)") from None


def make_service(engine: Any, tokenizer: Any, options: ServiceOptions, *, max_context_tokens: int,
                 vocab_size: int, eos_token_ids: set[int]) -> ModelService:
    """The OpenAI-compatible service over an engine that is already open."""
    return ModelService(engine, tokenizer, options.served_model_name,
                        max_context_tokens=options.max_context_tokens or max_context_tokens,
                        eos_token_ids=eos_token_ids, vocab_size=vocab_size,
                        default_max_tokens=options.default_max_tokens, aliases=list(options.aliases),
                        reasoning_parser=options.reasoning_parser, thinking=options.thinking)


async def serve(service: ModelService, host: str, port: int,
                on_ready: Optional[Callable[[HTTPServer], None]] = None) -> None:
    """Serve until SIGINT / SIGTERM, then close the engine."""
    server = HTTPServer(service.handle, host, port)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    if on_ready is not None:
        on_ready(server)
    try:
        await stop.wait()
    finally:
        service.engine.close()
        await server.close()


class BackgroundServer:
    """``service`` over HTTP on a thread with its own event loop, for a caller that must keep its
    own thread (tests that drive the server with a blocking client, benchmarks). ``url`` is the
    base URL (``.../v1``) once ``start`` returns; ``call`` runs a coroutine on the server's loop
    (e.g. an engine call, which must share the loop the engine serves on)."""

    def __init__(self, service: ModelService, host: str = "127.0.0.1", port: int = 0) -> None:
        self.service = service
        self.http = HTTPServer(service.handle, host, port)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="spade-serve", daemon=True)
        self._ready = threading.Event()
        self._stop: Optional[asyncio.Event] = None
        self._error: Optional[BaseException] = None

    @property
    def url(self) -> str:
        return f"http://{self.http.host}:{self.http.port}/v1"

    def start(self, timeout_s: float = 60.0) -> "BackgroundServer":
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"the server did not start within {timeout_s} s")
        if self._error is not None:
            raise self._error
        return self

    def call(self, coroutine: Awaitable[T], timeout_s: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def close(self, timeout_s: float = 60.0) -> None:
        if self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout_s)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _main(self) -> None:
        async def main() -> None:
            self._stop = asyncio.Event()
            try:
                await self.http.start()
            except BaseException as exc:  # noqa: BLE001 - handed to start()
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                self.service.engine.close()
                await self.http.close()

        # as asyncio.run ends a loop: the tasks still pending (the engine's batcher, woken by
        # engine.close() but not yet resumed) are cancelled and awaited before the loop closes
        with asyncio.Runner(loop_factory=lambda: self.loop) as runner:
            runner.run(main())


def run(service: ModelService, host: str, port: int) -> int:
    def ready(server: HTTPServer) -> None:
        print(f"spade serve: {service.name} on http://{server.host}:{server.port}/v1 "
              f"(engine {type(service.engine).__name__}, reasoning parser {service.reasoning_parser})",
              file=sys.stderr, flush=True)

    asyncio.run(serve(service, host, port, ready))
    return 0
