"""The CPU smoke run's settings (examples/smoke_cpu.yaml) against the paper recipes.

The smoke run turns a few knobs so that a 135M model on 2 cores gets through the whole method in
minutes (docs/smoke_run.md, "The smoke run's settings"); the paper recipes must leave every one of those
knobs at the paper's setting, memory seeding off above all.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spade.designer.memory import load_seed_records
from spade.selfplay.settings import SelfPlaySettings
from spade.train_config import load_train_config

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "examples" / "recipes").glob("*.yaml"))
SMOKE = ROOT / "examples" / "smoke_cpu.yaml"
PAPER = SelfPlaySettings()


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipes_keep_the_paper_settings_and_do_not_seed_the_memory(recipe: Path):
    config = load_train_config(recipe)
    sp = config.selfplay
    if sp.env_source == "spice":
        pytest.skip("SPICE's recipes carry their own settings (tests/test_spice_recipes.py)")
    assert sp.memory_seed_dir is None
    rlve = sp.env_source == "rlve"  # the RLVE baseline's released batch and temperature (tests/test_rlve_recipes.py)
    roles = sp.sampling
    assert (roles.designer.temperature, roles.agent.temperature, roles.hint.temperature) == \
        (0.6, 1.0 if rlve else 0.6, 0.3)
    assert [(r.top_p, r.top_k) for r in (roles.designer, roles.agent, roles.hint)] == \
        [(p.top_p, p.top_k) for p in (PAPER.sampling.designer, PAPER.sampling.agent, PAPER.sampling.hint)]
    assert roles.designer.max_tokens in (16384, 20000)  # 8B thinking: 20,000
    # the baselines play no hinted arm (no designer, no regret to measure); RLVE plays 16 problems
    hint_plays = 0 if sp.env_source != "designer" else 16
    assert sp.max_attempts == 5 and (sp.g_hint, sp.envs_per_set) == (hint_plays, 16 if rlve else 24)
    assert config.optimizer.lr == 1e-6
    assert config.corpus.max_words == (4000 if sp.domain == "tool_use" else 6000)  # SPEC 2
    assert sp.skills.window is None  # the curriculum's own window (games: 3)
    assert sp.rewards.advantage_agent_samples == 192  # the released global batch in the designer weight
    assert sp.designer_prompt_order == "released"  # the paper code's section order


def test_the_smoke_run_seeds_the_memory_with_graded_examples():
    smoke = load_train_config(SMOKE)
    sp = smoke.selfplay
    assert sp.memory_seed_dir is not None and sp.use_memory
    # 16 x 8 agent samples, not the paper's 192: the weight counts them, as the released formula does
    assert sp.rewards.advantage_agent_samples is None
    from spade.selfplay.sources.designer_source import resolve_seed_dir

    assert sp.admission.winnability_gate  # spade's own configs play the designer's proof (docs/smoke_run.md)
    seeds = load_seed_records(resolve_seed_dir(sp.memory_seed_dir), ["Mathematical Reasoning"])
    assert len(seeds) == 2  # the designer prompt's two positives
    # the paper's sampling settings stay
    designer = sp.sampling.designer
    assert (designer.temperature, designer.top_p, designer.top_k) == (0.6, 0.95, 20)
    # the designer budget holds an example, and the context holds the prompt plus the budget
    assert designer.max_tokens >= max(len(r.source) for r in seeds) // 4
    assert sp.max_context_tokens >= 2 * designer.max_tokens


def test_bf16_note_only_on_a_cpu_without_native_bf16():
    from spade.run.preflight import cpu_bf16_note

    assert load_train_config(SMOKE).model.dtype == "auto"  # fp32 where bf16 would be emulated
    smoke = load_train_config(SMOKE, ["model.dtype=bfloat16"])
    note = cpu_bf16_note(smoke, cuda=False, native_bf16=False)
    assert note is not None and "model.dtype=float32" in note
    assert cpu_bf16_note(smoke, cuda=False, native_bf16=True) is None
    assert cpu_bf16_note(smoke, cuda=True, native_bf16=False) is None
    fp32 = load_train_config(SMOKE, ["model.dtype=float32"])
    assert cpu_bf16_note(fp32, cuda=False, native_bf16=False) is None
