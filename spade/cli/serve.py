"""``spade serve``: an OpenAI-compatible HTTP server for a model (see docs/serving.md).

``--model`` is any model reference ``spade.run.engines`` resolves (an HF directory, ``embedded``, a
spade checkpoint, a run directory: its newest intact checkpoint). The engine comes from the
``engine:`` section of ``--config`` and ``engine.*`` overrides, as for ``spade train``; ``--engine``,
``--device``, ``--dtype``, ``--max-batch-size`` and ``--sglang-url`` are shorthands for its keys.
The port is checked before the model loads.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Optional

from .common import UsageError


@dataclass
class ServeOptions:
    """What ``spade serve``'s command line says (``None``: the config's value, else the default)."""

    model: str
    engine: Optional[str] = None  # engine.kind: hf | sglang
    served_model_name: Optional[str] = None
    sglang_urls: list[str] = field(default_factory=list)
    device: Optional[str] = None  # engine.device, or one GPU (cuda:N)
    dtype: Optional[str] = None  # model.dtype
    max_batch_size: Optional[int] = None
    max_context_tokens: Optional[int] = None
    default_max_tokens: Optional[int] = None
    reasoning_parser: str = "auto"  # auto | qwen3 | deepseek-r1 | none (spade.agent.reasoning)
    thinking: str = "auto"  # auto | on | off: enable_thinking for prompts, as model.thinking
    config: Optional[str] = None  # a train config whose engine: section and model.dtype apply
    overrides: list[str] = field(default_factory=list)  # engine.KEY=VALUE, model.dtype=VALUE


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "serve", help="OpenAI-compatible HTTP server (chat with tools, completions, models, streaming)",
        description="Serve a model over the OpenAI HTTP API: /v1/chat/completions (tools and "
                    "tool_calls in the model's own syntax), /v1/completions, /v1/models, /health.")
    parser.add_argument("--model", required=True,
                        help="HF model directory, a spade checkpoint (RUN/checkpoints/step_N), a run directory "
                             "(its newest intact checkpoint), or 'embedded' (the embedded demo model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="a train config whose engine: section and model.dtype set up the engine")
    parser.add_argument("--engine", choices=("hf", "sglang"), default=None,
                        help="engine.kind: hf, in-process transformers (default); sglang, running SGLang servers")
    parser.add_argument("--sglang-url", nargs="+", default=[], metavar="URL",
                        help="engine.sglang.urls: base URLs of SGLang servers serving --model (with --engine sglang)")
    parser.add_argument("--served-model-name", default=None,
                        help="the model id clients use (default: the directory's name)")
    parser.add_argument("--device", default=None, help="engine.device (hf engine): auto, cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default=None, choices=("auto", "float32", "bfloat16", "float16"),
                        help="model.dtype (hf engine; auto: bf16 on a GPU or a CPU with AMX/AVX512-BF16, "
                             "else fp32)")
    parser.add_argument("--max-batch-size", type=int, default=None,
                        help="engine.max_batch_size (hf engine): requests per batch (default 8)")
    parser.add_argument("--max-context", type=int, default=None,
                        help="prompt plus completion limit (default: the config's max_position_embeddings)")
    parser.add_argument("--default-max-tokens", type=int, default=None,
                        help="max_tokens of requests that give none (default: the rest of the context)")
    parser.add_argument("--reasoning-parser", choices=("auto", "qwen3", "deepseek-r1", "none"),
                        default="auto",
                        help="separate <think> reasoning into reasoning_content, as SGLang's parser of "
                             "that name (default auto: qwen3 if the chat template writes <think>, "
                             "else none)")
    parser.add_argument("--thinking", choices=("auto", "on", "off"), default="auto",
                        help="enable_thinking for every prompt unless a request's chat_template_kwargs "
                             "sets it, as model.thinking (default auto: the template's own default)")
    parser.add_argument("overrides", nargs="*", metavar="engine.key=value",
                        help="engine settings as in a train config, e.g. engine.batch_wait_ms=5")
    parser.set_defaults(handler=run_serve)


def build_service(options: ServeOptions):
    """Resolve the model, check its chat template, open the engine and put the service over it."""
    from ..run.engines import ModelRefError, engine_settings, load_tokenizer, open_engine_now, report, resolve_model
    from ..serve.server import ServiceOptions, check_template, make_service

    try:
        settings = engine_settings(options.config, options.overrides, engine=options.engine, device=options.device,
                                   dtype=options.dtype, max_batch_size=options.max_batch_size,
                                   sglang_urls=options.sglang_urls)
        ref = resolve_model(options.model)
        if settings.kind == "sglang" and not settings.section.sglang.urls:
            raise UsageError("--engine sglang needs --sglang-url URL (engine.sglang.urls)")
        tokenizer = load_tokenizer(ref)
        check_template(tokenizer, options.reasoning_parser, options.thinking)  # before the model loads
        report("serve", ref, settings)
        opened = open_engine_now(ref, settings, tokenizer=tokenizer, max_context_tokens=options.max_context_tokens)
    except ModelRefError as exc:
        raise UsageError(str(exc)) from None
    name = options.served_model_name or ref.label
    service_options = ServiceOptions(served_model_name=name, aliases=(options.model,) if options.model != name else (),
                                     default_max_tokens=options.default_max_tokens,
                                     reasoning_parser=options.reasoning_parser, thinking=options.thinking)
    return make_service(opened.engine, tokenizer, service_options, max_context_tokens=opened.max_context_tokens,
                        vocab_size=opened.vocab_size, eos_token_ids=opened.eos_token_ids)


def run_serve(args: argparse.Namespace) -> int:
    from ..serve.server import ServeError, check_port, run

    if args.max_batch_size is not None and args.max_batch_size < 1:
        raise UsageError("--max-batch-size must be >= 1")
    if args.port < 0 or args.port > 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    options = ServeOptions(
        model=args.model, engine=args.engine, served_model_name=args.served_model_name,
        sglang_urls=list(args.sglang_url), device=args.device, dtype=args.dtype,
        max_batch_size=args.max_batch_size, max_context_tokens=args.max_context,
        default_max_tokens=args.default_max_tokens, reasoning_parser=args.reasoning_parser,
        thinking=args.thinking, config=args.config, overrides=list(args.overrides))
    try:
        check_port(args.host, args.port)  # before the model loads
        service = build_service(options)
        return run(service, args.host, args.port)
    except ServeError as exc:
        raise UsageError(str(exc)) from None
