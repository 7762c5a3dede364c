"""The ablation and baseline recipes, and the 4B later phase (issue 15).

Each loads and validates through the real config loader, runs on the engine and parallel layout
of the recipe it includes (the recipe it varies, an SGLang one), and differs from that recipe
exactly in what it claims: in general, only in keys the file itself writes; for the ablations of
the paper, in exactly the keys listed here. The later 4B phase is a set of changes ``spade train
--resume`` accepts, and a resumed run with them is the phase's recipe.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from spade.config import ConfigError
from spade.train_config import from_dict, load_train_config

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "examples" / "recipes"
VARIANTS = sorted(p.name for p in RECIPES.glob("ablation_*.yaml")) + sorted(p.name for p in RECIPES.glob("baseline_*.yaml"))

# What each of the paper's ablations changes, exactly (dotted key -> value), against the recipe it
# includes. A key written in a recipe with its parent's value (a restatement) is not a change.
CLAIMS: dict[str, dict[str, Any]] = {
    "ablation_learning_potential.yaml": {"selfplay.rewards.designer_reward": "learning_potential"},
    "ablation_no_corpus.yaml": {"selfplay.use_corpus": False},
    "ablation_no_memory.yaml": {"selfplay.use_memory": False},
    "ablation_frozen_designer.yaml": {"selfplay.train_designer": False, "selfplay.use_memory": False},
    "ablation_two_skill.yaml": {"selfplay.skills.curriculum": "two_skill"},
    "qwen3_4b_games_8gpu_phase2.yaml": {"selfplay.max_context_tokens": 49152,
                                        "selfplay.rewards.plateau_lo": 0.2, "selfplay.rewards.plateau_hi": 0.4,
                                        "selfplay.rewards.plateau_ramp": 0.2},
}
# Keys the config derives from another one (written key -> the keys it also changes).
DERIVED = {"selfplay.designer_enabled": ("selfplay.env_source",), "selfplay.env_source": ("selfplay.designer_enabled",)}


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def _own_keys(name: str) -> set[str]:
    """The dotted keys the recipe file writes itself (not through its include)."""
    own = yaml.safe_load((RECIPES / name).read_text())
    own.pop("include")
    keys = set(_flat(own))
    return keys | {derived for key in keys for derived in DERIVED.get(key, ())}


def _parent(name: str) -> str:
    return yaml.safe_load((RECIPES / name).read_text())["include"]


def _changed(name: str) -> dict[str, tuple[Any, Any]]:
    mine = _flat(load_train_config(RECIPES / name, []).to_dict())
    theirs = _flat(load_train_config(RECIPES / _parent(name), []).to_dict())
    changed = {}
    for key in set(mine) | set(theirs):
        if mine.get(key) != theirs.get(key):
            changed[_section(key, theirs)] = (theirs.get(key), mine.get(key))
    return changed


def _section(key: str, parent: dict[str, Any]) -> str:
    """``key``, or the section of the parent it falls in when the parent has that section unset
    (None): a recipe that sets a new section changes the section, defaults and all."""
    parts = key.split(".")
    for end in range(1, len(parts)):
        prefix = ".".join(parts[:end])
        if prefix in parent and parent[prefix] is None:
            return prefix
    return key


def _covers(written: set[str], key: str) -> bool:
    return any(key == w or key.startswith(w + ".") or w.startswith(key + ".") for w in written)


def test_the_variants_exist():
    assert set(CLAIMS) - {"qwen3_4b_games_8gpu_phase2.yaml"} <= set(VARIANTS)
    assert "baseline_fixed_pool.yaml" in VARIANTS


@pytest.mark.parametrize("name", VARIANTS + ["qwen3_4b_games_8gpu_phase2.yaml"])
def test_variant_runs_on_the_engine_and_layout_it_varies(name):
    config = load_train_config(RECIPES / name, [])
    parent = load_train_config(RECIPES / _parent(name), [])
    assert parent.engine.kind == "sglang", f"{name} includes {_parent(name)}, which is not a launchable SGLang recipe"
    assert config.engine == parent.engine and config.parallel == parent.parallel and config.model == parent.model
    assert from_dict(config.to_dict()) == config  # a run's config snapshot reads back the same


@pytest.mark.parametrize("name", VARIANTS + ["qwen3_4b_games_8gpu_phase2.yaml"])
def test_variant_changes_only_keys_it_writes(name):
    changed = _changed(name)
    assert changed, f"{name} changes nothing against {_parent(name)}"
    written = _own_keys(name)
    stray = sorted(key for key in changed if not _covers(written, key))
    assert not stray, f"{name} differs from {_parent(name)} in keys it does not write: {stray}"


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_variant_differs_exactly_in_what_it_claims(name):
    changed = _changed(name)
    assert set(changed) == set(CLAIMS[name]), sorted(changed)
    assert {key: new for key, (_old, new) in changed.items()} == CLAIMS[name]


def test_learning_potential_recipe_has_the_released_values():
    """Paper Eq. 4 / released learning_potential.py: gamma weighs the new value, fast 0.98 > slow 0.85."""
    rewards = load_train_config(RECIPES / "ablation_learning_potential.yaml", []).selfplay.rewards
    assert rewards.designer_reward == "learning_potential"
    assert (rewards.lp_gamma_fast, rewards.lp_gamma_slow) == (0.98, 0.85)
    text = (RECIPES / "ablation_learning_potential.yaml").read_text()
    assert "lp_gamma_fast: 0.98" in text and "lp_gamma_slow: 0.85" in text


@pytest.fixture
def without_start_checks(monkeypatch):
    """``--resume --check`` runs a start's checks (spade.run.preflight), and these recipes name the
    models and corpora of a GPU machine: the tests below are about the resolved config only."""
    monkeypatch.setattr("spade.run.preflight.preflight", lambda config: None)


def test_learning_potential_run_of_issues_15_to_19_resumes(tmp_path, capsys, without_start_checks):
    """A run whose snapshot has lp_fast_decay 0.85 / lp_slow_decay 0.98 (gamma read as a decay)
    resumes with the paper's reading of the same numbers; a new config with those keys is refused."""
    from spade.cli import main
    from spade.run.run_dir import RunDir

    data = load_train_config(RECIPES / "ablation_learning_potential.yaml", []).to_dict()
    rewards = data["selfplay"]["rewards"]
    del rewards["lp_gamma_fast"], rewards["lp_gamma_slow"], rewards["advantage_agent_samples"]
    rewards.update(lp_fast_decay=0.85, lp_slow_decay=0.98)
    run = RunDir(tmp_path / "old")
    run.create(yaml.safe_dump(data))
    assert main(["train", "--resume", str(run.root), "--check"]) == 0
    resumed = from_dict(yaml.safe_load(capsys.readouterr().out)).selfplay.rewards
    assert (resumed.designer_reward, resumed.lp_gamma_fast, resumed.lp_gamma_slow) == ("learning_potential", 0.98, 0.85)
    with pytest.raises(ConfigError, match="selfplay.rewards.lp_fast_decay: retired.*lp_gamma_fast"):
        from_dict(data)


def test_no_corpus_recipe_uses_the_papers_prompt():
    selfplay = load_train_config(RECIPES / "ablation_no_corpus.yaml", []).selfplay
    assert not selfplay.use_corpus and selfplay.no_corpus_prompt == "concepts"


def test_phase2_keys_are_what_a_resume_may_change():
    from spade.cli.train import PHASE_OVERRIDABLE, RESUME_OVERRIDABLE

    assert set(CLAIMS["qwen3_4b_games_8gpu_phase2.yaml"]) == set(PHASE_OVERRIDABLE)
    assert set(RESUME_OVERRIDABLE) == {"run.steps", *PHASE_OVERRIDABLE}


def test_resume_with_the_phase2_overrides_is_the_phase2_recipe(tmp_path, capsys, without_start_checks):
    """``spade train --resume RUN`` of a first-phase run with the keys of the phase-2 recipe as
    overrides resolves to the phase-2 recipe's config; other keys are still refused."""
    from spade.cli import main
    from spade.run.run_dir import RunDir

    run = RunDir(tmp_path / "run")
    run.create(load_train_config(RECIPES / "qwen3_4b_games_8gpu.yaml", []).to_yaml())
    overrides = [f"{key}={value}" for key, value in CLAIMS["qwen3_4b_games_8gpu_phase2.yaml"].items()]
    assert main(["train", "--resume", str(run.root), "--check", *overrides]) == 0
    resumed = from_dict(yaml.safe_load(capsys.readouterr().out))
    assert resumed == load_train_config(RECIPES / "qwen3_4b_games_8gpu_phase2.yaml", [])
    assert main(["train", "--resume", str(run.root), "--check", *overrides, "selfplay.rewards.regret_scale=0.2"]) == 2
    err = capsys.readouterr().err
    assert "cannot override selfplay.rewards.regret_scale when resuming" in err
    assert "selfplay.max_context_tokens" in err and "selfplay.rewards.plateau_ramp" in err


def test_phase2_header_says_how_to_resume():
    text = (RECIPES / "qwen3_4b_games_8gpu_phase2.yaml").read_text()
    header = " ".join(line.lstrip("# ").rstrip("\\ ") for line in text.splitlines() if line.startswith("#"))
    assert "spade train --resume" in header
    for key, value in CLAIMS["qwen3_4b_games_8gpu_phase2.yaml"].items():
        assert f"{key}={value}" in header, key


def test_recipe_comments_name_files_that_exist():
    """A comment that names a recipe or launch file names one that is there (no stale pointers)."""
    for path in sorted(RECIPES.glob("*.yaml")):
        comments = " ".join(line.split("#", 1)[1] for line in path.read_text().splitlines() if "#" in line)
        for name in re.findall(r"[\w./*-]+\.(?:yaml|sh)\b", comments):
            if name == "config.yaml" or "*" in name:  # a run directory's config snapshot; a pattern
                continue
            where = ROOT / name if "/" in name else RECIPES / name
            assert where.is_file(), f"{path.name} names {name}, which does not exist"


def test_resume_reads_the_config_snapshot_of_an_older_run(tmp_path, capsys, without_start_checks):
    """A run started before issue 15 wrote the per-environment reward's old names (lp_*, and
    learning_potential for it): its resume reads them as window_progress and wp_*."""
    from spade.cli import main
    from spade.run.run_dir import RunDir

    data = load_train_config(RECIPES / "qwen3_4b_games_8gpu.yaml", []).to_dict()
    rewards = data["selfplay"]["rewards"]
    for key in ("lp_gamma_fast", "lp_gamma_slow", "wp_fast_alpha", "wp_slow_alpha", "wp_scale", "sv_target", "sv_sigma"):
        del rewards[key]
    rewards.update(designer_reward="learning_potential", lp_fast_alpha=0.6, lp_slow_alpha=0.2, lp_scale=0.5)
    run = RunDir(tmp_path / "old")
    run.create(yaml.safe_dump(data))
    assert main(["train", "--resume", str(run.root), "--check"]) == 0
    resumed = from_dict(yaml.safe_load(capsys.readouterr().out)).selfplay.rewards
    assert resumed.designer_reward == "window_progress"
    assert (resumed.wp_fast_alpha, resumed.wp_slow_alpha, resumed.wp_scale) == (0.6, 0.2, 0.5)
