"""spade.training.checkpoint (and the modules beside it) in one process (gloo world of one, TP=1): exact round trips of model,
optimizer and RNG state, the info file and hf/ directory, atomic saves, and clear errors."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import support.hf_fixtures as hx
from megatron_fixtures import megatron_world  # noqa: F401  (fixture)
from spade.models import ParallelLayout

pytestmark = pytest.mark.usefixtures("megatron_world")

LAYOUT = ParallelLayout()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return hx.save_tiny_hf("qwen3", tmp_path_factory.mktemp("hf") / "qwen3")


@pytest.fixture(scope="module")
def hf_config(hf_dir) -> dict:
    return json.loads((hf_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def saved(tmp_path_factory, hf_dir, hf_config) -> Path:
    """A model-only checkpoint of the HF weights."""
    from spade.training.checkpoint import save_checkpoint

    model, _ = hx.megatron_model(hf_dir, LAYOUT)
    directory = tmp_path_factory.mktemp("ckpt") / "model-only"
    save_checkpoint(directory, [model], hf_config=hf_config, layout=LAYOUT, step=7, tokenizer_dir=hf_dir)
    return directory


def draws() -> list[float]:
    import random

    import numpy
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    with get_cuda_rng_tracker().fork():
        forked = torch.rand(2).tolist()
    return torch.rand(2).tolist() + forked + [random.random(), float(numpy.random.rand())]


@pytest.mark.parametrize("distributed_optimizer", [False, True], ids=["optimizer", "distributed-optimizer"])
def test_round_trip_of_model_optimizer_and_rng_is_exact(tmp_path, hf_dir, hf_config, distributed_optimizer):
    from spade.training.checkpoint import load_checkpoint, save_checkpoint

    model, spec = hx.megatron_model(hf_dir, LAYOUT)
    ddp, optimizer = hx.trainer(model, distributed_optimizer=distributed_optimizer)
    hx.train_step(ddp, optimizer, hx.batch(1))
    save_checkpoint(tmp_path / "ckpt", [ddp], hf_config=hf_config, layout=LAYOUT, step=1,
                    optimizer=optimizer, tokenizer_dir=hf_dir)
    step1 = hx.hf_state(model, spec, LAYOUT)
    expected_draws = draws()
    losses = [hx.train_step(ddp, optimizer, hx.batch(2)), hx.train_step(ddp, optimizer, hx.batch(3))]
    expected = hx.hf_state(model, spec, LAYOUT)

    fresh, _ = hx.megatron_model(hf_dir, LAYOUT, load_weights=False, seed=11)
    fresh_ddp, fresh_optimizer = hx.trainer(fresh, distributed_optimizer=distributed_optimizer)
    torch.manual_seed(99)
    info = load_checkpoint(tmp_path / "ckpt", [fresh_ddp], optimizer=fresh_optimizer)
    assert (info.step, info.contents) == (1, ("model", "optimizer", "rng"))
    assert draws() == expected_draws
    resumed = [hx.train_step(fresh_ddp, fresh_optimizer, hx.batch(2)),
               hx.train_step(fresh_ddp, fresh_optimizer, hx.batch(3))]
    assert resumed == losses
    state = hx.hf_state(fresh, spec, LAYOUT)
    assert [k for k in expected if not torch.equal(state[k], expected[k])] == []

    # the same checkpoint, model only (what export and scoring do): optimizer and RNG left unread
    bare, _ = hx.megatron_model(hf_dir, LAYOUT, load_weights=False, seed=12)
    load_checkpoint(tmp_path / "ckpt", bare, load_rng=False)
    bare_state = hx.hf_state(bare, spec, LAYOUT)
    assert [k for k in step1 if not torch.equal(bare_state[k], step1[k])] == []


def test_info_file_and_hf_directory(saved, hf_dir, hf_config):
    from spade.training.checkpoint_info import read_checkpoint_info

    raw = json.loads((saved / "spade_checkpoint.json").read_text())
    assert set(raw) == {"format_version", "step", "architecture", "hf_config", "layout", "contents",
                        "megatron_core"}
    assert raw["format_version"] == 1 and raw["step"] == 7 and raw["megatron_core"] == "0.16.1"
    assert raw["architecture"] == "Qwen3ForCausalLM" and raw["hf_config"] == hf_config
    assert raw["layout"] == {"tp": 1, "pp": 1, "ep": 1, "etp": 1, "sequence_parallel": False}
    assert raw["contents"] == ["model", "rng"]
    info = read_checkpoint_info(saved)
    assert info.directory == saved.absolute() and info.layout == LAYOUT and info.step == 7
    assert info.model_spec().architecture == "Qwen3ForCausalLM"
    copied = sorted(p.name for p in info.hf_dir.iterdir())
    assert "config.json" in copied and "tokenizer.json" in copied and "tokenizer_config.json" in copied
    assert not any(name.endswith(".safetensors") for name in copied)
    assert json.loads((info.hf_dir / "config.json").read_text()) == hf_config
    assert (saved / "metadata.json").is_file() and (saved / "common.pt").is_file()
    assert not list(saved.parent.glob("*.tmp-*"))


def test_model_only_load_and_logits(saved, hf_dir):
    from spade.training.checkpoint import load_checkpoint

    reference, _ = hx.megatron_model(hf_dir, LAYOUT)
    model, _ = hx.megatron_model(hf_dir, LAYOUT, load_weights=False, seed=5)
    ids = hx.batch(4)
    assert not torch.equal(hx.full_logits(model, ids), hx.full_logits(reference, ids))
    info = load_checkpoint(saved, model, load_rng=False)
    assert info.step == 7
    assert torch.equal(hx.full_logits(model, ids), hx.full_logits(reference, ids))


def test_optimizer_requested_from_a_model_only_checkpoint(saved, hf_dir, caplog):
    from spade.training.checkpoint import load_checkpoint
    from spade.training.checkpoint_info import CheckpointError

    model, _ = hx.megatron_model(hf_dir, LAYOUT, load_weights=False, seed=5)
    ddp, optimizer = hx.trainer(model)
    with pytest.raises(CheckpointError, match="no optimizer state") as raised:
        load_checkpoint(saved, [ddp], optimizer=optimizer)
    assert str(saved) in str(raised.value)
    with caplog.at_level("WARNING", logger="spade.training.checkpoint"):
        load_checkpoint(saved, [ddp], optimizer=optimizer, strict=False)
    assert "no optimizer state" in caplog.text


def test_checkpoint_of_another_architecture_is_refused(saved, tmp_path):
    """qwen3 (with q/k norms) into a llama model of the same sizes: strict names the keys."""
    from spade.training.checkpoint import load_checkpoint
    from spade.training.checkpoint_info import CheckpointError

    llama_dir = hx.save_tiny_hf("llama-untied", tmp_path / "llama")
    model, _ = hx.megatron_model(llama_dir, LAYOUT, load_weights=False)
    with pytest.raises(CheckpointError, match="q_layernorm"):
        load_checkpoint(saved, [model], load_rng=False)


def test_save_replaces_a_checkpoint_atomically_and_cleans_up_after_failure(tmp_path, hf_dir, hf_config,
                                                                         monkeypatch):
    from megatron.core import dist_checkpointing

    from spade.training.checkpoint import load_checkpoint, save_checkpoint
    from spade.training.checkpoint_info import read_checkpoint_info

    model, _ = hx.megatron_model(hf_dir, LAYOUT)
    target = tmp_path / "latest"
    save_checkpoint(target, [model], hf_config=hf_config, layout=LAYOUT, step=1)
    save_checkpoint(target, [model], hf_config=hf_config, layout=LAYOUT, step=2)  # replaces
    assert read_checkpoint_info(target).step == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]

    real_save = dist_checkpointing.save

    def save_then_fail(*args, **kwargs):
        real_save(*args, **kwargs)
        raise OSError("disk full")

    monkeypatch.setattr(dist_checkpointing, "save", save_then_fail)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(target, [model], hf_config=hf_config, layout=LAYOUT, step=3)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path / "new", [model], hf_config=hf_config, layout=LAYOUT, step=3)
    monkeypatch.undo()

    from spade.training import checkpoint

    def no_space(*args, **kwargs):
        raise OSError("no space left for hf/")

    monkeypatch.setattr(checkpoint, "_write_hf_dir", no_space)  # fails after the tensors are written
    with pytest.raises(OSError, match="no space left"):
        save_checkpoint(target, [model], hf_config=hf_config, layout=LAYOUT, step=4, tokenizer_dir=hf_dir)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]  # nothing half-written left
    assert read_checkpoint_info(target).step == 2  # the old checkpoint is untouched
    load_checkpoint(target, [model])


def test_interrupted_save_is_not_a_checkpoint(saved, tmp_path):
    """What a save killed before its last write leaves: DIR.tmp-* without the info file."""
    from spade.training.checkpoint_info import CheckpointError, read_checkpoint_info

    partial = tmp_path / "ckpt.tmp-0123456789ab"
    shutil.copytree(saved, partial)
    (partial / "spade_checkpoint.json").unlink()
    with pytest.raises(CheckpointError, match="spade_checkpoint.json is missing"):
        read_checkpoint_info(partial)
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(CheckpointError, match=r"left by interrupted saves: ckpt\.tmp-0123456789ab"):
        read_checkpoint_info(tmp_path / "ckpt")


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "spade_checkpoint.json").write_text("{not json"), "cannot read spade_checkpoint.json"),
    (lambda d: (d / "spade_checkpoint.json").write_text('{"format_version": 1}'), "missing keys"),
    (lambda d: _edit_info(d, format_version=2), "format_version 2 is not supported"),
    (lambda d: _edit_info(d, contents=["optimizer"]), "contents must list 'model'"),
    (lambda d: _edit_info(d, layout={"tp": 0, "pp": 1, "ep": 1, "etp": 1, "sequence_parallel": False}),
     "positive integers"),
    (lambda d: (d / "metadata.json").unlink(), "distributed checkpoint files are missing"),
])
def test_corrupt_checkpoints_are_reported_with_their_path(saved, tmp_path, damage, message):
    from spade.training.checkpoint_info import CheckpointError, read_checkpoint_info

    broken = tmp_path / "broken"
    shutil.copytree(saved, broken)
    damage(broken)
    with pytest.raises(CheckpointError, match=message) as raised:
        read_checkpoint_info(broken)
    assert str(broken) in str(raised.value)


def _edit_info(directory: Path, **changes) -> None:
    path = directory / "spade_checkpoint.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_missing_checkpoint_and_bad_targets(tmp_path, hf_dir, hf_config):
    from spade.training.checkpoint import load_checkpoint, save_checkpoint
    from spade.training.checkpoint_info import CheckpointError, CheckpointNotFound, read_checkpoint_info

    model, _ = hx.megatron_model(hf_dir, LAYOUT)
    with pytest.raises(CheckpointNotFound, match=str(tmp_path / "nowhere")):
        read_checkpoint_info(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nowhere", [model])
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="not a spade checkpoint"):
        save_checkpoint(tmp_path / "notes", [model], hf_config=hf_config, layout=LAYOUT)
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="does not match the running parallel state"):
        save_checkpoint(tmp_path / "x", [model], hf_config=hf_config, layout=ParallelLayout(tp=2))
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------- before the first step


@pytest.mark.parametrize("distributed_optimizer", [False, True], ids=["optimizer", "distributed-optimizer"])
def test_checkpoint_saved_before_the_first_optimizer_step_resumes(tmp_path, hf_dir, hf_config,
                                                                  distributed_optimizer):
    """An optimizer that never stepped has no state (megatron-core 0.16.1 cannot load that into an
    optimizer); the load leaves it fresh, and the next step equals the one without the round trip."""
    from spade.training.checkpoint import load_checkpoint, save_checkpoint
    from spade.training.checkpoint_info import read_checkpoint_info

    model, spec = hx.megatron_model(hf_dir, LAYOUT)
    ddp, optimizer = hx.trainer(model, distributed_optimizer=distributed_optimizer)
    save_checkpoint(tmp_path / "step0", [ddp], hf_config=hf_config, layout=LAYOUT, step=0,
                    optimizer=optimizer, tokenizer_dir=hf_dir)
    assert read_checkpoint_info(tmp_path / "step0").optimizer_state is False
    expected_draws = draws()
    losses = [hx.train_step(ddp, optimizer, hx.batch(2)), hx.train_step(ddp, optimizer, hx.batch(3))]
    expected = hx.hf_state(model, spec, LAYOUT)

    fresh, _ = hx.megatron_model(hf_dir, LAYOUT, load_weights=False, seed=13)
    fresh_ddp, fresh_optimizer = hx.trainer(fresh, distributed_optimizer=distributed_optimizer)
    torch.manual_seed(98)
    info = load_checkpoint(tmp_path / "step0", [fresh_ddp], optimizer=fresh_optimizer)
    assert (info.step, info.contents) == (0, ("model", "optimizer", "rng"))
    assert draws() == expected_draws
    resumed = [hx.train_step(fresh_ddp, fresh_optimizer, hx.batch(2)),
               hx.train_step(fresh_ddp, fresh_optimizer, hx.batch(3))]
    assert resumed == losses
    state = hx.hf_state(fresh, spec, LAYOUT)
    assert [k for k in expected if not torch.equal(state[k], expected[k])] == []

    # once it has stepped, the state is saved and loaded as before
    save_checkpoint(tmp_path / "step2", [ddp], hf_config=hf_config, layout=LAYOUT, step=2, optimizer=optimizer)
    assert read_checkpoint_info(tmp_path / "step2").optimizer_state is True


def test_a_checkpoint_from_before_optimizer_state_was_recorded_still_loads(tmp_path, hf_dir, hf_config):
    """Checkpoints written before the info file said ``optimizer_state``: the empty state is
    recognised from the saved tensors (none of the optimizer's)."""
    from spade.training.checkpoint import load_checkpoint, save_checkpoint
    from spade.training.checkpoint_info import read_checkpoint_info

    model, _ = hx.megatron_model(hf_dir, LAYOUT)
    ddp, optimizer = hx.trainer(model)
    save_checkpoint(tmp_path / "old", [ddp], hf_config=hf_config, layout=LAYOUT, step=0, optimizer=optimizer)
    info_path = tmp_path / "old" / "spade_checkpoint.json"
    raw = json.loads(info_path.read_text())
    del raw["optimizer_state"]
    info_path.write_text(json.dumps(raw))
    assert read_checkpoint_info(tmp_path / "old").optimizer_state is None
    loss = hx.train_step(ddp, optimizer, hx.batch(4))
    fresh, _ = hx.megatron_model(hf_dir, LAYOUT, load_weights=False, seed=14)
    fresh_ddp, fresh_optimizer = hx.trainer(fresh)
    load_checkpoint(tmp_path / "old", [fresh_ddp], optimizer=fresh_optimizer)
    assert hx.train_step(fresh_ddp, fresh_optimizer, hx.batch(4)) == loss


# ---------------------------------------------------------------------------- no helper processes


def test_save_starts_no_process(tmp_path, hf_dir, hf_config):
    """megatron-core's writer would start a multiprocessing Manager (a spawned server and a
    resource tracker, which outlive a killed trainer) and fork a writer per file."""
    import psutil

    from spade.training.checkpoint import load_checkpoint, save_checkpoint

    forks = []
    counting = [True]
    os.register_at_fork(before=lambda: counting[0] and forks.append(1))
    model, _ = hx.megatron_model(hf_dir, LAYOUT)
    ddp, optimizer = hx.trainer(model)
    hx.train_step(ddp, optimizer, hx.batch(1))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    forks.clear()
    try:
        save_checkpoint(tmp_path / "ckpt", [ddp], hf_config=hf_config, layout=LAYOUT, step=1, optimizer=optimizer)
    finally:
        counting[0] = False
    started = [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert (forks, started) == ([], [])
    load_checkpoint(tmp_path / "ckpt", [ddp], optimizer=optimizer)  # and what it wrote loads


def test_tensors_are_written_one_at_a_time_and_resume_as_megatrons_own_staging(tmp_path, hf_dir, hf_config,
                                                                                  monkeypatch):
    """The deferred writer (in_process_writes) holds at most one copied tensor at a time, where
    megatron-core's writer copies every view of the plan before writing; both checkpoints resume
    to the same training (bytes differ: ``torch.save`` stamps every file with its own id)."""
    import functools
    import weakref

    from spade.training import checkpoint, in_process_writes as writes

    model, _ = hx.megatron_model(hf_dir, LAYOUT)
    ddp, optimizer = hx.trainer(model, distributed_optimizer=True)  # parameters and state are views
    hx.train_step(ddp, optimizer, hx.batch(1))

    copies: list = []
    overlapping: list[int] = []
    materialize = writes.DeferredTensor.materialize

    def tracked(self):
        overlapping.append(sum(ref() is not None for ref in copies))
        out = materialize(self)
        if out.untyped_storage().data_ptr() != self.planner.resolve_data(self.item).untyped_storage().data_ptr():
            copies.append(weakref.ref(out))
        return out

    monkeypatch.setattr(writes.DeferredTensor, "materialize", tracked)
    checkpoint.save_checkpoint(tmp_path / "deferred", [ddp], hf_config=hf_config, layout=LAYOUT, step=1,
                               optimizer=optimizer, save_rng=False)
    assert copies and len(overlapping) > len(copies)  # views were copied, other tensors written as they are
    assert max(overlapping) == 0  # no copy outlives its own write

    monkeypatch.setattr(checkpoint, "in_process_writes", functools.partial(writes.in_process_writes,
                                                                           defer_tensors=False))
    checkpoint.save_checkpoint(tmp_path / "staged", [ddp], hf_config=hf_config, layout=LAYOUT, step=1,
                               optimizer=optimizer, save_rng=False)
    resumed = []
    for name in ("deferred", "staged"):  # each loads into a fresh trainer that then trains on alike
        fresh, spec = hx.megatron_model(hf_dir, LAYOUT, load_weights=False, seed=11)
        fresh_ddp, fresh_optimizer = hx.trainer(fresh, distributed_optimizer=True)
        checkpoint.load_checkpoint(tmp_path / name, [fresh_ddp], optimizer=fresh_optimizer, load_rng=False)
        loss = hx.train_step(fresh_ddp, fresh_optimizer, hx.batch(2))
        resumed.append((loss, hx.hf_state(fresh, spec, LAYOUT)))
    (loss, state), (staged_loss, staged_state) = resumed
    assert loss == staged_loss
    assert [key for key in staged_state if not torch.equal(state[key], staged_state[key])] == []


# ---------------------------------------------------------------------------- manifest


def test_manifest_lists_every_file_and_verification_names_the_damage(saved, tmp_path):
    from spade.training.checkpoint_manifest import add_to_manifest, read_manifest, verify_checkpoint

    entries = read_manifest(saved)
    on_disk = sorted(str(p.relative_to(saved)) for p in saved.rglob("*")
                     if p.is_file() and p.name != "spade_manifest.json")
    assert sorted(entries) == on_disk
    assert {"spade_checkpoint.json", "metadata.json", ".metadata", "common.pt", "hf/config.json"} <= set(entries)
    assert [entries[n]["size"] for n in on_disk] == [(saved / n).stat().st_size for n in on_disk]
    assert verify_checkpoint(saved) == []

    def damaged(damage) -> list[str]:
        copy = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        shutil.copytree(saved, copy)
        damage(copy)
        return verify_checkpoint(copy)

    distcp = sorted(n for n in entries if n.endswith(".distcp"))[0]
    assert damaged(lambda d: (d / distcp).unlink()) == [f"{tmp_path}/copy0: {distcp} is missing"]
    truncated = damaged(lambda d: os.truncate(d / distcp, 100))
    assert len(truncated) == 1 and f"{distcp} has 100 bytes" in truncated[0]

    def flip(d: Path) -> None:
        data = bytearray((d / distcp).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (d / distcp).write_bytes(bytes(data))

    changed = damaged(flip)
    assert len(changed) == 1 and "CRC-32" in changed[0] and distcp in changed[0]
    missing = damaged(lambda d: (d / "spade_manifest.json").unlink())
    assert len(missing) == 1 and "spade_manifest.json is missing" in missing[0]
    garbled = damaged(lambda d: (d / "spade_manifest.json").write_text("{"))
    assert len(garbled) == 1 and "unreadable" in garbled[0]

    extra = tmp_path / "extra"
    shutil.copytree(saved, extra)
    assert verify_checkpoint(extra, require=["trainer_state.json"]) == [
        f"{extra}: trainer_state.json is not in spade_manifest.json"]
    (extra / "trainer_state.json").write_text("{}")
    add_to_manifest(extra, ["trainer_state.json"])
    assert verify_checkpoint(extra, require=["trainer_state.json"]) == []
    assert read_manifest(extra)["trainer_state.json"]["size"] == 2
