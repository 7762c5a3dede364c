"""selfplay.partial_rollouts (issue 26): the setting loads nested, is off by default, names its key in
every error, and ``enabled: true`` is refused by the orchestrator where carrying is not built (tool use;
the refill of flat groups). The carrying itself: tests/selfplay/test_partial_rollouts.py."""

import pytest

from spade.config import ConfigError, from_mapping
from spade.selfplay.orchestrator import Orchestrator
from spade.selfplay.plays.partial_rollout_settings import PartialRolloutSettings
from spade.selfplay.settings import SelfPlaySettings


def test_default_is_off_and_nested_section_loads():
    assert SelfPlaySettings().partial_rollouts == PartialRolloutSettings(enabled=False)
    s = from_mapping(SelfPlaySettings, {"partial_rollouts": {"complete_fraction": 0.5, "max_carry_steps": 2}},
                     where="selfplay")
    assert s.partial_rollouts.complete_fraction == 0.5 and s.partial_rollouts.max_carry_steps == 2
    assert s.partial_rollouts.enabled is False


@pytest.mark.parametrize("section, key", [
    ({"complete_fraction": 0.0}, "selfplay.partial_rollouts.complete_fraction"),
    ({"complete_fraction": 1.5}, "selfplay.partial_rollouts.complete_fraction"),
    ({"max_carry_steps": 0}, "selfplay.partial_rollouts.max_carry_steps"),
    ({"enabled": "yes"}, "selfplay.partial_rollouts.enabled"),
])
def test_bad_values_name_the_key(section, key):
    with pytest.raises(ConfigError, match=key):
        from_mapping(SelfPlaySettings, {"partial_rollouts": section}, where="selfplay")


def test_enabled_is_refused_for_tool_use(tmp_path):
    settings = SelfPlaySettings(domain="tool_use", partial_rollouts=PartialRolloutSettings(enabled=True))
    with pytest.raises(ConfigError, match=r"selfplay\.partial_rollouts\.enabled: true needs selfplay\.domain"):
        Orchestrator(settings, sandbox=None, engine=None, tokenizer=None, corpus=None, memory=None,
                     run_dir=tmp_path, seed=0)


def test_only_the_30b_variants_leave_the_synchronous_schedule():
    """The paper's recipes stay synchronous. The 30B-A3B partial variant changes only partial
    rollouts; the async variant over it only turns run.overlap on, with disaggregated servers."""
    from pathlib import Path

    from spade.train_config import load_train_config as load_config

    recipes = Path(__file__).resolve().parents[2] / "examples" / "recipes"
    configs = {p.name: load_config(p) for p in recipes.glob("*.yaml")}
    partial = sorted(name for name, c in configs.items() if c.selfplay.partial_rollouts.enabled)
    overlap = sorted(name for name, c in configs.items() if c.run.overlap)
    assert partial == ["qwen3_30b_a3b_games_8gpu_partial.yaml", "qwen3_30b_a3b_games_async.yaml"]
    assert overlap == ["qwen3_30b_a3b_games_async.yaml"]
    variant, paper = (configs[name].to_dict() for name in ("qwen3_30b_a3b_games_8gpu_partial.yaml",
                                                           "qwen3_30b_a3b_games_8gpu.yaml"))
    assert variant["selfplay"].pop("partial_rollouts") == {"enabled": True, "complete_fraction": 0.75,
                                                            "max_carry_steps": 1}
    paper["selfplay"].pop("partial_rollouts")
    assert variant == paper
    asynchronous, partial_only = (configs[name].to_dict() for name in ("qwen3_30b_a3b_games_async.yaml",
                                                                      "qwen3_30b_a3b_games_8gpu_partial.yaml"))
    assert asynchronous["run"].pop("overlap") == 1 and partial_only["run"].pop("overlap") == 0
    assert asynchronous["engine"]["sglang"].pop("urls") and not partial_only["engine"]["sglang"].pop("urls")
    assert asynchronous == partial_only
    assert not configs["qwen3_30b_a3b_games_async.yaml"].engine.sglang.colocated
