"""``run.best_metric`` / ``run.best_mode`` (issue 25): the checkpoint whose in-loop evaluation scored
best is marked best in ``checkpoints/best`` and survives ``run.keep_checkpoints``; the file is the
comparison's whole state, so a resumed run continues it. The checkpoint directories are stand-ins
(recording, marking and pruning read only names, ``latest`` and ``best``); the trainer's own call
site is exercised end to end by tests/run/test_train_loop.py::test_in_loop_evaluation_logs_held_out_scores."""

from __future__ import annotations

import json

import pytest

from spade.config import ConfigError
from spade.run.best_checkpoint import checkpoint_score, suite_mean
from spade.run.run_dir import RunDir, RunDirError
from spade.train_config import from_dict


def save(run: RunDir, step: int) -> None:
    """What the trainer's save leaves for pruning: the step's directory, then ``latest``."""
    run.checkpoint_dir(step).mkdir(parents=True, exist_ok=True)  # a redone step replaces its save
    (run.checkpoint_dir(step) / "trainer_state.json").write_text("{}")
    (run.checkpoints_dir / "latest").write_text(f"step_{step}")


def train(run: RunDir, scores: dict[int, float], *, keep: int, metric: str = "eval/mean", mode: str = "max") -> None:
    """The trainer's order at each checkpoint: save, record the evaluated score, prune."""
    for step, score in scores.items():
        save(run, step)
        run.record_score(step, score, metric=metric, mode=mode)
        run.prune_checkpoints(keep)


def remaining(run: RunDir) -> list[int]:
    return sorted(run.checkpoint_steps())


def test_the_best_scored_checkpoint_outlives_keep_checkpoints(tmp_path):
    run = RunDir(tmp_path / "run")
    train(run, {1: 0.2, 2: 0.5, 3: 0.3}, keep=1)
    assert remaining(run) == [2, 3]  # step 1 went when step 2 scored higher; step 3 is the newest
    assert run.best_steps() == {2}
    saved = json.loads((run.checkpoints_dir / "best").read_text())
    assert saved == {"steps": [], "metric": "eval/mean", "mode": "max", "scores": {"1": 0.2, "2": 0.5, "3": 0.3}}


def test_a_resumed_run_continues_the_comparison(tmp_path):
    train(RunDir(tmp_path / "run"), {1: 0.2, 2: 0.5, 3: 0.3}, keep=1)
    resumed = RunDir(tmp_path / "run")  # a new process: the state is the file
    resumed.forget_scores_after(3)
    train(resumed, {4: 0.4}, keep=1)
    assert remaining(resumed) == [2, 4] and resumed.best_steps() == {2}  # 0.4 does not beat 0.5
    train(resumed, {5: 0.6}, keep=1)
    assert remaining(resumed) == [5] and resumed.best_steps() == {5}


def test_resuming_before_a_step_forgets_its_score(tmp_path):
    """A resume from step_2 (a newer checkpoint was damaged) redoes step 3: the best so far is again
    the best up to step 2, not the score of weights the run no longer has."""
    run = RunDir(tmp_path / "run")
    train(run, {1: 0.2, 2: 0.5, 3: 0.9}, keep=0)
    assert run.best_steps() == {3}
    run.forget_scores_after(2)
    assert run.best_steps() == {2} and run.read_best().scores == {1: 0.2, 2: 0.5}
    train(run, {3: 0.4}, keep=0)
    assert run.best_steps() == {2}


def test_min_mode_ties_and_non_finite_scores(tmp_path):
    run = RunDir(tmp_path / "run")
    train(run, {1: 0.5, 2: 0.3, 3: 0.3, 4: 0.7}, keep=1, mode="min")
    assert run.best_steps() == {2} and remaining(run) == [2, 4]  # the earliest of equals
    save(run, 5)
    assert run.record_score(5, float("nan"), metric="eval/mean", mode="min") is False
    assert 5 not in run.read_best().scores


def test_another_metric_starts_the_comparison_over_and_hand_marks_stay(tmp_path):
    run = RunDir(tmp_path / "run")
    train(run, {1: 0.9}, keep=0)
    run.mark_best(1)  # by hand: kept whatever the scores say
    train(run, {2: 0.1}, keep=0, metric="eval/aime25")
    record = run.read_best()
    assert record.scores == {2: 0.1} and record.metric == "eval/aime25"
    assert run.best_steps() == {1, 2}


def test_the_older_list_form_reads_and_a_damaged_file_is_named(tmp_path):
    run = RunDir(tmp_path / "run")
    save(run, 1)
    (run.checkpoints_dir / "best").write_text("[1]\n")
    assert run.best_steps() == {1}
    assert run.record_score(1, 0.5, metric="eval/mean", mode="max") is True
    assert run.best_steps() == {1} and run.read_best().steps == {1}
    (run.checkpoints_dir / "best").write_text('{"scores": {"1": "high"}}')
    with pytest.raises(RunDirError, match="checkpoints/best: not a record"):
        run.best_steps()
    with pytest.raises(RunDirError, match="step_7 to score"):
        run.record_score(7, 0.5, metric="eval/mean", mode="max")


def test_the_score_of_an_evaluation():
    evaluated = {"eval/aime25": 0.25, "eval/gpqa_diamond": 0.75, "eval/skipped/aime26": 1.0, "eval/step": 4.0,
                 "time/eval_s": 3.0}
    assert suite_mean(evaluated) == {"eval/mean": 0.5}  # skipped benchmarks and eval/step are no scores
    assert suite_mean({"eval/skipped/aime26": 1.0, "eval/step": 4.0}) == {}
    scored = {**evaluated, **suite_mean(evaluated)}
    assert checkpoint_score(scored, "eval/mean") == 0.5 and checkpoint_score(scored, "eval/aime25") == 0.25
    assert checkpoint_score(scored, "eval/aime26") is None and checkpoint_score(scored, "none") is None


def test_settings_and_their_errors():
    run = from_dict({}).run
    assert (run.best_metric, run.best_mode) == ("eval/mean", "max")
    assert from_dict({"run": {"best_metric": "eval/aime25", "best_mode": "min"}}).run.best_metric == "eval/aime25"
    assert from_dict({"run": {"best_metric": "none"}}).run.best_metric == "none"
    with pytest.raises(ConfigError, match=r"run.best_metric: allowed: eval/mean .*eval/<benchmark> or none; got 'loss'"):
        from_dict({"run": {"best_metric": "loss"}})
    with pytest.raises(ConfigError, match=r"run.best_metric: 'eval/tau2' is not a benchmark .*allowed: eval/mean, "
                                          r"eval/aime25, .*, none"):
        from_dict({"run": {"best_metric": "eval/tau2"}})  # the default suite is the games one
    assert from_dict({"run": {"best_metric": "eval/tau2"}, "eval": {"suite": "tool"}}).run.best_metric == "eval/tau2"
    with pytest.raises(ConfigError, match="run.best_mode: 'up' is not allowed; choose one of: max, min"):
        from_dict({"run": {"best_mode": "up"}})
