"""The order in which ``make test``'s pytest-xdist workers take the test files (``--dist loadfile``).

Each file goes to one worker as a whole (its module fixtures are built once), and a worker asks for
the next file when it runs dry, so the files are handed out longest first: a long file taken last
would leave the other worker idle while it runs. The figures are seconds per file on 2 cores
(CPU time of the file's process and its subprocesses, or its wall time where it mostly waits),
measured in a full ``make test`` run (December 2026) with tools/pytest_file_times.py, which also
prints this table; a file not listed counts as 0 and keeps its place in the usual (alphabetical)
order. Stale figures only cost time, never a verdict: the order of the tests inside a file is
unchanged, and a plain (serial) run is not reordered at all.
"""

from __future__ import annotations

import os

import pytest

SECONDS: dict[str, float] = {
    "test_train_loop.py": 233,
    "test_resume_kills.py": 68,
    "test_device_check.py": 49,
    "test_train_tool_use.py": 40,
    "test_sglang_deployment.py": 30,
    "test_control_group.py": 25,
    "test_sandbox_hostile.py": 25,
    "test_checkpoint_distributed.py": 24,
    "test_training_distributed.py": 23,
    "test_weight_transport.py": 22,
    "test_sglang_failures.py": 21,
    "test_no_orphans.py": 21,
    "test_embedded_model.py": 19,
    "test_train_preflight.py": 19,
    "test_rlve.py": 18,
    "test_sglang_standin.py": 18,
    "test_score.py": 18,
    "test_conversion.py": 18,
    "test_rank_reads_distributed.py": 17,
    "test_serve_sglang.py": 17,
    "test_analysis_baselines.py": 17,
    "test_cli.py": 15,
    "test_eval_runner.py": 15,
    "test_megatron_patches.py": 14,
    "test_resume_before_update.py": 13,
    "test_tool_use_designed.py": 13,
    "test_tau2_bench.py": 13,
    "test_analysis_cli.py": 12,
    "test_sglang_engine.py": 12,
    "test_external_designer.py": 11,
    "test_checkpoint_first_step.py": 11,
    "test_serve.py": 10,
}


def longest_files_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place, whole files longest first, only inside an xdist worker (every
    worker computes the same order, which xdist requires)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    items.sort(key=lambda item: -SECONDS.get(item.path.name, 0.0))  # stable: files stay whole
