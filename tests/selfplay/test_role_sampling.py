"""Each role's sampling comes from one place, its record in ``selfplay.sampling``: the designer,
agent, hint and screen calls, and the engine's form of an agent play."""

import pytest

from spade.config import ConfigError
from spade.rollout.engine import SamplingParams
from spade.selfplay.sampling_settings import (AgentSampling, DesignerSampling, HintSampling, SamplingSettings,
                                              ScreenSampling)
from spade.selfplay.settings import SelfPlaySettings
from spade.selfplay.sources.text_generators import TextSampling
from spade.train_config import from_dict

SAMPLING = SamplingSettings(designer=DesignerSampling(0.7, 0.8, 11, 900, 50.0),
                            agent=AgentSampling(0.5, 0.8, 11, 300, None),
                            hint=HintSampling(0.2, 0.8, 11, 200, 40.0),
                            screen=ScreenSampling(0.2, 0.8, 11, 700, 40.0))
SETTINGS = SelfPlaySettings(sampling=SAMPLING)


def test_each_role_has_its_record_and_todays_defaults():
    assert SETTINGS.sampling("designer") is SAMPLING.designer and SETTINGS.sampling("hint") is SAMPLING.hint
    defaults = SamplingSettings()
    values = {role: (r.temperature, r.top_p, r.top_k, r.max_tokens, r.timeout_s)
              for role in ("designer", "agent", "hint", "screen") for r in (defaults(role),)}
    assert values == {"designer": (0.6, 0.95, 20, 16384, 300.0), "agent": (0.6, 0.95, 20, 8192, None),
                      "hint": (0.3, 0.95, 20, 4096, 120.0), "screen": (0.3, 0.95, 20, 16384, 120.0)}
    assert (defaults.designer.thinking, defaults.hint.thinking, defaults.screen.thinking,
            defaults.agent.hinted_thinking) == ("auto",) * 4


def test_a_call_needs_a_bound_and_a_play_has_none():
    with pytest.raises(ConfigError, match=r"selfplay\.sampling\.hint\.timeout_s: must be a number of seconds > 0"):
        from_dict({"selfplay": {"sampling": {"hint": {"timeout_s": None}}}})
    with pytest.raises(ConfigError, match=r"selfplay\.sampling\.agent\.timeout_s: must be null"):
        from_dict({"selfplay": {"sampling": {"agent": {"timeout_s": 60}}}})
    with pytest.raises(ConfigError, match=r"selfplay\.sampling\.designer\.top_p: must be in \(0, 1\]"):
        from_dict({"selfplay": {"sampling": {"designer": {"top_p": 0}}}})


def test_replace_changes_only_the_named_fields():
    changed = SamplingSettings().replace(agent={"max_tokens": 64}, hint={"top_p": 0.9, "top_k": None})
    assert (changed.agent.max_tokens, changed.agent.temperature) == (64, 0.6)
    assert (changed.hint.top_p, changed.hint.top_k, changed.screen.top_p) == (0.9, None, 0.95)


def test_text_and_engine_forms():
    assert TextSampling.of(SETTINGS.sampling.hint, 5) == TextSampling(0.2, 0.8, 11, 200, 40.0, 5)
    assert SETTINGS.engine_sampling((7, 9), 3) == SamplingParams(temperature=0.5, top_p=0.8, top_k=11,
                                                                 max_new_tokens=300, stop_token_ids=(7, 9), seed=3)
