"""The training config tree: example configs, includes, overrides, errors naming the key, and the
``spade train`` command's refusals (resume overrides, existing run directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spade.cli import main
from spade.config import ConfigError
from spade.train_config import (
    TrainConfig,
    apply_overrides,
    from_dict,
    load_train_config,
    parse_override,
    read_config_file,
)
from spade.run.progress import Progress
from spade.run.run_dir import RunDir

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_CONFIGS = [ROOT / "examples" / "smoke_cpu.yaml", *sorted((ROOT / "examples" / "recipes").glob("*.yaml"))]


@pytest.mark.parametrize("path", EXAMPLE_CONFIGS, ids=lambda p: p.name)
def test_every_example_config_loads(path):
    config = load_train_config(path)
    assert isinstance(config, TrainConfig)
    # the snapshot round-trips to the same config
    assert from_dict(read_config_file_text(config.to_yaml())) == config


def read_config_file_text(text: str) -> dict:
    import yaml

    return yaml.safe_load(text)


def test_recipes_hold_the_spec_numbers():
    base = load_train_config(ROOT / "examples" / "recipes" / "games_base.yaml")
    sp = base.selfplay
    assert (sp.k, sp.envs_per_set, sp.g_hint, sp.max_attempts) == (4, 24, 16, 5)
    roles = sp.sampling
    assert (roles.designer.temperature, roles.agent.temperature, roles.hint.temperature) == (0.6, 0.6, 0.3)
    assert {(r.top_p, r.top_k) for r in (roles.designer, roles.agent, roles.hint, roles.screen)} == {(0.95, 20)}
    assert (roles.designer.max_tokens, roles.agent.max_tokens, roles.hint.max_tokens) == (16384, 8192, 4096)
    assert (sp.max_turns, sp.max_context_tokens, sp.memory_capacity) == (25, 32768, 200)
    assert base.optimizer.lr == 1e-6 and base.optimizer.betas == (0.9, 0.98) and base.optimizer.weight_decay == 0.1
    assert (base.loss.eps_low, base.loss.eps_high, base.loss.tis_cap, base.loss.kl_coef) == (0.2, 0.28, 2.0, 0.0)
    assert (base.run.steps, base.run.checkpoint_every) == (400, 16)
    assert base.corpus.max_words == 6000

    recipes = ROOT / "examples" / "recipes"
    b8 = load_train_config(recipes / "qwen3_8b_games.yaml")
    assert b8.loss.kl_coef == 0.005 and b8.selfplay.sampling.designer.max_tokens == 20000
    moe = load_train_config(recipes / "qwen3_30b_a3b_games.yaml")
    assert (moe.parallel.tp, moe.parallel.ep) == (4, 8)
    fixed = load_train_config(recipes / "baseline_fixed_pool.yaml")
    assert not fixed.selfplay.designer_enabled and Path(fixed.selfplay.fixed_env_dir).name == "gpt55_games"  # never the examples
    assert not load_train_config(recipes / "ablation_no_corpus.yaml").selfplay.use_corpus
    assert not load_train_config(recipes / "ablation_no_memory.yaml").selfplay.use_memory
    assert not load_train_config(recipes / "ablation_frozen_designer.yaml").selfplay.train_designer
    assert load_train_config(recipes / "ablation_two_skill.yaml").selfplay.skills.curriculum == "two_skill"
    lp = load_train_config(recipes / "ablation_learning_potential.yaml")
    assert lp.selfplay.rewards.designer_reward == "learning_potential"
    # each ablation is the 30B-A3B recipe with its switch, nothing else
    assert lp.parallel == moe.parallel and lp.optimizer == moe.optimizer


def test_smoke_config_is_small():
    smoke = load_train_config(ROOT / "examples" / "smoke_cpu.yaml")
    sp = smoke.selfplay
    assert smoke.model.hf_dir == "embedded"
    assert smoke.run.steps <= 5 and sp.envs_per_set <= 16 and sp.max_turns <= 6
    assert smoke.run.steps > sp.k  # a designer sample is released (at step k) within the run
    assert Path(smoke.corpus.paths[0]).is_file()
    # the rest of the smoke run's settings: tests/test_smoke_config.py


def test_overrides_parse_yaml_scalars():
    assert parse_override("run.steps=7") == (["run", "steps"], 7)
    assert parse_override("selfplay.top_k=null") == (["selfplay", "top_k"], None)
    assert parse_override("optimizer.betas=[0.9, 0.95]") == (["optimizer", "betas"], [0.9, 0.95])
    config = load_train_config(ROOT / "examples" / "smoke_cpu.yaml",
                               ["run.steps=7", "selfplay.use_memory=false", "optimizer.lr=2e-6",
                                "parallel.tp=1", "selfplay.rewards.regret_scale=0.3"])
    assert config.run.steps == 7 and not config.selfplay.use_memory
    assert config.optimizer.lr == 2e-6 and config.selfplay.rewards.regret_scale == 0.3


@pytest.mark.parametrize("override, key", [
    ("selfplay.not_a_knob=1", "selfplay.not_a_knob"),
    ("selfplay.rewards.nope=1", "selfplay.rewards.nope"),
    ("run.steps=many", "run.steps"),
    ("optimizer.lr=-1", "optimizer.lr"),
    ("model.dtype=float64", "model.dtype"),
    ("nosection.x=1", "nosection"),
    ("selfplay.k=0", "selfplay.k"),
    ("parallel.sequence_parallel=true", "parallel.sequence_parallel"),
])
def test_bad_values_name_the_full_key(override, key):
    with pytest.raises(ConfigError, match=rf"^{key}\b"):
        load_train_config(ROOT / "examples" / "smoke_cpu.yaml", [override])


def test_include_merges_underneath(tmp_path):
    (tmp_path / "base.yaml").write_text("run: {steps: 5, seed: 3}\nselfplay: {k: 2, envs_per_set: 3}\n")
    (tmp_path / "top.yaml").write_text("include: base.yaml\nrun: {steps: 9}\n")
    data = read_config_file(tmp_path / "top.yaml")
    assert data == {"run": {"steps": 9, "seed": 3}, "selfplay": {"k": 2, "envs_per_set": 3}}
    (tmp_path / "loop.yaml").write_text("include: loop.yaml\n")
    with pytest.raises(ConfigError, match="nested deeper"):
        read_config_file(tmp_path / "loop.yaml")
    assert apply_overrides({"a": {"b": 1}}, ["a.c=2"]) == {"a": {"b": 1, "c": 2}}


def test_resume_refuses_overrides_other_than_steps(tmp_path, capsys):
    run = RunDir(tmp_path / "run")
    run.create(load_train_config(ROOT / "examples" / "smoke_cpu.yaml").to_yaml())
    assert main(["train", "--resume", str(run.root), "selfplay.k=3"]) == 2
    err = capsys.readouterr().err
    assert "cannot override selfplay.k when resuming" in err and "run.steps" in err
    assert main(["train", "--resume", str(run.root), "--check", "run.steps=9"]) == 0
    assert "steps: 9" in capsys.readouterr().out
    assert main(["train", "--resume", str(tmp_path / "nowhere")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_new_run_refuses_an_existing_run_directory(tmp_path, capsys):
    run = RunDir(tmp_path / "run")
    run.create("run: {steps: 1}\n")
    assert main(["train", "--config", str(ROOT / "examples" / "smoke_cpu.yaml"), "--run-dir", str(run.root)]) == 2
    assert "--resume" in capsys.readouterr().err


def test_check_validates_without_training(capsys):
    assert main(["train", "--config", str(ROOT / "examples" / "smoke_cpu.yaml"), "--check"]) == 0
    smoke = load_train_config(ROOT / "examples" / "smoke_cpu.yaml")
    assert f"envs_per_set: {smoke.selfplay.envs_per_set}" in capsys.readouterr().out
    assert main(["train", "--config", str(ROOT / "examples" / "smoke_cpu.yaml"), "--check", "selfplay.bad=1"]) == 2
    assert "selfplay.bad" in capsys.readouterr().err


def test_metrics_truncation_keeps_one_line_per_step(tmp_path):
    run = RunDir(tmp_path)
    for step in (0, 1, 2, 1):
        run.append_metrics({"step": step, "x": float(step)})
    with open(run.metrics_path, "a") as handle:
        handle.write('{"step": 3, "torn')
    assert run.truncate_metrics(2) == 3
    assert [r["step"] for r in run.read_metrics()] == [0, 1]
    run.append_metrics({"step": 2, "nan": float("nan")})
    assert run.read_metrics()[-1] == {"step": 2, "nan": None}


def test_progress_plain_lines_and_tty_redraw():
    import io

    plain = io.StringIO()
    progress = Progress(3, stream=plain, tty=False)
    progress.start_step(0)
    progress.phase("playing")
    progress.phase("training")
    progress.end_step(0, {"env/admitted": 2.0, "time/step_s": 1.5, "train/loss": 0.1})
    lines = plain.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in plain.getvalue()
    assert "step 0 (1/3) |" in lines[-1] and "envs 2 admitted" in lines[-1] and "loss 0.1" in lines[-1]

    tty = io.StringIO()
    progress = Progress(3, stream=tty, tty=True)
    progress.start_step(1)
    progress.phase("playing")
    progress.update(admitted=2, episodes=8, tokens_per_s=123.0)
    progress.end_step(1, {"env/admitted": 2.0, "agent/episodes": 8.0, "agent/return_mean": 0.5})
    progress.close()
    text = tty.getvalue()
    assert text.count("\r") >= 2 and "envs 2 admitted" in text and "123 tok/s" in text
    assert "step 1 (2/3) | envs 2 admitted, 0 rejected | 8 plays: return 0.5\n" in text  # the step's line stays
