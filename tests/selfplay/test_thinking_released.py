"""Issue 39, Qwen3-8B thinking as released: the designer's and the hinted arm's own thinking
switches, and the per-turn form of a thinking agent's episode (``selfplay.plays.sample_form``).

The tokenizer carries the real hybrid Qwen3 template (tests/fixtures/qwen3_hybrid.jinja): when it
renders history it keeps only the answer of assistant turns before the latest user message. The
steps run on the real orchestrator and sandbox with a scripted model (a test double).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chat_templates import bpe_tokenizer
from spade.config import ConfigError
from spade.designer.prompts import DESIGNER_SYSTEM, HINT_SYSTEM
from spade.designer.skills import SkillSettings
from spade.rl.samples import Role, Trajectory
from spade.rollout.conversation import thinking_template_kwargs
from spade.rollout.engine import GenerationRequest, GenerationResult, RolloutEngine
from spade.selfplay.rewards.advantages import agent_advantages
from spade.selfplay.batch_rules import BatchRules
from spade.selfplay.orchestrator import Orchestrator, _agent_episodes
from spade.selfplay.plays.partial_rollout_settings import PartialRolloutSettings
from spade.selfplay.plays.play_rules import PlayRules
from spade.selfplay.settings import AdmissionSettings, SamplingSettings, SelfPlaySettings
from spade.selfplay.step import Step
from spade.selfplay.plays.turn_samples import episode_weights
from spade.train_config import from_dict

ROOT = Path(__file__).resolve().parents[2]
HYBRID = (ROOT / "tests" / "fixtures" / "qwen3_hybrid.jinja").read_text()
THINK_ON_PROMPT = "<|im_start|>assistant\n"
THINK_OFF_PROMPT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"

# Three turns: A, B, then C; the return is 1 when the third reply holds C.
THREE_STEP_SOURCE = '''
class ThreeStepEnv:
    def __init__(self, max_turns=5):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.turn = 0
        return "Say A, then B, then C.", {}

    def step(self, action):
        self.turn += 1
        if self.turn < 3:
            return "Now say " + "ABC"[self.turn] + ".", 0.0, False, False, {}
        return "done", (1.0 if "C" in action else 0.0), True, False, {}
'''


@pytest.fixture(scope="module")
def tokenizer():
    return bpe_tokenizer(HYBRID)


def ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


class ScriptedModel(RolloutEngine):
    """TEST DOUBLE, not a real part: the designer writes ``THREE_STEP_SOURCE``, the hint writer one
    sentence, the agent reasons and answers A, B, C (the second no-hint episode answers D last, so
    the two plays' returns differ). Every request and its reply are recorded."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls: list[tuple[str, str | None, list[int], list[int], str]] = []  # role, affinity, prompt, ids, text
        self._turns: dict[str, int] = {}
        self._episodes: list[str] = []

    @property
    def weight_version(self) -> int:
        return 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        prompt = self.tokenizer.decode(list(request.prompt_ids))
        if DESIGNER_SYSTEM[:60] in prompt:
            role, text = "designer", f"<think>\nthree steps\n</think>\n\n```python\n{THREE_STEP_SOURCE}\n```"
        elif HINT_SYSTEM[:60] in prompt:
            role, text = "hint", "<think>\nwhat helps?\n</think>\n\nSay A, B and C in turn."
        else:
            role = "hinted" if "HINT:" in prompt else "agent"
            turn = self._turns[request.affinity] = self._turns.get(request.affinity, 0) + 1
            if role == "agent" and request.affinity not in self._episodes:
                self._episodes.append(request.affinity)
            loser = role == "agent" and self._episodes.index(request.affinity) == 1
            answer = "D" if loser and turn == 3 else "ABC"[turn - 1]
            text = f"<think>\nreasoning of turn {turn}\n</think>\n\n\\boxed{{{answer}}}"
        generated = ids(self.tokenizer, text + "<|im_end|>")
        self.calls.append((role, request.affinity, list(request.prompt_ids), generated, text))
        return GenerationResult(tuple(generated), tuple([-1.0] * len(generated)), "stop", 0)

    async def update_weights(self, named_tensors, version):
        pass

    def close(self) -> None:
        pass


def run_step(sandbox, tokenizer, tmp_path, **overrides):
    # admission.probes off: any reply holding "C" wins the scripted game, which the degenerate probes
    # rightly reject; these tests are about the samples' chat format, not admission
    settings = SelfPlaySettings(**{**dict(envs_per_set=1, k=2, g_nohint=2, g_hint=1, max_attempts=1,
                                          admission=AdmissionSettings(probes=False),
                                          sampling=SamplingSettings().replace(designer={"max_tokens": 256},
                                                                              agent={"max_tokens": 64},
                                                                              hint={"max_tokens": 64}),
                                          max_turns=5, max_context_tokens=16384, skills=SkillSettings(window=1)),
                                   **overrides})
    model = ScriptedModel(tokenizer)
    orch = Orchestrator(settings, sandbox=sandbox.service, engine=model, tokenizer=tokenizer, corpus=None,
                        memory=None, run_dir=tmp_path, seed=7, chat_template_kwargs=thinking_template_kwargs(HYBRID, "on"))
    out = sandbox.run(orch.run_step(Step(0)), timeout=120)
    assert out.metrics["env/admitted"] == 1
    return model, out


def ending(tokenizer, prompt: list[int]) -> str:
    text = tokenizer.decode(prompt)
    return "off" if text.endswith(THINK_OFF_PROMPT) else "on" if text.endswith(THINK_ON_PROMPT) else "?"


# --------------------------------------------------------------------------- the per-turn form


def test_per_turn_thinking_episode_is_one_sample_per_turn(sandbox, tokenizer, tmp_path):
    model, out = run_step(sandbox, tokenizer, tmp_path, plays=PlayRules(sample_form="per_turn"))
    episodes: dict[str, list[tuple[list[int], list[int], str]]] = {}
    for role, affinity, prompt, generated, text in model.calls:
        if role == "agent":
            episodes.setdefault(affinity, []).append((prompt, generated, text))
    assert len(episodes) == 2 and all(len(turns) == 3 for turns in episodes.values())

    expected: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for turns in episodes.values():
        messages = [{"role": "user", "content": tokenizer.decode(turns[0][0]).split("<|im_start|>user\n")[1]
                     .split("<|im_end|>")[0]}]
        observations = ["Now say B.", "Now say C."]
        for t, (prompt, generated, text) in enumerate(turns):
            # the prompt is the template's rendering of the messages so far, earlier reasoning dropped
            rendering = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                      enable_thinking=True)
            assert prompt == ids(tokenizer, rendering)
            decoded = tokenizer.decode(prompt)
            for earlier in range(1, t + 1):
                assert f"reasoning of turn {earlier}" not in decoded
                assert f"\\boxed{{{'ABC'[earlier - 1]}}}" in decoded  # the earlier answer stays
            expected.append((tuple(prompt + generated), tuple([0] * (len(prompt) - 1) + [1] * len(generated))))
            messages += [{"role": "assistant", "content": text}]
            if t < 2:
                messages += [{"role": "user", "content": observations[t]}]

    samples = [s for s in out.samples if s.role is Role.AGENT]
    assert len(samples) == 6
    assert sorted((s.token_ids, s.loss_mask) for s in samples) == sorted(expected)
    # every turn sample of a play carries the play's return and the play's advantage
    by_play: dict[int, list[Trajectory]] = {}
    for sample in samples:
        by_play.setdefault(sample.index, []).append(sample)
    returns = {index: plays[0].reward for index, plays in by_play.items()}
    assert sorted(returns.values()) == [0.0, 1.0]
    advantages = dict(zip(sorted(returns), agent_advantages([returns[i] for i in sorted(returns)])))
    for index, plays in by_play.items():
        assert len(plays) == 3
        assert all(p.reward == returns[index] and p.advantage == pytest.approx(advantages[index]) for p in plays)
    assert {round(a, 6) for a in advantages.values()} == {1.0, -1.0}
    for plays in by_play.values():  # one episode in the loss: its first turn counts it, weights by loss tokens
        tokens = [sum(p.loss_mask) for p in plays]
        assert [p.count_weight for p in plays] == [1, 0, 0]
        assert [p.loss_weight for p in plays] == pytest.approx([n / sum(tokens) for n in tokens])


def test_per_turn_step_under_the_released_cut_and_fault_fill(sandbox, tokenizer, tmp_path):
    """Both plays survive (no fill); the cut to a global batch of 1 keeps one whole episode."""
    _, out = run_step(sandbox, tokenizer, tmp_path, batch=BatchRules(global_batch=1, cut_to_global_batch=True),
                      plays=PlayRules(sample_form="per_turn", env_faults="retry_then_drop"))
    samples = [s for s in out.samples if s.role is Role.AGENT]
    assert len(samples) == 3 and len({s.index for s in samples}) == 1
    assert [s.count_weight for s in samples] == [1, 0, 0] and out.metrics["agent/fault_fill"] == 0.0


def test_sequence_form_stays_the_default(sandbox, tokenizer, tmp_path):
    """Default: one sample per play, every turn's reasoning kept in it as generated."""
    assert SelfPlaySettings().plays.sample_form == "sequence"
    model, out = run_step(sandbox, tokenizer, tmp_path)
    samples = [s for s in out.samples if s.role is Role.AGENT]
    assert len(samples) == 2
    for sample in samples:
        text = tokenizer.decode(list(sample.token_ids))
        assert all(f"reasoning of turn {t}" in text for t in (1, 2, 3))


def test_the_designer_weight_counts_episodes_in_the_per_turn_form():
    def turn(index: int) -> Trajectory:
        return Trajectory(token_ids=(1, 2), loss_mask=(1,), env_id="e", index=index, generated_step=0)

    samples = [turn(0), turn(0), turn(0), turn(1), turn(1)]
    assert _agent_episodes(episode_weights(samples[:3]) + episode_weights(samples[3:])) == 2
    assert _agent_episodes(samples) == 5  # one sequence per episode


# --------------------------------------------------------------------------- the two role switches


@pytest.mark.parametrize("designer, hint_arm", [("auto", "auto"), ("off", "off"), ("off", "auto")])
def test_designer_and_hinted_arm_thinking(sandbox, tokenizer, tmp_path, designer, hint_arm):
    """model.thinking on; each switch off renders its role's prompts with enable_thinking false, auto
    follows model.thinking; the hint call and the no-hint arm keep theirs."""
    sampling = SamplingSettings().replace(designer={"max_tokens": 256, "thinking": designer},
                                          agent={"max_tokens": 64, "hinted_thinking": hint_arm}, hint={"max_tokens": 64})
    model, out = run_step(sandbox, tokenizer, tmp_path, sampling=sampling)
    seen: dict[str, set[str]] = {}
    for role, _, prompt, _, _ in model.calls:
        seen.setdefault(role, set()).add(ending(tokenizer, prompt))
    assert seen["designer"] == {"off" if designer == "off" else "on"}
    assert seen["hinted"] == {"off" if hint_arm == "off" else "on"}
    assert seen["hint"] == {"on"} and seen["agent"] == {"on"}


def test_switch_values_and_errors():
    config = from_dict({})
    roles = config.selfplay.sampling
    assert (roles.designer.thinking, roles.agent.hinted_thinking) == ("auto", "auto")
    for value, expected in (("on", "on"), ("off", "off"), (False, "off"), (True, "on")):
        roles = from_dict({"selfplay": {"sampling": {"designer": {"thinking": value},
                                                     "agent": {"hinted_thinking": value}}}}).selfplay.sampling
        assert (roles.designer.thinking, roles.agent.hinted_thinking) == (expected, expected)
    for role, key in (("designer", "thinking"), ("agent", "hinted_thinking")):
        with pytest.raises(ConfigError, match=rf"selfplay\.sampling\.{role}\.{key}: 'yes' is not allowed; "
                                              "choose one of: auto, on, off"):
            from_dict({"selfplay": {"sampling": {role: {key: "yes"}}}})
    per_turn = {"selfplay": {"plays": {"sample_form": "per_turn"}}}
    assert from_dict(per_turn).selfplay.plays.sample_form == "per_turn"
    with pytest.raises(ConfigError, match=r"selfplay\.plays\.sample_form: 'turns' is not allowed; choose one of: "
                                          r"sequence, per_turn"):
        from_dict({"selfplay": {"plays": {"sample_form": "turns"}}})
    for clash in ({"domain": "tool_use"}, {"partial_rollouts": PartialRolloutSettings(enabled=True)}):
        with pytest.raises(ConfigError, match=r"selfplay\.plays\.sample_form: per_turn with .*allowed: sequence"):
            SelfPlaySettings(plays=PlayRules(sample_form="per_turn"), **clash)
    # the released batch cut and fault fill keep and copy whole episodes (tests/rl/test_per_episode_loss.py)
    released = SelfPlaySettings(batch=BatchRules(cut_to_global_batch=True),
                                plays=PlayRules(sample_form="per_turn", env_faults="retry_then_drop"))
    assert released.batch.cut_to_global_batch and released.plays.drops_faults


def test_preflight_checks_the_new_switches_against_the_template(tmp_path):
    from chat_templates import CHATML
    from spade.run.preflight import preflight
    from spade.run.run_dir import RunDirError
    import json

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    for role, key in (("designer", "thinking"), ("agent", "hinted_thinking")):
        with pytest.raises(RunDirError, match=rf"selfplay\.sampling\.{role}\.{key}: 'off' needs a chat template"):
            preflight(from_dict({"model": {"hf_dir": str(model)},
                                 "selfplay": {"use_corpus": False, "sampling": {role: {key: "off"}}}}))


def test_per_turn_keeps_the_released_reply_reserve(tokenizer):
    """``core/orchestrator.py:626-642``: a turn whose prompt leaves 64 tokens or fewer ends the
    episode; otherwise the reply may take at most what is left beyond those 64."""
    import asyncio

    from spade.envs.runner import Message, StopEpisode
    from spade.rollout.engine import SamplingParams
    from spade.selfplay.plays.turn_samples import RESERVED_REPLY_TOKENS, PerTurnPolicy

    asked: list[int] = []

    class Recording(RolloutEngine):
        weight_version = 0

        async def generate(self, request: GenerationRequest) -> GenerationResult:
            asked.append(request.sampling.max_new_tokens)
            reply = ids(tokenizer, "\\boxed{A}<|im_end|>")
            return GenerationResult(tuple(reply), tuple([-1.0] * len(reply)), "stop", 0)

        async def update_weights(self, named_tensors, version):
            pass

        def close(self) -> None:
            pass

    messages = [Message("user", "Say A.")]
    prompt = len(ids(tokenizer, tokenizer.apply_chat_template([m.to_dict() for m in messages], tokenize=False,
                                                               add_generation_prompt=True)))

    def policy(context: int) -> PerTurnPolicy:
        return PerTurnPolicy(Recording(), tokenizer, SamplingParams(max_new_tokens=1000), max_context_tokens=context)

    asyncio.run(policy(prompt + RESERVED_REPLY_TOKENS + 10)(messages))
    assert asked == [10]  # what lies beyond the reserve, below the per-turn limit
    with pytest.raises(StopEpisode):
        asyncio.run(policy(prompt + RESERVED_REPLY_TOKENS)(messages))
    assert asked == [10]  # no request: only the reserve was left
