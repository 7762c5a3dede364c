"""``spade explore RUN_DIR... [--port P] [--export DIR]``: the environment explorer, a local web
page (served on 127.0.0.1, or written as a static site that opens from disk). See docs/analysis.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .common import UsageError

DEFAULT_PORT = 8765


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("explore", help="browse the environments of runs in a local web page")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port on 127.0.0.1 (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--export", metavar="DIR", help="write a static site to DIR (open DIR/index.html) and exit")
    parser.add_argument("--embedding", choices=("minilm", "hashing"), default="minilm",
                        help="embedding of the map: all-MiniLM-L6-v2 (default) or a model-free hashing stand-in")
    parser.add_argument("--seed", type=int, default=0, help="seed of the t-SNE layout")
    parser.set_defaults(handler=run_explore)


def run_explore(args: argparse.Namespace) -> int:
    from ..analysis.embeddings import make_embedder
    from ..analysis.explorer import ExplorerServer, build_site, export_site

    for path in args.run_dirs:
        if not Path(path).is_dir():
            raise UsageError(f"no such run directory: {path}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must lie in 0..65535, got {args.port}")

    def say(message: str) -> None:
        print(f"spade explore: {message}", file=sys.stderr, flush=True)

    embedder = make_embedder(args.embedding)
    if args.export:
        site = build_site(args.run_dirs, embedder, seed=args.seed, progress=say)
        index = export_site(site, Path(args.export))
        print(f"wrote {index} ({len(site.details)} environments); open it in a browser")
        return 0
    try:
        server = ExplorerServer(args.run_dirs, embedder, port=args.port, seed=args.seed, progress=say)
    except OSError as exc:
        raise UsageError(f"cannot listen on 127.0.0.1:{args.port}: {exc.strerror}") from None
    server.cache.get()  # build once before saying where to look
    print(f"spade explore: serving {len(args.run_dirs)} run(s) at {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.httpd.server_close()
    return 0
