"""The uv settings under which verifiers 0.4 prepares its harness programs (standard library only).

verifiers runs the model side of every rollout as a PEP 723 script (its ``null`` harness: a chat
loop over the OpenAI client) in an environment made by ``uv sync --script``; it finds ``uv`` on
``PATH`` and would otherwise install it from the network. ``make verifiers`` installs a pinned
``uv`` into ``.venv-verifiers`` and fills a uv cache there with the chat program's packages
(``tools/warm_verifiers_uv.py``), so a rollout's ``uv sync`` installs from that cache in about a
second. The resolution date is fixed, so every machine resolves the same versions, and uv never
downloads a Python (the venv's interpreter serves the script).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

RESOLVED_BEFORE = "2026-12-01T00:00:00Z"  # uv's --exclude-newer for the harness programs


def uv_environment(venv: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``venv``'s uv first on ``PATH`` and its
    cache, the fixed resolution date and no Python downloads."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join(filter(None, [str(venv / "bin"), env.get("PATH")]))
    env["UV_CACHE_DIR"] = str(venv / "uv-cache")
    env["UV_EXCLUDE_NEWER"] = RESOLVED_BEFORE
    env["UV_PYTHON_DOWNLOADS"] = "never"
    return env
