"""Shared fixtures: a real sandbox service (bubblewrap) driven from synchronous tests."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Awaitable, TypeVar

import pytest
from hypothesis import settings as hypothesis_settings

from spade.envs.sandbox.client import SandboxService
from spade.envs.sandbox.config import SandboxConfig
from support.paths import add_test_dirs
from xdist_schedule import longest_files_first

add_test_dirs()  # tests/<package>/ folders: test modules import each other by base name

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_ENVS = sorted((ROOT / "examples" / "envs").glob("*.py"))

# Hypothesis: no per-example deadline (its 200 ms default fails property tests on a loaded CI
# machine for no fault of the code) and derandomized, so a run is reproducible; each test keeps
# its own max_examples. HYPOTHESIS_PROFILE=default brings hypothesis' own settings back.
hypothesis_settings.register_profile("spade", deadline=None, derandomize=True, print_blob=True)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "spade"))

# Short timeouts so hostile tests finish fast; the defaults (30 s) are for real runs.
FAST_LIMITS = dict(load_timeout_s=5.0, reset_timeout_s=3.0, step_timeout_s=3.0, memory_limit_mb=256)


class SandboxHarness:
    """A sandbox service plus the event loop it lives on, for plain (non-async) tests."""

    def __init__(self, config: SandboxConfig):
        self.loop = asyncio.new_event_loop()
        self.config = config
        self.service: SandboxService = self.run(SandboxService.start(config))

    def run(self, awaitable: Awaitable[T], timeout: float = 60.0) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(awaitable, timeout))

    def close(self) -> None:
        self.run(self.service.close())
        self.loop.close()


def make_harness(**overrides: Any) -> SandboxHarness:
    if shutil.which("bwrap") is None and overrides.get("isolation") != "unsafe-local":
        pytest.fail("bubblewrap is not installed: run 'make test', which installs it")
    return SandboxHarness(SandboxConfig(**{**FAST_LIMITS, **overrides}))


@pytest.fixture(scope="session")
def sandbox() -> Iterator[SandboxHarness]:
    harness = make_harness()
    yield harness
    harness.close()


def _cuda_available() -> bool:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU-marked tests run where CUDA is; elsewhere they are reported as skipped, with the reason.
    Under pytest-xdist (``make test``) the files are handed out longest first."""
    longest_files_first(items)
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run tools/gpu_check.sh on a GPU machine)")
        for item in gpu_items:
            item.add_marker(skip)
