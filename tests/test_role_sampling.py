"""Each role's sampling comes from one place (``SelfPlaySettings.sampling``), read from the
``selfplay`` keys: the designer, agent, hint and screen calls, and the engine's form of an agent play."""

from spade.rollout.engine import SamplingParams
from spade.selfplay.settings import RoleSampling, SelfPlaySettings
from spade.selfplay.sources.text_generators import TextSampling

SETTINGS = SelfPlaySettings(designer_temperature=0.7, agent_temperature=0.5, hint_temperature=0.2, top_p=0.8,
                            top_k=11, designer_max_tokens=900, agent_max_tokens=300, hint_max_tokens=200,
                            screen_max_tokens=700, designer_timeout_s=50.0, hint_timeout_s=40.0)


def test_each_role_reads_its_own_keys():
    assert SETTINGS.sampling("designer") == RoleSampling(0.7, 0.8, 11, 900, 50.0)
    assert SETTINGS.sampling("agent") == RoleSampling(0.5, 0.8, 11, 300, None)
    assert SETTINGS.sampling("hint") == RoleSampling(0.2, 0.8, 11, 200, 40.0)
    # the tool-use screen: the hint's temperature, top-p / top-k and timeout, its own token budget
    assert SETTINGS.sampling("screen") == RoleSampling(0.2, 0.8, 11, 700, 40.0)


def test_released_hint_sampling_takes_the_adapters_top_p_and_no_top_k():
    released = SelfPlaySettings(top_p=0.8, top_k=11, hint_sampling="released")
    hint = released.sampling("hint")
    assert (hint.top_p, hint.top_k) == (0.9, None)
    assert (released.sampling("screen").top_p, released.sampling("screen").top_k) == (0.8, 11)


def test_text_and_engine_forms():
    assert TextSampling.of(SETTINGS.sampling("hint"), 5) == TextSampling(0.2, 0.8, 11, 200, 40.0, 5)
    assert SETTINGS.engine_sampling((7, 9), 3) == SamplingParams(temperature=0.5, top_p=0.8, top_k=11,
                                                                 max_new_tokens=300, stop_token_ids=(7, 9), seed=3)
