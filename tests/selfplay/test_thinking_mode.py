"""model.thinking: the chat-template thinking switch for every role, and what a sample is with it.

The tokenizer carries the real hybrid Qwen3 template (tests/fixtures/qwen3_hybrid.jinja, the one
Qwen3-8B ships): its generation prompt is ``<|im_start|>assistant\\n``, plus an empty think block
when ``enable_thinking=False``, and when it renders history it drops the reasoning of assistant
turns before the latest user message. spade keeps each episode one token-exact sequence with every
turn's reasoning in it (spade.rollout.conversation); the step test checks that on the real
orchestrator: every designer, hint and agent request ends with the configured generation prompt,
a two-turn agent sample is prompt + turn 1 + observation + turn 2 exactly, and the loss covers
only the generated spans.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from chat_templates import CHATML, bpe_tokenizer
from spade.config import ConfigError
from spade.designer.prompts import DESIGNER_SYSTEM, HINT_SYSTEM
from spade.designer.skills import SkillSettings
from spade.envs.runner import Message
from spade.eval.in_loop import EvalSettings, evaluate_in_loop
from spade.rl.samples import Role
from spade.rollout.conversation import ChatFormat, Conversation, TemplateError, thinking_template_kwargs
from spade.rollout.engine import GenerationRequest, GenerationResult, RolloutEngine, SamplingParams
from spade.run.preflight import preflight
from spade.run.run_dir import RunDirError
from spade.selfplay.orchestrator import Orchestrator
from spade.selfplay.plays.policy import EnginePolicy
from spade.selfplay.settings import AdmissionSettings, SamplingSettings, SelfPlaySettings
from spade.selfplay.step import Step
from spade.train_config import from_dict, load_train_config

ROOT = Path(__file__).resolve().parents[2]
HYBRID = (ROOT / "tests" / "fixtures" / "qwen3_hybrid.jinja").read_text()
RECIPES = ROOT / "examples" / "recipes"
THINK_ON_PROMPT = "<|im_start|>assistant\n"
THINK_OFF_PROMPT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"

# Always two turns: the first action is answered with an observation, the second ends the episode.
TWO_STEP_SOURCE = '''
class TwoStepEnv:
    def __init__(self, max_turns=4):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.turn = 0
        return "Say A, then B.", {}

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return "Now say B.", 0.0, False, False, {}
        return "done", (1.0 if "B" in action else 0.0), True, False, {}
'''


@pytest.fixture(scope="module")
def tokenizer():
    return bpe_tokenizer(HYBRID)


def ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


# --------------------------------------------------------------------------- the setting


def test_config_key_values_and_errors():
    assert from_dict({}).model.thinking == "auto"
    for value, expected in (("on", "on"), ("off", "off"), ("auto", "auto"), (True, "on"), (False, "off")):
        assert from_dict({"model": {"thinking": value}}).model.thinking == expected
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigError, match=r"model\.thinking: .* choose one of: auto, on, off"):
            from_dict({"model": {"thinking": bad}})
    # YAML 1.1 reads a bare on/off as a boolean: the key still means on/off, and the snapshot reads back
    config = from_dict({"model": {"thinking": True}})
    assert from_dict(json.loads(json.dumps(config.to_dict()))).model.thinking == "on"


def test_recipes_thinking_for_qwen3_8b_only():
    for name in ("qwen3_8b_games", "qwen3_8b_games_8gpu", "qwen3_8b_games_multinode"):
        assert load_train_config(RECIPES / f"{name}.yaml").model.thinking == "on", name
    for name in ("qwen3_4b_games", "qwen3_30b_a3b_games"):  # Instruct-2507: no switch in their template
        assert load_train_config(RECIPES / f"{name}.yaml").model.thinking == "auto", name


def test_template_kwargs_need_a_template_with_the_switch():
    assert thinking_template_kwargs(HYBRID, "auto") == {}
    assert thinking_template_kwargs(HYBRID, "on") == {"enable_thinking": True}
    assert thinking_template_kwargs({"default": CHATML, "tool_use": HYBRID}, "off") == {"enable_thinking": False}
    assert thinking_template_kwargs(CHATML, "auto") == {}
    for template in (CHATML, None):
        with pytest.raises(TemplateError, match=r"model\.thinking: 'on' needs a chat template with an "
                                                r"enable_thinking switch.*use auto"):
            thinking_template_kwargs(template, "on")
    with pytest.raises(ValueError, match="model.thinking: 'yes' is not allowed; choose one of: auto, on, off"):
        thinking_template_kwargs(HYBRID, "yes")


def test_preflight_rejects_thinking_for_a_model_without_the_switch(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    base = {"selfplay": {"use_corpus": False}}
    preflight(from_dict({**base, "model": {"hf_dir": str(model), "thinking": "auto"}}))
    with pytest.raises(RunDirError, match=r"model\.thinking: 'off' needs a chat template"):
        preflight(from_dict({**base, "model": {"hf_dir": str(model), "thinking": "off"}}))
    (model / "chat_template.jinja").write_text(HYBRID)  # the file the tokenizer prefers
    preflight(from_dict({**base, "model": {"hf_dir": str(model), "thinking": "off"}}))


# --------------------------------------------------------------------------- prompts and samples


def test_generation_prompts_follow_the_setting(tokenizer):
    """Opening prompt and every delta end with the configured generation prompt; auto is the
    template's default, which for the hybrid template is thinking on."""
    opening = [{"role": "system", "content": "Play."}, {"role": "user", "content": "You see a cat."}]
    prompts = {}
    for setting in ("auto", "on", "off"):
        fmt = ChatFormat(tokenizer, thinking_template_kwargs(HYBRID, setting))
        prompts[setting] = fmt.prompt_ids(opening)
        delta = fmt.message_delta([{"role": "user", "content": "It ran."}])
        ending = THINK_OFF_PROMPT if setting == "off" else THINK_ON_PROMPT
        assert tokenizer.decode(prompts[setting]).endswith("You see a cat.<|im_end|>\n" + ending)
        assert tokenizer.decode(delta) == "<|im_start|>user\nIt ran.<|im_end|>\n" + ending
    assert prompts["auto"] == prompts["on"] != prompts["off"]
    assert prompts["off"] == prompts["on"] + ids(tokenizer, "<think>\n\n</think>\n\n")


def test_two_turns_keep_the_reasoning_token_exact(tokenizer):
    """ids = prompt + turn 1 + closing rest + observation delta + turn 2; the loss mask is 1 on the
    two generated spans only; the turn-1 reasoning is in the sequence although the template's own
    rendering of the same messages drops it."""
    fmt = ChatFormat(tokenizer, {"enable_thinking": True})
    opening = [{"role": "user", "content": "Say A, then B."}]
    conv = Conversation(tokenizer, opening, max_context_tokens=4096, chat_format=fmt)
    first = ids(tokenizer, "<think>\nfirst A, as asked\n</think>\n\n\\boxed{A}<|im_end|>")
    second = ids(tokenizer, "<think>\nnow B\n</think>\n\n\\boxed{B}<|im_end|>")
    conv.append_generated(first, [-0.5] * len(first))
    observation = conv.append_message("user", "Now say B.")
    conv.append_generated(second, [-0.25] * len(second))

    prompt = ids(tokenizer, "<|im_start|>user\nSay A, then B.<|im_end|>\n<|im_start|>assistant\n")
    between = ids(tokenizer, "\n<|im_start|>user\nNow say B.<|im_end|>\n<|im_start|>assistant\n")
    assert list(conv.prompt_ids) == prompt and observation == between
    assert conv.token_ids == prompt + first + between + second
    n = len(prompt)
    mask = [0] * n + [1] * len(first) + [0] * len(between) + [1] * len(second)
    assert conv.loss_mask == mask
    fields = conv.train_fields()
    assert fields["loss_mask"] == mask[1:]
    assert fields["rollout_logprobs"] == [0.0] * (n - 1) + [-0.5] * len(first) + [0.0] * len(between) \
        + [-0.25] * len(second)
    assert "first A, as asked" in tokenizer.decode(conv.token_ids)
    rerendered = tokenizer.apply_chat_template(conv.messages, tokenize=False, enable_thinking=True)
    assert "first A, as asked" not in rerendered and "now B" in rerendered


class ScriptedModel(RolloutEngine):
    """TEST DOUBLE, not a real part: it plays every role (designer, hint, agent) with fixed text.

    The designer writes ``TWO_STEP_SOURCE`` (after reasoning that holds a decoy code block when
    thinking), the hint writer one sentence, the agent ``\\boxed{A}`` then ``\\boxed{B}`` in each
    episode (recognised by its request affinity). Every request and response is recorded."""

    def __init__(self, tokenizer, thinking: bool):
        self.tokenizer, self.thinking = tokenizer, thinking
        self.calls: list[tuple[str, str | None, list[int], list[int]]] = []  # role, affinity, prompt, generated
        self._turns: dict[str, int] = {}

    @property
    def weight_version(self) -> int:
        return 0

    def _reasoning(self, text: str) -> str:
        return f"<think>\n{text}\n</think>\n\n" if self.thinking else ""

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        prompt = self.tokenizer.decode(list(request.prompt_ids))
        if DESIGNER_SYSTEM[:60] in prompt:
            role = "designer"
            text = self._reasoning("A draft:\n```python\nclass Draft:\n    pass\n```\nbetter: two steps.") \
                + f"```python\n{TWO_STEP_SOURCE}\n```"
        elif HINT_SYSTEM[:60] in prompt:
            role, text = "hint", self._reasoning("what helps?") + "Say A first, then B."
        else:
            role = "agent"
            turn = self._turns[request.affinity] = self._turns.get(request.affinity, 0) + 1
            text = self._reasoning(f"turn {turn}: the game wants {'AB'[turn - 1]}") + f"\\boxed{{{'AB'[turn - 1]}}}"
        generated = ids(self.tokenizer, text + "<|im_end|>")
        self.calls.append((role, request.affinity, list(request.prompt_ids), generated))
        return GenerationResult(tuple(generated), tuple([-1.0] * len(generated)), "stop", 0)

    async def update_weights(self, named_tensors, version):
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize("setting", ["on", "off"])
def test_step_prompts_and_samples_with_thinking(sandbox, tokenizer, tmp_path, setting):
    # admission.probes off: any reply holding "B" wins the scripted game, which the degenerate probes
    # rightly reject; this test is about the prompts' and samples' chat format, not admission
    sampling = SamplingSettings().replace(designer=dict(max_tokens=64), agent=dict(max_tokens=64), hint=dict(max_tokens=64))
    settings = SelfPlaySettings(envs_per_set=1, k=2, g_nohint=2, g_hint=1, max_attempts=1, sampling=sampling,
                                max_turns=4, max_context_tokens=16384,
                                skills=SkillSettings(window=1), admission=AdmissionSettings(probes=False))
    model = ScriptedModel(tokenizer, thinking=setting == "on")
    orch = Orchestrator(settings, sandbox=sandbox.service, engine=model, tokenizer=tokenizer, corpus=None,
                        memory=None, run_dir=tmp_path, seed=7,
                        chat_template_kwargs=thinking_template_kwargs(HYBRID, setting))
    out = sandbox.run(orch.run_step(Step(0)), timeout=120)
    assert out.metrics["env/admitted"] == 1

    ending = ids(tokenizer, THINK_OFF_PROMPT if setting == "off" else THINK_ON_PROMPT)
    empty_think = ids(tokenizer, "<think>\n\n</think>\n\n")
    roles = [role for role, *_ in model.calls]
    assert roles.count("designer") == 1 and roles.count("hint") == 1 and roles.count("agent") == 2 * 3
    for role, _, prompt, _ in model.calls:
        assert prompt[-len(ending):] == ending, role
        if setting == "on":
            assert prompt[-len(empty_think):] != empty_think, role

    # The designer's sample (pending for k steps) is its prompt + response, reasoning included.
    _, _, designer_prompt, designer_response = next(c for c in model.calls if c[0] == "designer")
    pending = orch.pending_samples[orch.envs[0].env_id]
    assert list(pending.token_ids) == designer_prompt + designer_response
    assert list(pending.loss_mask) == [0] * (len(designer_prompt) - 1) + [1] * len(designer_response)

    # Each no-hint play is one sample: turn-2 prompt + turn 2, the turn-2 prompt being turn-1 prompt +
    # turn 1 + the observation delta; the loss covers the two generated spans only.
    episodes: dict[str, list[tuple[list[int], list[int]]]] = {}
    for role, affinity, prompt, generated in model.calls:
        if role == "agent":
            episodes.setdefault(affinity, []).append((prompt, generated))
    between = ids(tokenizer, "\n<|im_start|>user\nNow say B.<|im_end|>\n") + ending
    expected = []
    for (prompt1, gen1), (prompt2, gen2) in episodes.values():
        assert prompt2 == prompt1 + gen1 + between
        mask = [0] * len(prompt1) + [1] * len(gen1) + [0] * len(between) + [1] * len(gen2)
        expected.append((tuple(prompt2 + gen2), tuple(mask[1:])))
        if setting == "on":  # the model saw its own earlier reasoning when it wrote turn 2
            assert "turn 1: the game wants A" in tokenizer.decode(prompt2)
    samples = [t for t in out.samples if t.role is Role.AGENT]
    assert len(samples) == 2 and all(t.reward == 1.0 for t in samples)
    for sample in samples:
        assert (sample.token_ids, sample.loss_mask) in expected


class Recorder(RolloutEngine):
    """TEST DOUBLE: records each prompt and answers ``\\boxed{42}`` and the end-of-turn token."""

    def __init__(self, tokenizer):
        self.tokenizer, self.prompts = tokenizer, []

    @property
    def weight_version(self) -> int:
        return 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.prompts.append(list(request.prompt_ids))
        generated = ids(self.tokenizer, "\\boxed{42}<|im_end|>")
        return GenerationResult(tuple(generated), tuple([0.0] * len(generated)), "stop", 0)

    async def update_weights(self, named_tensors, version):
        pass

    def close(self) -> None:
        pass


def test_tool_episodes_keep_the_setting_beside_the_tools(tokenizer):
    """A tool episode renders with its own ChatFormat (the tools go into the template): the
    thinking keyword comes along."""
    tools = [{"type": "function", "function": {"name": "look", "description": "Look around.",
                                               "parameters": {"type": "object", "properties": {}}}}]
    engine = Recorder(tokenizer)
    fmt = ChatFormat(tokenizer, thinking_template_kwargs(HYBRID, "off"))
    policy = EnginePolicy(engine, tokenizer, SamplingParams(max_new_tokens=32), max_context_tokens=4096,
                          chat_format=fmt)
    asyncio.run(policy([Message("user", "Find the key.")], tools=tools))
    text = tokenizer.decode(engine.prompts[0])
    assert "<tools>" in text and text.endswith("Find the key.<|im_end|>\n" + THINK_OFF_PROMPT)


def test_in_loop_evaluation_renders_with_the_setting(tokenizer, tmp_path):
    engine = Recorder(tokenizer)
    settings = EvalSettings(every=1, benchmarks=("aime25",), data_dir=str(ROOT / "tests" / "fixtures" / "eval"),
                            samples=1, limit=1)
    asyncio.run(evaluate_in_loop(engine, tokenizer, settings, step=1, out_dir=tmp_path,
                                 chat_template_kwargs={"enable_thinking": False}))
    assert engine.prompts and all(tokenizer.decode(p).endswith(THINK_OFF_PROMPT) for p in engine.prompts)
