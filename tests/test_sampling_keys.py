"""The ``selfplay.sampling`` section (one record per role) and the flat keys it replaced.

A config written before the section (``selfplay.agent_max_tokens``, ``top_p`` shared by every role,
``hint_sampling: released``, ...), whether a file, an override or a run's config snapshot, still
loads to the same values, with one warning per old key naming its new place. And every recipe under
``examples/`` samples each role as it did with the flat keys (the table below: the values the old
keys gave)."""

from __future__ import annotations

import dataclasses

import logging
from pathlib import Path

import pytest
import yaml

from spade.config import ConfigError, from_mapping
from spade.selfplay.sampling_settings import MOVED_SAMPLING_KEYS, ROLES
from spade.selfplay.settings import SamplingSettings, SelfPlaySettings
from spade.train_config import apply_overrides, from_dict, load_train_config, read_config_file

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

# A selfplay section as spade wrote it before the sampling records, and the same in the new layout.
FLAT = """
selfplay:
  k: 2
  designer_temperature: 0.7
  agent_temperature: 1.0
  hint_temperature: 0.2
  top_p: 0.8
  top_k: null
  designer_max_tokens: 560
  agent_max_tokens: 96
  hint_max_tokens: 48
  screen_max_tokens: 300
  designer_timeout_s: 900.0
  hint_timeout_s: 300.0
  designer_thinking: "off"
  hint_thinking: "on"
  screen_thinking: "off"
  hint_arm_thinking: "off"
  hint_sampling: released
"""
NESTED = """
selfplay:
  k: 2
  sampling:
    designer: {temperature: 0.7, top_p: 0.8, top_k: null, max_tokens: 560, timeout_s: 900.0, thinking: "off"}
    agent: {temperature: 1.0, top_p: 0.8, top_k: null, max_tokens: 96, hinted_thinking: "off"}
    hint: {temperature: 0.2, top_p: 0.9, top_k: null, max_tokens: 48, timeout_s: 300.0, thinking: "on"}
    screen: {temperature: 0.2, top_p: 0.8, top_k: null, max_tokens: 300, timeout_s: 300.0, thinking: "off"}
"""


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_config_with_the_flat_keys_loads_as_the_new_layout(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="spade.config"):
        old = load_train_config(_write(tmp_path / "old.yaml", FLAT))
    assert old == load_train_config(_write(tmp_path / "new.yaml", NESTED))
    lines = caplog.messages
    assert len(lines) == len(MOVED_SAMPLING_KEYS)  # one line for each old key
    assert "selfplay.agent_max_tokens is now selfplay.sampling.agent.max_tokens" in lines
    assert "selfplay.hint_arm_thinking is now selfplay.sampling.agent.hinted_thinking" in lines
    assert ("selfplay.hint_temperature is now selfplay.sampling.hint.temperature, "
            "selfplay.sampling.screen.temperature") in lines
    assert ("selfplay.hint_sampling: released is now selfplay.sampling.hint.top_p: 0.9, "
            "selfplay.sampling.hint.top_k: null") in lines


def test_hint_sampling_shared_sets_nothing_and_other_values_are_refused():
    shared = from_mapping(SelfPlaySettings, {"top_p": 0.8, "hint_sampling": "shared"}, where="selfplay")
    assert {shared.sampling(role).top_p for role in ROLES} == {0.8}
    with pytest.raises(ConfigError, match=r"selfplay\.hint_sampling: 'paper' is not allowed; choose one of: "
                                          r"shared, released"):
        from_mapping(SelfPlaySettings, {"hint_sampling": "paper"}, where="selfplay")


def test_a_setting_given_both_ways_is_an_error_naming_both():
    with pytest.raises(ConfigError, match=r"selfplay\.agent_max_tokens and selfplay\.sampling\.agent\.max_tokens "
                                          r"are the same setting"):
        from_dict({"selfplay": {"agent_max_tokens": 64, "sampling": {"agent": {"max_tokens": 32}}}})
    with pytest.raises(ConfigError, match=r"selfplay\.top_k and selfplay\.sampling\.screen\.top_k"):
        from_dict({"selfplay": {"top_k": 5, "sampling": {"screen": {"top_k": 7}}}})


def test_an_old_key_in_an_override_or_a_later_file_wins_over_the_new_key_beneath_it(tmp_path):
    """Each file and each override is upgraded on its own before they are merged: an old key given
    over a recipe that writes the new key overrides it, as it did before."""
    smoke = EXAMPLES / "smoke_cpu.yaml"
    assert read_config_file(smoke)["selfplay"]["sampling"]["agent"]["max_tokens"] == 96
    config = load_train_config(smoke, ["selfplay.agent_max_tokens=64", "selfplay.hint_sampling=released"])
    assert config == load_train_config(smoke, ["selfplay.sampling.agent.max_tokens=64",
                                               "selfplay.sampling.hint.top_p=0.9", "selfplay.sampling.hint.top_k=null"])
    assert config.selfplay.sampling.agent.max_tokens == 64
    child = _write(tmp_path / "child.yaml", f"include: {smoke}\nselfplay: {{designer_max_tokens: 700}}\n")
    assert load_train_config(child).selfplay.sampling.designer.max_tokens == 700
    # an override of the new key keeps its plain meaning
    assert apply_overrides({}, ["selfplay.sampling.agent.max_tokens=5"]) == \
        {"selfplay": {"sampling": {"agent": {"max_tokens": 5}}}}


def _old_snapshot(config) -> dict:
    """``config``'s run snapshot as spade wrote it before the sampling records: every flat key."""
    data = config.to_dict()
    roles = data["selfplay"].pop("sampling")
    hint_released = (roles["hint"]["top_p"], roles["hint"]["top_k"]) == (0.9, None)
    data["selfplay"].update(
        designer_temperature=roles["designer"]["temperature"], agent_temperature=roles["agent"]["temperature"],
        hint_temperature=roles["hint"]["temperature"], top_p=roles["agent"]["top_p"], top_k=roles["agent"]["top_k"],
        designer_max_tokens=roles["designer"]["max_tokens"], agent_max_tokens=roles["agent"]["max_tokens"],
        hint_max_tokens=roles["hint"]["max_tokens"], screen_max_tokens=roles["screen"]["max_tokens"],
        designer_timeout_s=roles["designer"]["timeout_s"], hint_timeout_s=roles["hint"]["timeout_s"],
        designer_thinking=roles["designer"]["thinking"], hint_thinking=roles["hint"]["thinking"],
        screen_thinking=roles["screen"]["thinking"], hint_arm_thinking=roles["agent"]["hinted_thinking"],
        hint_sampling="released" if hint_released else "shared")
    return data


@pytest.mark.parametrize("recipe", ["recipes/paper/games_8b.yaml", "smoke_cpu.yaml"])
def test_a_run_whose_snapshot_has_the_flat_keys_resumes(tmp_path, capsys, monkeypatch, recipe):
    from spade.cli import main
    from spade.run.run_dir import RunDir

    monkeypatch.setattr("spade.run.preflight.preflight", lambda config: None)  # a GPU recipe's model paths
    config = load_train_config(EXAMPLES / recipe)
    run = RunDir(tmp_path / "old")
    run.create(yaml.safe_dump(_old_snapshot(config), sort_keys=False))
    assert "agent_max_tokens" in run.config_path.read_text()
    assert main(["train", "--resume", str(run.root), "--check"]) == 0
    # the flat keys had no top-p / top-k of the screen's own: such a run's screen sampled at the shared ones
    sp = config.selfplay
    screen = dataclasses.replace(sp.sampling.screen, top_p=sp.sampling.agent.top_p, top_k=sp.sampling.agent.top_k)
    expected = dataclasses.replace(config, selfplay=dataclasses.replace(
        sp, sampling=dataclasses.replace(sp.sampling, screen=screen)))
    assert from_dict(yaml.safe_load(capsys.readouterr().out)) == expected


# --------------------------------------------------------------------------- every recipe, as before

# (temperature, top_p, top_k, max_tokens, timeout_s) of each role, and the thinking switches of the
# designer, hint, screen and the hinted arm: the values the flat keys gave each recipe
DEFAULT = {"designer": (0.6, 0.95, 20, 16384, 300.0), "agent": (0.6, 0.95, 20, 8192, None),
           "hint": (0.3, 0.95, 20, 4096, 120.0), "screen": (0.3, 0.95, 20, 16384, 120.0), "thinking": ("auto",) * 4}
# the released validator call passes no top-p / top-k either: the paper recipes' screen took 0.9 and
# no top-k after the move (it had kept spade's 0.95 / 20 until then)
RELEASED_SCREEN = {"screen": (0.3, 0.9, None, 16384, 120.0)}
RELEASED_HINT = {"hint": (0.3, 0.9, None, 4096, 120.0), **RELEASED_SCREEN}  # hint_sampling: released
DESIGNER_8B = {"designer": (0.6, 0.95, 20, 20000, 300.0)}
OWN_8B = {**DESIGNER_8B, "thinking": ("auto", "off", "off", "auto")}
PAPER_8B = {**DESIGNER_8B, **RELEASED_HINT, "thinking": ("off",) * 4}
RLVE_AGENT = {"agent": (1.0, 0.95, 20, 8192, None)}
SMOKE = {"designer": (0.6, 0.95, 20, 560, 900.0), "agent": (0.6, 0.95, 20, 96, None),
         "hint": (0.3, 0.95, 20, 48, 300.0), "screen": (0.3, 0.95, 20, 16384, 300.0)}
OWN_TOOL_HINT = {"hint": (0.3, 0.95, 20, 2048, 120.0)}
PAPER_TOOL_HINT = {"hint": (0.3, 0.9, None, 2048, 120.0), **RELEASED_SCREEN}
BEFORE = {
    "learn/fixed.yaml": {"agent": (0.6, 0.95, 20, 48, None)},
    "learn/selfplay.yaml": SMOKE,
    "smoke_cpu.yaml": SMOKE,
    **{f"recipes/{name}.yaml": {} for name in (
        "ablation_fixed_designer", "ablation_frozen_designer", "ablation_learning_potential", "ablation_no_corpus",
        "ablation_no_memory", "ablation_two_skill", "baseline_fixed_pool", "games_base", "qwen3_30b_a3b_games",
        "qwen3_30b_a3b_games_8gpu", "qwen3_30b_a3b_games_8gpu_partial", "qwen3_30b_a3b_games_async",
        "qwen3_30b_a3b_games_multinode", "qwen3_4b_games", "qwen3_4b_games_8gpu", "qwen3_4b_games_8gpu_phase2",
        "qwen3_4b_games_multinode")},
    "recipes/baseline_rlve_qwen3_30b_a3b_8gpu.yaml": RLVE_AGENT,
    "recipes/baseline_rlve_qwen3_4b_8gpu.yaml": RLVE_AGENT,
    "recipes/baseline_rlve_qwen3_8b_8gpu.yaml": {**OWN_8B, **RLVE_AGENT},
    "recipes/qwen3_8b_games.yaml": OWN_8B,
    "recipes/qwen3_8b_games_8gpu.yaml": OWN_8B,
    "recipes/qwen3_8b_games_multinode.yaml": OWN_8B,
    "recipes/tool_use_base.yaml": OWN_TOOL_HINT,
    "recipes/tool_use_qwen3_30b_a3b_8gpu.yaml": OWN_TOOL_HINT,
    "recipes/tool_use_qwen3_4b_8gpu.yaml": OWN_TOOL_HINT,
    "recipes/tool_use_qwen3_8b_8gpu.yaml": {**OWN_8B, **OWN_TOOL_HINT},
    **{f"recipes/paper/{name}.yaml": RELEASED_HINT for name in (
        "ablation_fixed_gpt55_30b", "ablation_learning_potential_30b", "ablation_no_corpus_30b",
        "ablation_no_ed_training_no_memory_30b", "ablation_no_memory_30b", "ablation_solve_rate_30b",
        "ablation_two_skill_30b", "baseline_fixed_gpt55_30b", "baseline_fixed_gpt55_4b", "games_30b_a3b", "games_4b",
        "games_4b_phase2", "games_base")},
    "recipes/paper/baseline_fixed_gpt55_8b.yaml": PAPER_8B,
    "recipes/paper/games_8b.yaml": PAPER_8B,
    "recipes/paper/baseline_fixed_rlve_30b.yaml": {**RELEASED_HINT, **RLVE_AGENT},
    "recipes/paper/baseline_fixed_rlve_4b.yaml": {**RELEASED_HINT, **RLVE_AGENT},
    "recipes/paper/baseline_fixed_rlve_8b.yaml": {**PAPER_8B, **RLVE_AGENT},
    "recipes/paper/tool_use_base.yaml": PAPER_TOOL_HINT,
    "recipes/paper/tool_use_30b_a3b.yaml": PAPER_TOOL_HINT,
    "recipes/paper/tool_use_4b.yaml": {"hint": (0.3, 0.9, None, 512, 120.0), **RELEASED_SCREEN},
    "recipes/paper/tool_use_8b.yaml": {**PAPER_8B, **PAPER_TOOL_HINT, "thinking": ("off", "off", "off", "auto")},
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_every_recipe_samples_each_role_as_before(name):
    roles = load_train_config(EXAMPLES / name).selfplay.sampling
    got = {role: (r.temperature, r.top_p, r.top_k, r.max_tokens, r.timeout_s) for role in ROLES for r in (roles(role),)}
    got["thinking"] = (roles.designer.thinking, roles.hint.thinking, roles.screen.thinking, roles.agent.hinted_thinking)
    assert got == {**DEFAULT, **BEFORE[name]}


def test_no_example_uses_a_flat_key(caplog):
    """Every config under examples/ is written in the new layout (loading logs no moved key)."""
    moved = {}
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="spade.config"):
            try:
                read_config_file(path)
            except ConfigError:
                continue  # not a training config
        lines = [message for message in caplog.messages if " is now " in message]
        if lines:
            moved[str(path.relative_to(EXAMPLES))] = lines
    assert not moved, moved


def test_the_defaults_are_the_dataclass_defaults():
    assert SelfPlaySettings().sampling == SamplingSettings()
    assert set(MOVED_SAMPLING_KEYS) == {
        "designer_temperature", "agent_temperature", "hint_temperature", "top_p", "top_k", "designer_max_tokens",
        "agent_max_tokens", "hint_max_tokens", "screen_max_tokens", "designer_timeout_s", "hint_timeout_s",
        "designer_thinking", "hint_thinking", "screen_thinking", "hint_arm_thinking", "hint_sampling"}
