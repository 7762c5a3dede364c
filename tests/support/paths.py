"""Where the test modules are: ``tests/`` and its folders named after spade's packages
(``tests/envs/``, ``tests/rollout/``, ...). Test modules import each other by their unique base
names (``from test_train_loop import tiny_hf``), so every such folder goes on ``sys.path``: the
conftest does it for pytest, the torchrun workers of ``tests/dist/`` do it for themselves.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
NOT_TEST_FOLDERS = {"support", "fixtures", "dist", "sglang_standin", "__pycache__"}


def test_dirs() -> list[Path]:
    """``tests/`` and each folder of it that holds test modules."""
    return [TESTS] + sorted(d for d in TESTS.iterdir()
                            if d.is_dir() and d.name not in NOT_TEST_FOLDERS and any(d.glob("test_*.py")))


def test_files() -> list[Path]:
    """Every test module, wherever it lives."""
    return sorted(p for d in test_dirs() for p in d.glob("test_*.py"))


def add_test_dirs() -> None:
    """Put every test folder on ``sys.path`` (at its end: a folder never shadows a module)."""
    for directory in map(str, test_dirs()):
        if directory not in sys.path:
            sys.path.append(directory)
