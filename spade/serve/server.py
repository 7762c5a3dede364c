"""Building a ``ModelService`` for a model path and an engine kind, and running it over HTTP."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, TypeVar

from spade.rollout.conversation import thinking_template_kwargs

from .http import HTTPServer
from ..agent.reasoning import resolve_parser
from .service import ModelService

EMBEDDED = "embedded"
T = TypeVar("T")


class ServeError(Exception):
    """The model or the engine cannot be set up as asked (a usage error)."""


@dataclass
class ServeOptions:
    model: str
    engine: str = "hf"  # "hf" | "sglang"
    served_model_name: Optional[str] = None
    sglang_urls: list[str] = field(default_factory=list)
    device: str = "auto"
    dtype: str = "auto"
    max_batch_size: int = 8
    max_context_tokens: Optional[int] = None
    default_max_tokens: Optional[int] = None
    reasoning_parser: str = "auto"  # auto | qwen3 | deepseek-r1 | none (spade.agent.reasoning)
    thinking: str = "auto"  # auto | on | off: enable_thinking for prompts, as model.thinking


def resolve_model_dir(model: str) -> tuple[Path, str]:
    """The HF directory for ``--model`` and the default served name."""
    if model == EMBEDDED:
        from spade.models.embedded import MODEL_NAME, embedded_model_dir

        return Path(embedded_model_dir()), MODEL_NAME
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ServeError(f"--model {model}: not a directory (an HF model directory, or 'embedded')")
    if (path / "spade_checkpoint.json").exists():
        raise ServeError(f"--model {model}: serving a Megatron checkpoint is not supported yet; "
                         "export it to an HF directory first (tools/convert_mcore_to_hf.py)")
    if not (path / "config.json").is_file():
        raise ServeError(f"--model {model}: no config.json (not an HF model directory)")
    return path, path.resolve().name


def _eos_ids(directory: Path, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    config = directory / "generation_config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("eos_token_id")
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def build_service(options: ServeOptions) -> ModelService:
    """Load the tokenizer and start the engine (the hf engine loads the model in this process)."""
    from transformers import AutoTokenizer

    directory, default_name = resolve_model_dir(options.model)
    name = options.served_model_name or default_name
    tokenizer = AutoTokenizer.from_pretrained(directory)
    hf_config = json.loads((directory / "config.json").read_text())
    context = options.max_context_tokens or int(hf_config.get("max_position_embeddings") or 4096)
    vocab = int(hf_config.get("vocab_size") or len(tokenizer))
    try:  # before the engine loads the model: a template without the thinking switch fails here
        resolve_parser(options.reasoning_parser, getattr(tokenizer, "chat_template", None))
        thinking_template_kwargs(getattr(tokenizer, "chat_template", None), options.thinking,
                                 key="--thinking")
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    if options.engine == "hf":
        import torch

        from spade.rollout.hf.engine import HFEngine

        device = options.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = options.dtype
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        engine = HFEngine(directory, tokenizer, device=device, dtype=dtype,
                          max_batch_size=options.max_batch_size, max_context_tokens=context)
        eos = set(engine.eos_token_ids)
    elif options.engine == "sglang":
        from spade.rollout.sglang.engine import SGLangEngine

        if not options.sglang_urls:
            raise ServeError("--engine sglang needs --sglang-url URL (one or more)")
        engine = SGLangEngine(options.sglang_urls)
        eos = _eos_ids(directory, tokenizer)
    else:
        raise ServeError(f"--engine must be hf or sglang, got {options.engine!r}")
    return ModelService(engine, tokenizer, name, max_context_tokens=context, eos_token_ids=eos,
                        vocab_size=vocab, default_max_tokens=options.default_max_tokens,
                        aliases=[options.model] if options.model != name else (),
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


def run(options: ServeOptions, host: str, port: int) -> int:
    service = build_service(options)

    def ready(server: HTTPServer) -> None:
        print(f"spade serve: {service.name} on http://{server.host}:{server.port}/v1 "
              f"(engine {options.engine}, reasoning parser {service.reasoning_parser})",
              file=sys.stderr, flush=True)

    asyncio.run(serve(service, host, port, ready))
    return 0

