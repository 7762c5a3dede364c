"""``selfplay.plays`` (issue 39): each rule's spade default and its released value, played for real
in the sandbox with a scripted agent (the agent's replies are decided by the test; the environment,
the runner, the policy's token bookkeeping and the sandbox are the real parts)."""

from __future__ import annotations

import asyncio

import pytest

from chat_templates import bpe_tokenizer
from scripted_engine import ScriptedEngine
from spade.config import ConfigError, from_mapping
from spade.envs.runner import EndReason, play_episode
from spade.rollout.conversation import ChatFormat
from spade.rollout.engine import GenerationResult, SamplingParams
from spade.selfplay.sources.designer_source import EnvSpec
from spade.selfplay.plays.play_rules import PlayRules, fill_round_robin
from spade.selfplay.plays.player import Player
from spade.selfplay.plays.policy import EnginePolicy
from spade.selfplay.plays.released_policy import ReleasedHintPolicy, ScopedMaskPolicy, released_hint_policy
from spade.selfplay.seeds import derive_seed, reset_seed
from spade.selfplay.settings import SamplingSettings, SelfPlaySettings

SEED_ENV = '''
class SeedEnv:
    def __init__(self, max_turns=2):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.seed = seed
        return f"seed {seed}: say anything", {}

    def step(self, action):
        return "done", 1.0, True, False, {}
'''
RAISING_ENV = SEED_ENV.replace('return "done", 1.0, True, False, {}', 'raise ValueError("broken step")')
HANGING_ENV = SEED_ENV.replace('return "done", 1.0, True, False, {}', 'while True:\n            pass')
COUNTING_ENV = '''
class CountEnv:
    def __init__(self, max_turns=3):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.turn = 0
        return "reply three times", {}

    def step(self, action):
        self.turn += 1
        return f"turn {self.turn} got {action!r}", 0.0, False, False, {}
'''


class Replies(ScriptedEngine):
    """Every request answered with ``text``; ``finish`` as the finish reason (``length``: cut off,
    no end-of-turn token)."""

    def __init__(self, tokenizer, text: str = "ok", finish: str = "stop"):
        super().__init__(tokenizer)
        self.text, self.finish = text, finish

    def reply_ids(self, prompt: str) -> list[int]:
        ids = self.text_ids(self.text)
        return ids if self.finish == "stop" else ids[:-1]

    async def generate(self, request):
        ids = self._ids(request)
        return GenerationResult(ids, [-0.5] * len(ids), self.finish, 0)


@pytest.fixture(scope="module")
def tokenizer():
    return bpe_tokenizer()


def _spec(source: str, env_id: str = "e0", hint: str = "a hint") -> EnvSpec:
    return EnvSpec(env_id=env_id, slot=0, skill="Logical Deduction", source=source, hint=hint, class_name="",
                   max_turns=None, generated_step=0)


def _player(sandbox, engine, tokenizer, **rules) -> Player:
    settings = SelfPlaySettings(envs_per_set=1, g_nohint=3, g_hint=3, max_turns=2,
                                sampling=SamplingSettings().replace(agent={"max_tokens": 16}),
                                max_context_tokens=4096, plays=PlayRules(**rules))
    return Player(settings, sandbox=sandbox.service, engine=engine, tokenizer=tokenizer,
                  chat_format=ChatFormat(tokenizer), seed=7)


# --------------------------------------------------------------------------- settings


def test_defaults_are_spade_and_bad_values_name_the_key():
    rules = SelfPlaySettings().plays
    assert (rules.reset_seeds, rules.env_faults, rules.hint_arm_budgets, rules.tool_mask_scope,
            rules.released_loader_names) == ("paired", "score_zero", "like_nohint", "any_format_error", False)
    for key, allowed in (("reset_seeds", "paired, independent"), ("env_faults", "score_zero, retry_then_drop"),
                         ("hint_arm_budgets", "like_nohint, released"),
                         ("tool_mask_scope", "any_format_error, tool_call_block")):
        with pytest.raises(ConfigError, match=rf"selfplay\.plays\.{key}: 'x' is not allowed; choose one of: {allowed}"):
            from_mapping(SelfPlaySettings, {"plays": {key: "x"}}, where="selfplay")
        with pytest.raises(ConfigError, match=rf"selfplay\.plays\.{key}"):
            PlayRules(**{key: "x"})
    with pytest.raises(ConfigError, match=r"selfplay\.plays\.released_loader_names: must be true or false"):
        PlayRules(released_loader_names="yes")
    with pytest.raises(ConfigError, match=r"selfplay\.plays\.env_faults"):
        SelfPlaySettings(plays=PlayRules(env_faults="retry_then_drop"),
                         partial_rollouts=from_mapping(type(SelfPlaySettings().partial_rollouts), {"enabled": True},
                                                       where="selfplay.partial_rollouts"))


# --------------------------------------------------------------------------- reset seeds


def test_reset_seed_streams():
    paired = [reset_seed(7, 3, "e0", i, hinted=h) for h in (False, True) for i in range(2)]
    assert paired[:2] == paired[2:] == [derive_seed(7, "reset", 3, "e0", i) for i in range(2)]
    nohint = [reset_seed(7, 3, "e0", i, hinted=False, paired=False) for i in range(2)]
    hinted = [reset_seed(7, 3, "e0", i, hinted=True, paired=False) for i in range(2)]
    assert nohint == paired[:2]  # the no-hint arm keeps its seeds: only the hinted arm moves
    assert hinted == [derive_seed(7, "reset", "hint", 3, "e0", i) for i in range(2)]
    assert not set(hinted) & set(nohint)


@pytest.mark.parametrize("rule", ["paired", "independent"])
def test_arms_reset_with_paired_or_independent_seeds(sandbox, tokenizer, rule):
    player = _player(sandbox, Replies(tokenizer), tokenizer, reset_seeds=rule)
    plays = sandbox.run(player.play_all(2, player.requests([_spec(SEED_ENV)], with_hint=True)))
    nohint = {p.index: p for p in plays if not p.hinted}
    hinted = {p.index: p for p in plays if p.hinted}
    assert len(nohint) == len(hinted) == 3
    for i in range(3):
        assert nohint[i].seed == derive_seed(7, "reset", 2, "e0", i)  # unchanged by the rule
        assert f"seed {nohint[i].seed}:" in nohint[i].opening  # the environment saw it
        assert f"seed {hinted[i].seed}:" in hinted[i].opening
        assert (hinted[i].seed == nohint[i].seed) is (rule == "paired")


# --------------------------------------------------------------------------- environment faults


def test_raising_environment_scores_zero_by_default(sandbox, tokenizer):
    engine = Replies(tokenizer)
    player = _player(sandbox, engine, tokenizer)
    plays = sandbox.run(player.play_all(0, player.requests([_spec(RAISING_ENV)], with_hint=False)))
    assert [(p.episode_return, p.end_reason) for p in plays] == [(0.0, EndReason.ENV_ERROR.value)] * 3
    assert len(engine.prompts) == 3 and player.fault_drops == 0


def test_raising_environment_is_retried_once_then_dropped(sandbox, tokenizer):
    engine = Replies(tokenizer)
    player = _player(sandbox, engine, tokenizer, env_faults="retry_then_drop")
    requests = player.requests([_spec(RAISING_ENV)], with_hint=True)
    plays = sandbox.run(player.play_all(0, requests))
    assert [p for p in plays if not p.hinted] == []  # never scored
    assert player.fault_drops == 3
    # the hinted arm keeps scoring a fault 0, as the released hint plays did
    assert [(p.episode_return, p.end_reason) for p in plays if p.hinted] == [(0.0, "env_error")] * 3
    assert len(engine.prompts) == 3 * 2 + 3  # two attempts per no-hint play, one per hinted play
    assert player.hung_envs == set()


def test_hung_environment_is_left_out_for_its_window(sandbox, tokenizer):
    engine = Replies(tokenizer)
    player = _player(sandbox, engine, tokenizer, env_faults="retry_then_drop")
    hanging, fine = _spec(HANGING_ENV, "hang"), _spec(SEED_ENV, "fine")
    plays = sandbox.run(player.play_all(0, player.requests([hanging, fine], with_hint=False)), timeout=120)
    assert player.hung_envs == {"hang"}
    assert sorted((p.env_id, p.index) for p in plays) == [("fine", 0), ("fine", 1), ("fine", 2)]
    # the canary play timed out; the group's other plays never started
    assert sum("seed" in prompt and "say anything" in prompt for prompt in engine.prompts) == 1 + 3
    assert player.fault_drops == 1
    assert [r.env.env_id for r in player.requests([hanging, fine], with_hint=True)] == ["fine"] * 6


def test_fill_round_robin_hand_computed():
    assert fill_round_robin(["a", "b", "c"], 7) == ["a", "b", "c", "a", "b", "c", "a"]
    assert fill_round_robin(["a", "b"], 2) == ["a", "b"]
    assert fill_round_robin(["a", "b", "c"], 1) == ["a", "b", "c"]
    assert fill_round_robin([], 4) == []


# --------------------------------------------------------------------------- the hinted arm's budgets


def _episode(sandbox, policy, source=COUNTING_ENV, max_turns=3):
    async def run():
        env = await sandbox.service.open(source)
        try:
            return await play_episode(env, policy, seed=1, max_turns=max_turns, hint="think")
        finally:
            await env.close()
    return sandbox.run(run())


def test_cut_off_reply_ends_the_hinted_arm_unless_released(sandbox, tokenizer):
    sampling = SamplingParams(max_new_tokens=16, seed=5)
    engine = Replies(tokenizer, "a reply cut short", finish="length")
    like = _episode(sandbox, EnginePolicy(engine, tokenizer, sampling, max_context_tokens=4096,
                                          chat_format=ChatFormat(tokenizer)))
    assert like.end_reason is EndReason.POLICY_STOPPED and len(like.turns) == 0
    released = _episode(sandbox, released_hint_policy(engine, tokenizer, sampling, chat_format=ChatFormat(tokenizer)))
    assert released.end_reason is EndReason.TURN_BUDGET and len(released.turns) == 3
    assert [t.action for t in released.turns] == ["a reply cut short"] * 3


def test_context_budget_binds_only_the_spade_hinted_arm(sandbox, tokenizer):
    sampling = SamplingParams(max_new_tokens=16, seed=5)
    engine = Replies(tokenizer, "fine")
    first = _episode(sandbox, EnginePolicy(engine, tokenizer, sampling, max_context_tokens=4096,
                                           chat_format=ChatFormat(tokenizer)), max_turns=1)
    room = len(first_prompt_ids(engine, tokenizer)) + 20  # room for the first reply, not the second turn
    like = _episode(sandbox, EnginePolicy(engine, tokenizer, sampling, max_context_tokens=room,
                                          chat_format=ChatFormat(tokenizer)))
    assert like.end_reason is EndReason.POLICY_STOPPED and len(like.turns) == 1
    released = _episode(sandbox, ReleasedHintPolicy(engine, tokenizer, sampling, max_context_tokens=room,
                                                    chat_format=ChatFormat(tokenizer)))
    assert released.end_reason is EndReason.POLICY_STOPPED and len(released.turns) == 1  # the class keeps a given budget
    unbounded = _episode(sandbox, released_hint_policy(engine, tokenizer, sampling, chat_format=ChatFormat(tokenizer)))
    assert unbounded.end_reason is EndReason.TURN_BUDGET and len(unbounded.turns) == 3
    assert first.turns


def first_prompt_ids(engine: Replies, tokenizer) -> list[int]:
    return tokenizer(engine.prompts[0], add_special_tokens=False)["input_ids"]


# --------------------------------------------------------------------------- tool-use mask scope


@pytest.mark.parametrize("reply,masked_in_scope", [("I would rather just talk.", False),
                                                    ('<tool_call>{"name": broken</tool_call>', True)])
def test_mask_scope(tokenizer, reply, masked_in_scope):
    from spade.envs.runner import Message

    sampling = SamplingParams(max_new_tokens=32)
    engine = Replies(tokenizer, reply)
    for cls, expect in ((EnginePolicy, True), (ScopedMaskPolicy, masked_in_scope)):
        policy = cls(engine, tokenizer, sampling, max_context_tokens=4096, chat_format=ChatFormat(tokenizer))
        asyncio.run(policy([Message("user", "do the task")]))
        policy.mask_last_turn()  # what the runner does on a format error
        trained = sum(policy.conversation.loss_mask)
        assert (trained == 0) is expect, (cls.__name__, reply)
