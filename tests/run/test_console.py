"""What spade train prints: the known-noise filter, its --show-warnings switch, step lines, summary."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import pytest

from spade.run import console
from spade.run.console import KNOWN_WARNINGS, quiet_known_noise, rejection_reasons, run_summary, step_line

MEGATRON_NOTES = [
    "Transformer Engine and Apex are not installed. Falling back to Torch optimizers.",
    "Transformer Engine and Apex are not installed. Falling back to local implementations of "
    "multi_tensor_applier and multi_tensor_scale",
    "Apex is not installed. Falling back to Torch Norm",
    "full scope is deprecated. Use empty cuda_graph_scope to capture the whole layer.",
]


@pytest.fixture
def clean_process(monkeypatch):
    """Undo what quiet_known_noise changes: warning filters, logger filters, environment."""
    for name in (console.SHOW_WARNINGS_VARIABLE, *console._PROGRESS_BAR_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(console, "disable_progress_bars", lambda: None)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        yield
    for name in console._KNOWN_LOGGERS:
        logging.getLogger(name).removeFilter(console._FILTER)


def emit_all() -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        for text in MEGATRON_NOTES:
            warnings.warn(text, UserWarning)
        warnings.warn("Please use DTensor instead and we are deprecating ShardedTensor.", FutureWarning)
        warnings.warn("something new went wrong", UserWarning)
        warnings.warn("Apex is not installed. Falling back to Torch Norm", DeprecationWarning)  # other category
    return [str(w.message) for w in caught]


def test_known_megatron_warnings_are_hidden_and_others_still_show(clean_process):
    assert all(any(__import__("re").match(p, t) for _, p, _ in KNOWN_WARNINGS) for t in MEGATRON_NOTES)
    assert quiet_known_noise() is True
    shown = emit_all()
    assert shown == ["something new went wrong", "Apex is not installed. Falling back to Torch Norm"]


def test_show_warnings_flag_and_variable_keep_everything(clean_process, monkeypatch):
    assert quiet_known_noise(show=True) is False
    assert len(emit_all()) == len(MEGATRON_NOTES) + 3
    assert console.os.environ[console.SHOW_WARNINGS_VARIABLE] == "1"  # lower layers see the choice
    monkeypatch.setenv(console.SHOW_WARNINGS_VARIABLE, "1")
    assert quiet_known_noise(show=False) is False


def test_known_notes_logged_by_megatron_are_dropped(clean_process, caplog):
    quiet_known_noise()
    logger = logging.getLogger("megatron.core")
    with caplog.at_level(logging.WARNING, logger="megatron.core"):
        logger.warning("Apex is not installed. Falling back to Torch Norm")
        logger.warning("a real problem")
    assert [r.getMessage() for r in caplog.records] == ["a real problem"]


def test_train_parser_has_the_show_warnings_flag():
    import argparse

    from spade.cli import train

    parser = argparse.ArgumentParser()
    train.add_parser(parser.add_subparsers())
    args = parser.parse_args(["train", "--config", "x.yaml", "--show-warnings", "run.steps=2"])
    assert args.show_warnings is True and args.overrides == ["run.steps=2"]
    assert parser.parse_args(["train", "--config", "x.yaml"]).show_warnings is False


REGEN = {"designer/attempts": 8.0, "env/admitted": 3.0, "env/rejected": 5.0, "env/rejected_runtime_error": 3.0,
         "env/rejected_syntax_error": 2.0, "agent/episodes": 12.0, "agent/return_mean": 0.3125,
         "agent/hint_episodes": 12.0, "agent/hint_return_mean": 0.45, "train/loss": 0.0123, "train/grad_norm": 0.84,
         "train/samples": 12.0, "designer/released": 0.0, "designer/pending": 3.0, "time/step_s": 95.2,
         "train/skipped_no_samples": 0.0}


def test_step_line_names_what_happened():
    line = step_line(0, 3, REGEN)
    assert line.startswith("step 0 (1/3)")
    for part in ("3 admitted, 5 rejected (runtime_error 3, syntax_error 2)", "12 plays: return 0.312",
                 "with hint 0.45", "trained 12 samples: loss 0.0123, grad norm 0.84", "3 waiting", "95 s"):
        assert part in line, (part, line)
    later = step_line(2, 3, {"agent/episodes": 6.0, "agent/return_mean": 0.0, "train/loss": -0.5,
                             "train/grad_norm": 2.0, "train/samples": 8.0, "designer/samples": 2.0,
                             "designer/released": 2.0, "designer/reward_mean": 0.41, "time/step_s": 3.0})
    assert "admitted" not in later and "with hint" not in later
    assert "8 samples (2 designer)" in later and "designer: 2 released, reward 0.41" in later
    empty = step_line(1, 3, {"designer/attempts": 4.0, "env/admitted": 0.0, "env/rejected": 4.0,
                             "env/rejected_timeout": 4.0, "agent/episodes": 0.0, "train/skipped_no_samples": 1.0,
                             "train/loss": None})
    assert "0 admitted, 4 rejected (timeout 4)" in empty and "no plays" in empty and "nothing to train on" in empty
    assert rejection_reasons(REGEN, top=1) == [("runtime_error", 3)]


def test_run_summary_reads_the_run_directory(tmp_path: Path):
    from spade.designer.memory import Memory, MemoryRecord, memory_path

    rows = [{"step": 0, **REGEN}, {"step": 1, "agent/episodes": 12.0, "train/loss": 0.2, "train/grad_norm": 1.5,
                                    "train/samples": 14.0, "designer/samples": 2.0, "designer/released": 2.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with Memory(memory_path(tmp_path)) as memory:
        memory.add_many([MemoryRecord(env_id="a", skill="S", step=0, win_rate=0.5, regret=0.1, source="x"),
                         MemoryRecord(env_id="seed-b", skill="S", step=0, win_rate=0.5, regret=0.1, source="y",
                                      metadata={"seed": True})])
    text = run_summary(tmp_path, wall_s=300.0)
    for part in ("2 steps in 5.0 min", "8 attempts, 3 environments admitted (38% of attempts)",
                 "2 GRPO updates on 26 samples (2 designer)", "grad norm 1.5", "2 environments rewarded",
                 "1 records (+1 seed examples)", f"tensorboard --logdir {tmp_path / 'tensorboard'}",
                 f"spade memory list {tmp_path}", f"spade train --resume {tmp_path} run.steps=4"):
        assert part in text, (part, text)
    assert "trained    nothing" in run_summary(tmp_path / "empty")
