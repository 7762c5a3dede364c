"""The run directory's checkpoints: ``latest`` only ever names a verified checkpoint, and resume
picks the newest intact one, skipping each damaged newer one with a warning that names what is
wrong. Real Megatron checkpoints of a tiny model (gloo world of one), saved the way the trainer
saves them: ``save_checkpoint``, ``write_trainer_state``, ``mark_latest``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import support.hf_fixtures as hx
from megatron_fixtures import megatron_world  # noqa: F401  (fixture)
from spade.models import ParallelLayout

pytestmark = pytest.mark.usefixtures("megatron_world")

LAYOUT = ParallelLayout()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A run directory with intact checkpoints at steps 1, 2 and 3 (latest: step_3)."""
    from spade.run.run_dir import RunDir
    from spade.training.checkpoint import save_checkpoint

    hf_dir = hx.save_tiny_hf("qwen3", tmp_path_factory.mktemp("hf") / "qwen3")
    hf_config = json.loads((hf_dir / "config.json").read_text())
    model, _ = hx.megatron_model(hf_dir, LAYOUT)
    ddp, optimizer = hx.trainer(model)
    run = RunDir(tmp_path_factory.mktemp("pristine") / "run")
    run.create("run: {steps: 3}\n")
    for step in (1, 2, 3):
        hx.train_step(ddp, optimizer, hx.batch(step))
        save_checkpoint(run.checkpoint_dir(step), [ddp], hf_config=hf_config, layout=LAYOUT, step=step,
                        optimizer=optimizer, tokenizer_dir=hf_dir)
        run.write_trainer_state(step, {"step": step, "orchestrator": {}})
        run.mark_latest(step)
    return run.root


@pytest.fixture
def run(pristine, tmp_path):
    from spade.run.run_dir import RunDir

    shutil.copytree(pristine, tmp_path / "run")
    return RunDir(tmp_path / "run")


def distcp(run, step: int) -> Path:
    return sorted(run.checkpoint_dir(step).glob("*.distcp"))[0]


def test_intact_run_resumes_from_latest(run):
    assert run.newest_intact_checkpoint() == (3, [])
    assert run.latest_step() == 3


def delete(path: Path) -> None:
    path.unlink()


def halve(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


@pytest.mark.parametrize("target, damage, says", [
    (lambda run: distcp(run, 3), delete, "is missing"),
    (lambda run: distcp(run, 3), halve, "truncated"),
    (lambda run: run.checkpoint_dir(3) / "spade_manifest.json", delete, "spade_manifest.json is missing"),
    (lambda run: run.checkpoint_dir(3) / "trainer_state.json", delete, "trainer_state.json is missing"),
    (lambda run: run.checkpoint_dir(3) / "spade_checkpoint.json", halve, "spade_checkpoint.json has"),
], ids=["file-deleted", "file-truncated", "manifest-missing", "trainer-state-missing", "info-truncated"])
def test_a_damaged_latest_checkpoint_is_skipped_with_a_warning(run, target, damage, says):
    from spade.training.checkpoint import load_checkpoint

    path = target(run)
    damage(path)
    step, warnings = run.newest_intact_checkpoint()
    assert step == 2
    assert len(warnings) == 1 and warnings[0].startswith("skipping checkpoint step_3, it is damaged")
    assert says in warnings[0] and f"{run.checkpoint_dir(3)}: {path.name}" in warnings[0]
    model, _ = hx.megatron_model(run.checkpoint_dir(2) / "hf", LAYOUT, load_weights=False)
    ddp, optimizer = hx.trainer(model)
    assert load_checkpoint(run.checkpoint_dir(2), [ddp], optimizer=optimizer).step == 2  # it loads


def test_a_changed_byte_is_found_by_the_checksum(run):
    path = distcp(run, 3)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x01
    path.write_bytes(bytes(data))
    step, warnings = run.newest_intact_checkpoint()
    assert step == 2 and "CRC-32" in warnings[0] and path.name in warnings[0]
    assert run.newest_intact_checkpoint(checksums=False) == (3, [])  # sizes alone cannot tell


def test_several_damaged_checkpoints_and_none_intact(run):
    distcp(run, 3).unlink()
    (run.checkpoint_dir(2) / "spade_manifest.json").unlink()
    step, warnings = run.newest_intact_checkpoint()
    assert step == 1 and [w.split(",")[0] for w in warnings] == ["skipping checkpoint step_3",
                                                                 "skipping checkpoint step_2"]
    distcp(run, 1).unlink()
    step, warnings = run.newest_intact_checkpoint()
    assert step is None and len(warnings) == 4
    assert "no intact checkpoint" in warnings[-1] and "--run-dir NEW_DIR" in warnings[-1]
    assert str(run.config_path) in warnings[-1]


def test_latest_bounds_the_choice(run):
    """A checkpoint newer than latest was interrupted before it counted; latest missing: none counts."""
    shutil.copytree(run.checkpoint_dir(3), run.checkpoint_dir(4))
    assert run.newest_intact_checkpoint() == (3, [])
    shutil.rmtree(run.checkpoint_dir(3))
    step, warnings = run.newest_intact_checkpoint()
    assert step == 2 and warnings == [f"{run.checkpoints_dir / 'latest'} names step_3, which does not exist"]
    (run.checkpoints_dir / "latest").write_text("garbage")
    step, warnings = run.newest_intact_checkpoint()
    assert step == 2 and "unexpected content" in warnings[0]  # step_4 is not intact: its info says 3
    (run.checkpoints_dir / "latest").unlink()
    assert run.newest_intact_checkpoint() == (None, [])


def test_latest_is_never_pointed_at_a_damaged_checkpoint(run):
    from spade.run.run_dir import RunDirError

    shutil.copytree(run.checkpoint_dir(3), run.checkpoint_dir(4))
    with pytest.raises(RunDirError, match="step_4.*damaged"):
        run.mark_latest(4)  # its info file and trainer state say step 3
    damaged = distcp(run, 2)
    damaged.unlink()
    with pytest.raises(RunDirError, match=f"{damaged.name} is missing"):
        run.mark_latest(2)
    assert (run.checkpoints_dir / "latest").read_text().strip() == "step_3"


def test_trainer_state_is_recorded_in_the_manifest(run):
    from spade.training.checkpoint_manifest import read_manifest

    entry = read_manifest(run.checkpoint_dir(3))["trainer_state.json"]
    assert entry["size"] == (run.checkpoint_dir(3) / "trainer_state.json").stat().st_size
    run.write_trainer_state(3, {"step": 3, "orchestrator": {"more": [1, 2, 3]}})
    assert run.newest_intact_checkpoint() == (3, [])
    (run.checkpoint_dir(3) / "trainer_state.json").write_text('{"step": 3}')  # edited behind our back
    assert run.newest_intact_checkpoint()[0] == 2


# ------------------------------------------------------------------ spade train --resume with no step left


class Reached(Exception):
    """Raised by the preflight and the trainer stand-ins: the resume went on to load and train."""


@pytest.fixture
def cli_without_training(monkeypatch, capsys):
    """``spade train`` in process, its preflight and trainer replaced by ``Reached``; returns a
    function running ``--resume RUN [overrides]`` that gives (exit status, stderr)."""
    import spade.run.preflight
    import spade.run.trainer
    from spade.cli import main

    def reached(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(spade.run.preflight, "preflight", reached)
    monkeypatch.setattr(spade.run.trainer, "train", reached)

    def resume(run, *overrides: str) -> tuple[int, str]:
        status = main(["train", "--resume", str(run.root), *overrides])
        return status, capsys.readouterr().err

    return resume


def test_resume_of_a_finished_run_says_so_and_exits_4_before_loading(run, cli_without_training):
    """The run's config asks for 3 steps and step_3 is intact: nothing to train. The next save
    would come 16 steps on (run.checkpoint_every's default), so that is the run.steps offered."""
    status, err = cli_without_training(run)
    assert status == 4
    assert err.strip() == (f"spade train: nothing to do: {run.root} has run all 3 steps (checkpoints/step_3); "
                           f"raise run.steps=19 to "
                           f"continue (spade train --resume {run.root} run.steps=19)")


def test_resume_with_run_steps_below_the_checkpoint_says_so(run, cli_without_training):
    status, err = cli_without_training(run, "run.steps=2")
    assert status == 4 and f"{run.root} is at step 3, past run.steps=2; raise run.steps=19 to continue" in err
    assert run.config_path.read_text() == "run: {steps: 3}\n"  # a resume that ran nothing leaves it as it was


@pytest.mark.parametrize("setup", ["more-steps", "latest-before-the-end", "newest-damaged"])
def test_resume_with_a_step_left_goes_on_to_train(run, cli_without_training, setup):
    """Where the trainer would start before run.steps, the resume goes on (to the preflight)."""
    overrides = ["run.steps=4"] if setup == "more-steps" else []
    if setup == "latest-before-the-end":  # step_3 was being saved when the run stopped: it does not count
        (run.checkpoints_dir / "latest").write_text("step_2\n")
    if setup == "newest-damaged":  # a flipped byte only the CRC-32 finds: the trainer resumes from step_2
        path = distcp(run, 3)
        data = bytearray(path.read_bytes())
        data[-10] ^= 0x01
        path.write_bytes(bytes(data))
    with pytest.raises(Reached):
        cli_without_training(run, *overrides)
