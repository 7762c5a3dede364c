"""``run.keep_checkpoints`` (issue 25): pruning keeps the newest N complete checkpoints, every one
marked best and the one a resumed run started from, and never touches a save newer than
``latest``. Checkpoint directories here are stand-ins (pruning reads only names and ``latest``)."""

from __future__ import annotations

import pytest

from spade.run.run_dir import RunDir, RunDirError
from spade.train_config import from_dict


def make_run(tmp_path, steps, latest) -> RunDir:
    run = RunDir(tmp_path / "run")
    for step in steps:
        directory = run.checkpoint_dir(step)
        directory.mkdir(parents=True)
        (directory / "trainer_state.json").write_text("{}")
    (run.checkpoints_dir / "latest").write_text(f"step_{latest}")
    return run


def remaining(run: RunDir) -> list[int]:
    return sorted(run.checkpoint_steps())


def test_default_keeps_the_last_two_and_the_smoke_run_one():
    import yaml
    from pathlib import Path

    assert from_dict({}).run.keep_checkpoints == 2
    smoke = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples/smoke_cpu.yaml").read_text())
    assert smoke["run"]["keep_checkpoints"] == 1


def test_keeps_the_newest_and_those_marked_best(tmp_path):
    run = make_run(tmp_path, range(1, 7), latest=6)
    run.mark_best(2)
    run.prune_checkpoints(2)
    assert remaining(run) == [2, 5, 6]
    assert run.best_steps() == {2}


def test_never_the_checkpoint_being_resumed_from(tmp_path):
    run = make_run(tmp_path, [3, 4, 5], latest=5)
    removed = run.prune_checkpoints(1, protect=(3,))
    assert remaining(run) == [3, 5] and removed == [run.checkpoint_dir(4)]


def test_a_save_newer_than_latest_is_left_alone_and_not_counted(tmp_path):
    run = make_run(tmp_path, [4, 5, 6], latest=5)
    (run.checkpoints_dir / "step_7").mkdir()  # a save cut off before its trainer state
    (run.checkpoints_dir / "step_6.tmp-123").mkdir()  # an interrupted save's temp directory
    run.prune_checkpoints(2)
    assert remaining(run) == [4, 5, 6, 7]
    assert not (run.checkpoints_dir / "step_6.tmp-123").exists()


def test_zero_keeps_all_and_a_missing_checkpoint_cannot_be_best(tmp_path):
    run = make_run(tmp_path, [1, 2, 3], latest=3)
    assert run.prune_checkpoints(0) == [] and remaining(run) == [1, 2, 3]
    with pytest.raises(RunDirError, match="step_000009|step_9"):
        run.mark_best(9)
