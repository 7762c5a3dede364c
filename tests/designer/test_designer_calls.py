"""The hint and model-screen calls of a designer round: their text cap, token budget and thinking.

The released code (spade-rl/spade at 9b2b813) keeps a hint's parsed reply whole
(``spade/core/hint_generator.py``), gives its environment validator (our tool-use model screen)
16,384 tokens (``--spade-env-validator-max-tokens`` default, ``spade/slime/arguments.py``), and in its
8B runs switches thinking on for the designer and the agent only, so the hint and validator calls
render with ``--apply-chat-template-kwargs '{"enable_thinking":false}'``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from chat_templates import CHATML, bpe_tokenizer
from spade.config import ConfigError
from spade.rollout.conversation import ChatFormat, TemplateError, thinking_template_kwargs
from spade.rollout.engine import GenerationResult, RolloutEngine
from spade.selfplay.sources.designer_source import DesignerRound
from spade.selfplay.settings import SamplingSettings, SelfPlaySettings
from spade.train_config import from_dict

ROOT = Path(__file__).resolve().parents[2]
HYBRID = (ROOT / "tests" / "fixtures" / "qwen3_hybrid.jinja").read_text()
THINK_ON_PROMPT = "<|im_start|>assistant\n"
THINK_OFF_PROMPT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
SOURCE = "class AEnv:\n    pass\n"
TOOLS = [{"type": "function", "function": {"name": "look", "description": "Look.",
                                           "parameters": {"type": "object", "properties": {}}}}]


class Recorder(RolloutEngine):
    """TEST DOUBLE: records each request (prompt text, max_new_tokens) and answers ``reply``."""

    def __init__(self, tokenizer, reply: str):
        self.tokenizer, self.reply = tokenizer, reply
        self.requests: list[tuple[str, int]] = []

    @property
    def weight_version(self) -> int:
        return 0

    async def generate(self, request):
        self.requests.append((self.tokenizer.decode(list(request.prompt_ids)), request.sampling.max_new_tokens))
        generated = self.tokenizer.encode(self.reply + "<|im_end|>", add_special_tokens=False)
        return GenerationResult(tuple(generated), tuple([-1.0] * len(generated)), "stop", 0)

    async def update_weights(self, named_tensors, version):
        pass

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def hybrid():
    return bpe_tokenizer(HYBRID)


def designer_round(tmp_path, tokenizer, reply: str, *, model_thinking: str = "auto", **settings):
    engine = Recorder(tokenizer, reply)
    sp = SelfPlaySettings(envs_per_set=1, max_attempts=1, max_context_tokens=32768, use_memory=False,
                          use_corpus=False, **settings)
    chat_format = ChatFormat(tokenizer, thinking_template_kwargs(tokenizer.chat_template, model_thinking))
    round_ = DesignerRound(sp, sandbox=None, engine=engine, tokenizer=tokenizer, chat_format=chat_format,
                           corpus=None, memory=None, run_dir=tmp_path, seed=5)
    return round_, engine


# --------------------------------------------------------------------------- hint text cap


def test_a_long_hint_is_kept_whole_by_default(tmp_path, hybrid):
    """The default cap is none: a 5,000-character hint comes through whole (the old default cut it
    to 1,000); the key stays as an option."""
    words = " ".join(f"step{i:04d}" for i in range(600))  # 600 x 9 characters + spaces
    assert len(words) > 5000
    assert SelfPlaySettings().hint_max_chars is None
    round_, _ = designer_round(tmp_path / "a", hybrid, words)
    assert asyncio.run(round_.make_hint(SOURCE, 0, 0)) == words
    capped, _ = designer_round(tmp_path / "b", hybrid, words, hint_max_chars=1000)
    assert asyncio.run(capped.make_hint(SOURCE, 0, 0)) == words[:1000]
    with pytest.raises(ConfigError, match=r"selfplay\.hint_max_chars: must be an integer >= 1 or null"):
        from_dict({"selfplay": {"hint_max_chars": 0}})
    assert from_dict({"selfplay": {"hint_max_chars": None}}).selfplay.hint_max_chars is None


# --------------------------------------------------------------------------- screen token budget


def roles(**values) -> SamplingSettings:
    return SamplingSettings().replace(**values)


def test_the_model_screen_has_its_own_token_budget(tmp_path, hybrid):
    """The screen asks for ``sampling.screen.max_tokens`` (default 16,384, the released validator's),
    not the hint's budget; the hint keeps ``sampling.hint.max_tokens``."""
    assert SelfPlaySettings().sampling.screen.max_tokens == 16384
    round_, engine = designer_round(tmp_path, hybrid, "VERDICT: yes", domain="tool_use",
                                    sampling=roles(hint={"max_tokens": 2048}))
    assert asyncio.run(round_.model_screen(SOURCE, TOOLS)) is True
    asyncio.run(round_.make_hint(SOURCE, 0, 0))
    (_, screen_budget), (_, hint_budget) = engine.requests
    assert (screen_budget, hint_budget) == (16384, 2048)
    small, engine = designer_round(tmp_path / "b", hybrid, "VERDICT: no", domain="tool_use",
                                   sampling=roles(screen={"max_tokens": 300}))
    assert asyncio.run(small.model_screen(SOURCE, TOOLS)) is False
    assert engine.requests[0][1] == 300
    with pytest.raises(ConfigError, match=r"selfplay\.sampling\.screen\.max_tokens: must be an integer >= 1"):
        from_dict({"selfplay": {"sampling": {"screen": {"max_tokens": 0}}}})


# --------------------------------------------------------------------------- thinking per role


def ending(prompt: str) -> str:
    return "off" if prompt.endswith(THINK_OFF_PROMPT) else "on" if prompt.endswith(THINK_ON_PROMPT) else "?"


@pytest.mark.parametrize("model_thinking", ["auto", "on", "off"])
@pytest.mark.parametrize("role_thinking", ["auto", "on", "off"])
def test_hint_and_screen_thinking_override_model_thinking(tmp_path, hybrid, model_thinking, role_thinking):
    """auto follows model.thinking (the hybrid template's own default is on); on / off set
    enable_thinking for the hint and the screen calls alone; the designer keeps model.thinking."""
    round_, engine = designer_round(tmp_path, hybrid, "VERDICT: yes", model_thinking=model_thinking,
                                    domain="tool_use", sampling=roles(hint={"thinking": role_thinking},
                                                                      screen={"thinking": role_thinking}))
    asyncio.run(round_.make_hint(SOURCE, 0, 0))
    asyncio.run(round_.model_screen(SOURCE, TOOLS))
    designer_prompt = round_.chat_format.prompt_ids([{"role": "user", "content": "x"}])
    model_side = "off" if model_thinking == "off" else "on"
    expected = model_side if role_thinking == "auto" else role_thinking
    assert [ending(prompt) for prompt, _ in engine.requests] == [expected, expected]
    assert ending(hybrid.decode(designer_prompt)) == model_side


def test_hint_and_screen_thinking_are_separate(tmp_path, hybrid):
    round_, engine = designer_round(tmp_path, hybrid, "VERDICT: yes", model_thinking="on", domain="tool_use",
                                    sampling=roles(hint={"thinking": "off"}))
    asyncio.run(round_.make_hint(SOURCE, 0, 0))
    asyncio.run(round_.model_screen(SOURCE, TOOLS))
    assert [ending(prompt) for prompt, _ in engine.requests] == ["off", "on"]


def test_role_thinking_keys_and_a_template_without_the_switch(tmp_path):
    for value, expected in (("on", "on"), ("off", "off"), ("auto", "auto"), (True, "on"), (False, "off")):
        config = from_dict({"selfplay": {"sampling": {"hint": {"thinking": value}, "screen": {"thinking": value}}}})
        assert (config.selfplay.sampling.hint.thinking, config.selfplay.sampling.screen.thinking) == (expected, expected)
    assert (SelfPlaySettings().sampling.hint.thinking, SelfPlaySettings().sampling.screen.thinking) == ("auto", "auto")
    for role in ("hint", "screen"):
        with pytest.raises(ConfigError, match=rf"selfplay\.sampling\.{role}\.thinking: 'yes' is not allowed; "
                                              "choose one of: auto, on, off"):
            from_dict({"selfplay": {"sampling": {role: {"thinking": "yes"}}}})
    chatml = bpe_tokenizer(CHATML)
    designer_round(tmp_path / "auto", chatml, "x")  # auto needs no switch
    for role in ("hint", "screen"):
        with pytest.raises(TemplateError, match=rf"selfplay\.sampling\.{role}\.thinking: 'off' needs a chat "
                                                r"template with an enable_thinking switch"):
            designer_round(tmp_path / role, chatml, "x", sampling=roles(**{role: {"thinking": "off"}}))


def test_preflight_checks_role_thinking_against_the_template(tmp_path):
    import json

    from spade.run.preflight import preflight
    from spade.run.run_dir import RunDirError

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    base = {"model": {"hf_dir": str(model)}}
    preflight(from_dict({**base, "selfplay": {"use_corpus": False}}))
    for role in ("hint", "screen"):
        with pytest.raises(RunDirError, match=rf"selfplay\.sampling\.{role}\.thinking: 'on' needs a chat template"):
            preflight(from_dict({**base, "selfplay": {"use_corpus": False, "sampling": {role: {"thinking": "on"}}}}))
    (model / "chat_template.jinja").write_text(HYBRID)
    preflight(from_dict({**base, "selfplay": {"use_corpus": False, "sampling": {"hint": {"thinking": "off"},
                                                                                "screen": {"thinking": "on"}}}}))
