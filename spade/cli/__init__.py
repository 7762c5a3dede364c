"""The ``spade`` command."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from ..config import ConfigError
from ..envs.sandbox.client import SandboxUnavailable
from . import analyze, demo, engine_check, env_commands, eval, explore, memory, pool, prompts, score, serve, train
from .common import UsageError

EXIT_USAGE = 2
EXIT_SANDBOX_UNAVAILABLE = 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spade", description="Self-play in environments the model writes itself.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    env_commands.add_parser(commands)
    demo.add_parser(commands)
    score.add_parser(commands)
    memory.add_parser(commands)
    train.add_parser(commands)
    engine_check.add_parser(commands)
    analyze.add_parser(commands)
    explore.add_parser(commands)
    serve.add_parser(commands)
    eval.add_parser(commands)
    pool.add_parser(commands)
    prompts.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the real command line: `spade env check ... | head` ends quietly. Not when
        # called in process (tests): a default SIGPIPE would kill the caller on its next write to a closed socket
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (UsageError, ConfigError) as exc:
        print(f"spade: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SandboxUnavailable as exc:
        print(f"spade: {exc}", file=sys.stderr)
        return EXIT_SANDBOX_UNAVAILABLE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
