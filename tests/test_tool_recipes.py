"""The tool-use recipes (issue 9, SPEC 2): Qwen3-4B, 8B and 30B-A3B on one 8-GPU node with the
colocated SGLang engine. Each loads and validates with the real config loader, carries every
number of SPEC section 2 with the tool-use differences, and differs from the games recipe of the
same model only in those differences (same engine, layout, optimizer, run and sandbox)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from spade.designer.skills import domain_skills
from spade.train_config import from_dict, load_train_config, read_config_file

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "examples" / "recipes"
# tool recipe -> the games recipe of the same model and layout
PAIRS = {
    "tool_use_qwen3_4b_8gpu.yaml": "qwen3_4b_games_8gpu.yaml",
    "tool_use_qwen3_8b_8gpu.yaml": "qwen3_8b_games_8gpu.yaml",
    "tool_use_qwen3_30b_a3b_8gpu.yaml": "qwen3_30b_a3b_games_8gpu.yaml",
}
MODELS = {
    "tool_use_qwen3_4b_8gpu.yaml": "Qwen3-4B-Instruct-2507",
    "tool_use_qwen3_8b_8gpu.yaml": "Qwen3-8B",
    "tool_use_qwen3_30b_a3b_8gpu.yaml": "Qwen3-30B-A3B-Instruct-2507",
}
# what tool use changes in selfplay (everything else equals the games recipe); plays.mask_truncated:
# the released tool-use scripts pass --spade-compact-filter, the games scripts do not
TOOL_SELFPLAY = {"domain": "tool_use", "k": 8}
TOOL_PLAYS = {"mask_truncated": True}
TOOL_SAMPLING = {"hint": {"max_tokens": 2048}}  # and the hint's budget
# engine keys a tool recipe sets apart from its games recipe: the released tool-use 30B script gives
# SGLang 0.85 of the GPU (cmd/tool_use/_train_spade_blend.sh), the games one 0.7
TOOL_ENGINE = {"tool_use_qwen3_30b_a3b_8gpu.yaml": {"mem_fraction": 0.85}}


def test_the_tool_recipes_exist():
    names = {p.name for p in RECIPES.glob("tool_use_*.yaml")}
    assert {"tool_use_base.yaml", *PAIRS} <= names


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_tool_recipe_has_every_spec_number(name):
    config = load_train_config(RECIPES / name, [])
    assert Path(config.model.hf_dir).name == MODELS[name]
    o = config.optimizer
    assert (o.lr, tuple(o.betas), o.weight_decay, o.schedule) == (1e-6, (0.9, 0.98), 0.1, "constant")
    assert config.loss.kl_coef == 0.005
    sp = config.selfplay
    assert sp.domain == "tool_use"
    assert (sp.envs_per_set, sp.k, sp.g_nohint, sp.g_hint, sp.max_attempts) == (24, 8, 16, 16, 5)
    roles = sp.sampling
    assert (roles.designer.temperature, roles.agent.temperature, roles.hint.temperature) == (0.6, 0.6, 0.3)
    assert {(r.top_p, r.top_k) for r in (roles.designer, roles.agent, roles.hint, roles.screen)} == {(0.95, 20)}
    assert roles.designer.max_tokens == (20000 if "8b" in name else 16384)
    assert (roles.agent.max_tokens, roles.hint.max_tokens) == (8192, 2048)
    assert (sp.max_turns, sp.max_context_tokens, sp.memory_capacity) == (25, 32768, 200)
    assert (roles.designer.timeout_s, sp.admission.timeout_s, roles.hint.timeout_s) == (300.0, 60.0, 120.0)
    assert (config.sandbox.load_timeout_s, config.sandbox.reset_timeout_s, config.sandbox.step_timeout_s) == \
        (30.0, 30.0, 30.0)
    assert sp.rewards.advantage_cap == 50.0
    assert sp.use_corpus and sp.use_memory and sp.train_designer and sp.designer_enabled
    # all six tool-use skills at every regeneration (no rotation)
    six = domain_skills("tool_use")
    assert len(six) == 6
    for regeneration in range(6):
        assert sp.skills.active("tool_use", regeneration) == six
    # the tool stages as in the paper: the model screen asked, diagnostics reported, not rejected
    ta = sp.admission.tool_use
    assert (ta.min_tools, ta.max_tools, ta.model_screen) == (3, 8, True)
    assert not (ta.reject_true_at_reset or ta.reject_unchangeable or ta.reject_trivial)
    assert sp.plays.tool_mask_malformed_calls
    assert config.corpus.max_words == 4000 and config.corpus.paths
    assert all(Path(p).is_file() for p in config.corpus.paths)
    assert (config.run.steps, config.run.checkpoint_every) == (400, 16)
    assert config.engine.kind == "sglang" and config.engine.sglang.colocated
    sglang = config.engine.sglang
    assert sglang.servers_per_node * sglang.tp * sglang.dp == 8
    # a config snapshot of the run reads back to the same config
    assert from_dict(config.to_dict()) == config


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_tool_recipe_differs_from_the_games_recipe_only_in_tool_use(name):
    tools = load_train_config(RECIPES / name, [])
    games = load_train_config(RECIPES / PAIRS[name], [])
    for section in ("model", "parallel", "optimizer", "sandbox", "run"):
        assert getattr(tools, section) == getattr(games, section), section
    engine_changes = TOOL_ENGINE.get(name, {})
    assert tools.engine.sglang == dataclasses.replace(games.engine.sglang, **engine_changes)
    assert dataclasses.replace(tools.engine, sglang=games.engine.sglang) == games.engine
    assert tools.corpus.max_words == 4000 and games.corpus.max_words == 6000
    assert tools.loss.kl_coef == 0.005
    assert {k: v for k, v in vars(tools.loss).items() if k != "kl_coef"} == \
        {k: v for k, v in vars(games.loss).items() if k != "kl_coef"}
    changed = {key for key, value in vars(tools.selfplay).items() if getattr(games.selfplay, key) != value}
    assert changed == {*TOOL_SELFPLAY, "sampling", "plays"}, changed
    for key, value in TOOL_SELFPLAY.items():
        assert getattr(tools.selfplay, key) == value
    assert tools.selfplay.plays == dataclasses.replace(games.selfplay.plays, **TOOL_PLAYS)
    assert tools.selfplay.sampling == games.selfplay.sampling.replace(**TOOL_SAMPLING)


def test_the_base_writes_the_tool_use_differences_itself():
    """tool_use_base.yaml names each tool-use number (not only through games_base.yaml)."""
    import yaml

    own = yaml.safe_load((RECIPES / "tool_use_base.yaml").read_text())
    assert own["include"] == "games_base.yaml"
    assert own["loss"]["kl_coef"] == 0.005
    sp = own["selfplay"]
    assert (sp["domain"], sp["k"], sp["sampling"]["hint"]["max_tokens"], sp["rewards"]["advantage_cap"]) == \
        ("tool_use", 8, 2048, 50.0)
    assert own["corpus"]["max_words"] == 4000
    merged = read_config_file(RECIPES / "tool_use_base.yaml")
    assert merged["engine"]["kind"] == "hf"  # the model files put it on SGLang
