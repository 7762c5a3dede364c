"""``spade serve``: an OpenAI-compatible HTTP server for a model (see docs/serving.md)."""

from __future__ import annotations

import argparse

from .common import UsageError


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "serve", help="OpenAI-compatible HTTP server (chat with tools, completions, models, streaming)",
        description="Serve a model over the OpenAI HTTP API: /v1/chat/completions (tools and "
                    "tool_calls in the model's own syntax), /v1/completions, /v1/models, /health.")
    parser.add_argument("--model", required=True,
                        help="HF model directory, or 'embedded' (the embedded demo model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    parser.add_argument("--engine", choices=("hf", "sglang"), default="hf",
                        help="hf: in-process transformers (default); sglang: running SGLang servers")
    parser.add_argument("--sglang-url", nargs="+", default=[], metavar="URL",
                        help="base URLs of SGLang servers serving --model (with --engine sglang)")
    parser.add_argument("--served-model-name", default=None,
                        help="the model id clients use (default: the directory's name)")
    parser.add_argument("--device", default="auto", help="hf engine: cpu, cuda, cuda:N (default: auto)")
    parser.add_argument("--dtype", default="auto",
                        help="hf engine: float32, bfloat16, float16 (default: bf16 on GPU, fp32 on CPU)")
    parser.add_argument("--max-batch-size", type=int, default=8, help="hf engine: requests per batch")
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
    parser.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from ..serve.server import ServeError, ServeOptions, run

    if args.max_batch_size < 1:
        raise UsageError("--max-batch-size must be >= 1")
    if args.port < 0 or args.port > 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    options = ServeOptions(
        model=args.model, engine=args.engine, served_model_name=args.served_model_name,
        sglang_urls=list(args.sglang_url), device=args.device, dtype=args.dtype,
        max_batch_size=args.max_batch_size, max_context_tokens=args.max_context,
        default_max_tokens=args.default_max_tokens, reasoning_parser=args.reasoning_parser,
        thinking=args.thinking)
    if args.engine == "sglang" and not options.sglang_urls:
        raise UsageError("--engine sglang needs --sglang-url URL")
    try:
        return run(options, args.host, args.port)
    except ServeError as exc:
        raise UsageError(str(exc)) from None
