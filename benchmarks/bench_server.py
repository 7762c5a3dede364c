"""A rollout server for a benchmark: an already running one (``--url``) or one launched here.

Shared by ``rollout_throughput.py`` and ``weight_sync.py``: ``add_server_args(parser)`` adds the
flags, ``async with served(args) as url`` yields the server's URL and stops a launched server
afterwards (its log goes to a temporary directory that is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import AsyncIterator

from spade.rollout.sglang.launcher import ServerLauncher, free_port, sglang_argv


def add_server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="HF model directory the server loads")
    parser.add_argument("--url", help="use an already running server instead of launching one")
    parser.add_argument("--server-command", help='replaces "python -m sglang.launch_server" (e.g. the stand-in)')
    parser.add_argument("--server-args", help="extra SGLang flags as a JSON object, e.g. '{\"dp_size\": 8}'")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--mem-fraction", type=float, default=0.8)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=1800)


@contextlib.asynccontextmanager
async def served(args: argparse.Namespace) -> AsyncIterator[str]:
    if args.url:
        yield args.url.rstrip("/")
        return
    port = args.port or free_port()
    argv = sglang_argv(args.model_path, tp=args.tp, ep=args.ep, dp=args.dp, mem_fraction=args.mem_fraction, port=port,
                       extra_args=dict(json.loads(args.server_args)) if args.server_args else None,
                       command=shlex.split(args.server_command) if args.server_command else None)
    log_path = Path(tempfile.mkdtemp(prefix="spade-bench-")) / "server.log"
    launcher = ServerLauncher(argv, port=port, log_path=log_path, start_timeout_s=args.start_timeout)
    print(f"starting: {shlex.join(argv)}\n  log: {log_path}", file=sys.stderr)
    await launcher.start()
    try:
        yield launcher.url
    finally:
        await launcher.close()
