"""The Fixed-env RLVE recipes: one per model size, each the SPADE recipe of that size with the
baseline's released settings (shared/notes/eval_protocol.md): RLVE's difficulty rule at its
released values, one problem per group, 16 problems x 16 plays = 256 per step, temperature 1.0,
KL 0, 400 steps, a fresh set every step, no designer, hint plays, corpus or memory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from spade.selfplay.sources.rlve_settings import OFFICIAL16, RLVESettings
from spade.train_config import load_train_config

RECIPES = Path(__file__).resolve().parent.parent / "examples" / "recipes"
PAIRS = {
    "baseline_rlve_qwen3_4b_8gpu.yaml": "qwen3_4b_games_8gpu.yaml",
    "baseline_rlve_qwen3_8b_8gpu.yaml": "qwen3_8b_games_8gpu.yaml",
    "baseline_rlve_qwen3_30b_a3b_8gpu.yaml": "qwen3_30b_a3b_games_8gpu.yaml",
}


def test_every_size_has_a_recipe():
    assert {p.name for p in RECIPES.glob("baseline_rlve_*.yaml")} == set(PAIRS)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_rlve_recipe_has_the_released_settings(name):
    assert yaml.safe_load((RECIPES / name).read_text())["include"] == PAIRS[name]
    config = load_train_config(RECIPES / name, [])
    spade = load_train_config(RECIPES / PAIRS[name], [])
    sp = config.selfplay
    assert sp.env_source == "rlve" and not sp.designer_enabled and not sp.train_designer
    assert not sp.use_corpus and not sp.use_memory
    assert (sp.k, sp.envs_per_set, sp.g_nohint, sp.g_hint) == (1, 16, 16, 0)
    assert sp.envs_per_set * sp.g_nohint == 256  # the global batch
    assert sp.sampling.agent.temperature == 1.0 and config.loss.kl_coef == 0.0 and config.run.steps == 400
    assert sp.rlve == RLVESettings()  # window 4, 0.9 over 128 plays
    # the released launcher's default set (RLVE_ENV_SET=official16), written out in the recipe
    assert sp.rlve.environments == "official16"
    assert yaml.safe_load((RECIPES / name).read_text())["selfplay"]["rlve"]["environments"] == "official16"
    assert sp.envs_per_set == len(OFFICIAL16)  # 16 slots, 16 environments: each once a step
    # the engine, the layout, the model (8B: thinking) and the optimizer of the run it compares with
    assert (config.engine, config.parallel, config.model, config.optimizer) == \
        (spade.engine, spade.parallel, spade.model, spade.optimizer)
    agent, theirs = sp.sampling.agent, spade.selfplay.sampling.agent
    assert (agent.max_tokens, agent.top_p, agent.top_k) == (theirs.max_tokens, theirs.top_p, theirs.top_k)
