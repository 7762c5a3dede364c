"""A protocol-faithful stand-in for an SGLang server (``server.py``), for CPU-only tests, and the
helpers that launch it the way production launches SGLang. The server runs forked from the test
process's prewarmed interpreter (tests/prewarmed.py: ``python()``), a real process of its own that
skips importing torch and transformers again."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import prewarmed
from spade.rollout.sglang.launcher import ServerLauncher, free_port, sglang_argv

SERVER_SCRIPT = Path(__file__).resolve().parent / "server.py"


def standin_argv(argv: Sequence[str], python: Optional[str] = None) -> list[str]:
    """``sglang_argv(...)`` with ``python -m sglang.launch_server`` swapped for the stand-in, run by
    ``python`` (default: the prewarmed interpreter's stand-in for ``sys.executable``)."""
    argv = list(argv)
    python = python or prewarmed.python()
    if argv[1:3] != ["-m", "sglang.launch_server"]:
        raise ValueError(f"not an SGLang launch command: {argv[:3]}")
    return [python, str(SERVER_SCRIPT), *argv[3:]]


def standin_launcher(
    model_dir: Union[str, Path],
    *,
    log_path: Union[str, Path],
    tp: int = 1,
    port: Optional[int] = None,
    env: Optional[Mapping[str, str]] = None,
    start_timeout_s: float = 60.0,
) -> ServerLauncher:
    """A ``ServerLauncher`` for the stand-in, with exactly the flags production gives SGLang."""
    port = port or free_port()
    argv = standin_argv(sglang_argv(model_dir, tp=tp, port=port))
    return ServerLauncher(argv, port=port, log_path=log_path, env=env,
                          start_timeout_s=start_timeout_s, poll_interval_s=0.1)
