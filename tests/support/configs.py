"""Test run configs written from a dict (``yaml.safe_dump``), not from f-string YAML: no doubled
braces, no quoting of paths by hand, and a test can change one field of a shared config.

``write_config(path, config)`` writes ``config`` (paths become strings) and returns ``path``;
``example_envs(directory, names)`` copies example games from ``examples/envs`` into ``directory``
(created) for a fixed pool and returns it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
TWO_EXAMPLE_ENVS = ("hidden_sequence.py", "remainder_oracle.py")


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def write_config(path: Path, config: dict[str, Any]) -> Path:
    """Write ``config`` as YAML to ``path`` (its sections in the order given); returns ``path``."""
    path = Path(path)
    path.write_text(yaml.safe_dump(_plain(config), sort_keys=False))
    return path


def example_envs(directory: Path, names: tuple[str, ...] = TWO_EXAMPLE_ENVS) -> Path:
    """``names`` copied from examples/envs into ``directory`` (created); returns ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(ROOT / "examples" / "envs" / name, directory / name)
    return directory


# The sandbox's limits in the tests' runs: short, so that a hung game fails fast.
SANDBOX_LIMITS = {"load_timeout_s": 10.0, "reset_timeout_s": 5.0, "step_timeout_s": 5.0, "memory_limit_mb": 256}
