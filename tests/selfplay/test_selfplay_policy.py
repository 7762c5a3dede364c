"""An agent episode end to end: sandboxed environment, episode runner, HF engine, token-exact sample."""

from __future__ import annotations

import asyncio
import textwrap

from chat_templates import bpe_tokenizer
from spade.agent.prompts import first_user_message
from spade.envs.runner import EndReason, play_episode
from spade.rollout import HFEngine, SamplingParams
from spade.rollout.conversation import ChatFormat
from spade.selfplay.plays.policy import EnginePolicy
from support.models import tiny_qwen3

ECHO = textwrap.dedent('''
    class EchoEnv:
        def __init__(self, max_turns=3):
            self.max_turns = max_turns
        def reset(self, seed=None):
            self.turn = 0
            return "say anything", {}
        def step(self, action):
            self.turn += 1
            done = self.turn >= 2
            return f"heard {len(action)} characters", 1.0 if done else 0.0, done, False, {}
''')


def tiny_engine(tokenizer, eos_bias: float = 0.0) -> HFEngine:
    """A random tiny Qwen3; ``eos_bias`` is added to end-of-turn's logit so replies end (several turns)."""
    model = tiny_qwen3(tokenizer, max_position_embeddings=512, eos_bias=eos_bias)
    return HFEngine((model, tokenizer), eos_token_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),))


def play(sandbox, tokenizer, engine, sampling, max_context_tokens=400):
    policy = EnginePolicy(engine, tokenizer, sampling, max_context_tokens=max_context_tokens,
                          chat_format=ChatFormat(tokenizer))

    async def go():
        env = await sandbox.service.open(ECHO)
        try:
            return await play_episode(env, policy, seed=3), policy
        finally:
            await env.close()
            batcher = [task for task in asyncio.all_tasks() if task.get_name() == "hf-engine-batcher"]
            engine.close()
            await asyncio.wait_for(asyncio.gather(*batcher), 30)  # the engine's batching task has ended

    return sandbox.run(go(), timeout=120)


class Recording:
    """The engine, keeping every request it was sent and the result it returned."""

    def __init__(self, engine) -> None:
        self.inner = engine
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, request):
        result = await self.inner.generate(request)
        self.calls.append((request, result))
        return result


def test_episode_tokens_are_exactly_what_the_engine_produced(sandbox):
    tokenizer = bpe_tokenizer()
    engine = Recording(tiny_engine(tokenizer, eos_bias=5.0))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=(eos,), seed=11)
    result, policy = play(sandbox, tokenizer, engine, sampling)
    conversation = policy.conversation
    assert conversation is not None
    assistant = [m.content for m in result.messages if m.role == "assistant"]
    assert len(assistant) == conversation.turns == len(policy.weight_versions) == len(engine.calls) >= 2
    ids, mask = conversation.token_ids, conversation.loss_mask
    generated_runs, starts, run = [], [], []
    for position, (token, flag) in enumerate(zip(ids, mask)):
        if flag:
            if not run:
                starts.append(position)
            run.append(token)
        elif run:
            generated_runs.append(run)
            run = []
    if run:
        generated_runs.append(run)
    assert len(generated_runs) == conversation.turns
    logprobs = conversation.rollout_logprobs
    for (request, produced), generated, start, reply in zip(engine.calls, generated_runs, starts, assistant):
        # the trained tokens of each turn are the engine's ids and log-probs, unchanged; its prompt
        # was the whole conversation before them; the runner's message is their decoded text
        assert generated == list(produced.token_ids)
        assert logprobs[start:start + len(generated)] == list(produced.logprobs)
        assert list(request.prompt_ids) == ids[:start]
        assert reply == tokenizer.decode([t for t in produced.token_ids if t != eos])
    # The opening prompt is the chat template's rendering of the runner's first messages.
    first = [m.to_dict() for m in result.messages[:1]]
    assert ids[:len(conversation.prompt_ids)] == tokenizer.apply_chat_template(first, add_generation_prompt=True,
                                                                                tokenize=True, return_dict=False)
    logprobs = conversation.rollout_logprobs
    assert all(lp <= 0.0 for lp, flag in zip(logprobs, mask) if flag)
    assert all(lp == 0.0 for lp, flag in zip(logprobs, mask) if not flag)
    if result.end_reason is EndReason.TERMINATED:
        assert result.episode_return == 1.0
    else:  # a reply hit max_new_tokens without end-of-turn: the episode stops with return 0
        assert result.end_reason is EndReason.POLICY_STOPPED and result.episode_return == 0.0


def test_same_seed_same_episode(sandbox):
    tokenizer = bpe_tokenizer()
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
    first, policy_a = play(sandbox, tokenizer, tiny_engine(tokenizer), sampling)
    second, policy_b = play(sandbox, tokenizer, tiny_engine(tokenizer), sampling)
    assert policy_a.conversation.token_ids == policy_b.conversation.token_ids
    assert [t.action for t in first.turns] == [t.action for t in second.turns]


def test_context_budget_stops_the_episode(sandbox):
    tokenizer = bpe_tokenizer()
    engine = tiny_engine(tokenizer)
    opening = first_user_message("say anything")
    prompt_len = len(tokenizer.apply_chat_template([{"role": "user", "content": opening}], add_generation_prompt=True,
                                                   tokenize=True, return_dict=False))
    sampling = SamplingParams(temperature=0.0, max_new_tokens=200, seed=1)
    result, policy = play(sandbox, tokenizer, engine, sampling, max_context_tokens=prompt_len + 120)
    assert result.end_reason is EndReason.POLICY_STOPPED
    assert result.episode_return == 0.0
    assert len(policy.conversation.token_ids) <= prompt_len + 120
