"""What the subcommands share: reading inputs, building the sandbox config, usage errors."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..config import load_yaml
from ..envs.sandbox.config import SandboxConfig

ISOLATION_VARIABLE = "SPADE_SANDBOX_ISOLATION"


class UsageError(Exception):
    """Bad command-line input: exit status 2."""


def read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None


def require_config_file(path: str | None, flag: str = "--config") -> None:
    """A ``--config`` that names no readable file is a usage error, before anything starts."""
    if path is None:
        return
    if not Path(path).is_file():
        raise UsageError(f"{flag} {path}: no such file")


def sandbox_config(args: argparse.Namespace) -> SandboxConfig:
    """The ``sandbox:`` section of ``--config``, then SPADE_SANDBOX_ISOLATION, then ``--isolation``."""
    section = {}
    if getattr(args, "config", None):
        require_config_file(args.config)
        data = load_yaml(args.config)
        section = dict(data.get("sandbox") or {})
    isolation = getattr(args, "isolation", None) or os.environ.get(ISOLATION_VARIABLE)
    if isolation:
        section["isolation"] = isolation
    return SandboxConfig.from_mapping(section)
