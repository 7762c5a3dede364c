"""Partial rollouts (issue 26): carried plays' state, stop and continue, groups kept whole, resume.

Real parts throughout: the bubblewrap sandbox, the HFEngine on a tiny random Qwen3 (the fixture of
tests/selfplay/test_orchestrator.py), the tokenizer of tests/chat_templates.py. ``StopAfterCalls`` wraps the
real engine only to set the step's stop event after a given number of completed requests, so a play
is stopped at a known turn; every token still comes from the real engine.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from spade.config import ConfigError
from spade.envs.runner import EpisodeResult, Message, ReplayDiverged, Turn, play_episode
from spade.rollout.conversation import ChatFormat, Conversation
from spade.rollout.engine import GenerationRequest, GenerationResult, RolloutEngine
from spade.selfplay.plays.carried_plays import (CarriedGroup, CarriedPlay, conversation_state,
                                          restore_conversation)
from spade.selfplay.sources.designer_source import EnvSpec
from spade.selfplay.orchestrator import Orchestrator
from spade.selfplay.plays.partial_rollout_settings import PartialRolloutSettings
from spade.selfplay.plays.play_record import Play
from spade.selfplay.plays.play_rules import PlayRules
from spade.selfplay.plays.player import Player
from spade.selfplay.step import Step
from test_orchestrator import TINY_SAMPLING, engine, tiny_settings, tokenizer  # noqa: F401  (module fixtures)

# Fixed episode lengths, so which play ends when does not depend on the random model: QUICK ends on
# its first step, LONG runs the whole turn budget (3 turns); every observation is a function of the
# reset seed and the actions.
QUICK = '''
import random


class QuickEnv:
    def __init__(self, max_turns=3):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.secret = random.Random(seed).randint(0, 9)
        return f"Say anything (secret {self.secret}).", {}

    def step(self, action):
        return "done", float(len(action) % 2), True, False, {}
'''
LONG = '''
import random


class LongEnv:
    def __init__(self, max_turns=3):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.turn = 0
        return f"Keep talking ({self.rng.randint(0, 99)}).", {}

    def step(self, action):
        self.turn += 1
        return f"turn {self.turn}: {len(action)} chars, noise {self.rng.randint(0, 99)}", 0.1, False, False, {}
'''


class StopAfterCalls(RolloutEngine):
    """The real engine; after ``after`` completed requests it sets ``stop`` (the step's stop event)."""

    def __init__(self, real: RolloutEngine, stop: asyncio.Event, after: int):
        self.real, self.stop, self.after, self.calls = real, stop, after, 0

    @property
    def weight_version(self) -> int:
        return self.real.weight_version

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = await self.real.generate(request)
        self.calls += 1
        if self.calls >= self.after:
            self.stop.set()
        return result

    async def update_weights(self, named_tensors, version):
        await self.real.update_weights(named_tensors, version)

    def close(self) -> None:
        pass  # the real engine belongs to the fixture


class StopDuringCall(StopAfterCalls):
    """The real engine; its ``after``-th request sets ``stop`` while the engine is still writing it."""

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.calls += 1
        if self.calls == self.after:
            asyncio.get_running_loop().call_soon(self.stop.set)
        return await self.real.generate(request)


def _spec(env_id: str, source: str) -> EnvSpec:
    return EnvSpec(env_id=env_id, slot=0, skill="s", source=source, hint="", class_name="LongEnv", max_turns=None,
                   generated_step=0)


def _settings(**overrides):
    values = dict(sampling=TINY_SAMPLING.replace(agent={"max_tokens": 24}), max_turns=3, plays=PlayRules(max_concurrent=1),
                  partial_rollouts=PartialRolloutSettings(enabled=True, complete_fraction=0.5, max_carry_steps=1))
    values.update(overrides)
    return tiny_settings(**values)


# --------------------------------------------------------------------------- carried state


def test_conversation_state_round_trips_through_json(tokenizer):
    fmt = ChatFormat(tokenizer)
    conv = Conversation(tokenizer, [{"role": "user", "content": "hello"}], max_context_tokens=512, chat_format=fmt)
    ids = tokenizer("a reply<|im_end|>", add_special_tokens=False)["input_ids"]
    conv.append_generated(ids, [-0.5] * len(ids), "stop", weight_version=3)
    conv.append_messages([{"role": "user", "content": "more"}])
    state = json.loads(json.dumps(conversation_state(conv)))
    back = restore_conversation(state, tokenizer, fmt)
    assert back.train_fields() == conv.train_fields() and back.turns == 1 and back.messages == conv.messages
    # both grow identically afterwards
    for c in (conv, back):
        c.append_generated(ids[:2], [-1.0, -2.0], "length", weight_version=4)
    assert back.train_fields() == conv.train_fields() and back.end_reason == conv.end_reason == "length"
    fields = back.train_fields()
    assert {v for v in fields["token_weight_versions"] if v is not None} == {3, 4}


def test_carried_group_round_trips_through_json(engine, tokenizer):
    fmt = ChatFormat(tokenizer)
    conv = Conversation(tokenizer, [{"role": "user", "content": "hi"}], max_context_tokens=256, chat_format=fmt)
    from spade.selfplay.trajectories import trajectory_of
    ids = tokenizer("ok<|im_end|>", add_special_tokens=False)["input_ids"]
    conv.append_generated(ids, [-0.25] * len(ids), "stop", weight_version=0)
    finished = Play("e0", False, 0, 1.0, 1, "terminated", trajectory_of(conv, logprob_temperature=1.0), seed=7,
                    opening="hi", turn_log=(Turn("ok", "ok", "done", 1.0, True, False),))
    unfinished = CarriedPlay(1, 8, [Message("user", "hi")], [], conversation_state(conv))
    env = _spec("e0", "x = 1")
    group = CarriedGroup(env, 3, 1, [finished], [unfinished])
    back = CarriedGroup.from_json(json.loads(json.dumps(group.to_json())), 1.0)
    assert back.to_json() == group.to_json()
    assert back.finished[0].trajectory.token_ids == finished.trajectory.token_ids
    assert back.unfinished[0].messages == [Message("user", "hi")] and back.size == 2


def test_enabled_is_refused_where_carrying_is_not_built(tmp_path):
    for overrides, key in ((dict(domain="tool_use"), "selfplay.domain"),
                           (dict(plays=PlayRules(drop_equal_return_groups=True, refill_equal_groups=1)), "plays.refill_equal_groups")):
        settings = _settings(**overrides)
        with pytest.raises(ConfigError, match=key):
            Orchestrator(settings, sandbox=None, engine=None, tokenizer=None, corpus=None, memory=None,
                         run_dir=tmp_path, seed=0)


# --------------------------------------------------------------------------- runner replay


def test_a_continued_episode_replays_its_actions_and_goes_on(sandbox):
    async def scripted(messages):  # a deterministic policy: its reply depends on the conversation
        return f"reply {len(messages)} {len(messages[-1].content)}"

    async def run(episode=None):
        env = await sandbox.service.open(LONG)
        try:
            return await play_episode(env, scripted, seed=11, max_turns=3, episode=episode)
        finally:
            await env.close()

    whole = sandbox.run(run())
    assert len(whole.turns) == 3
    # stopped before the second reply: messages up to the user message that asked for it
    cut = EpisodeResult(11, list(whole.messages[:3]), list(whole.turns[:1]))
    continued = sandbox.run(run(cut))
    assert continued.turns == whole.turns and continued.messages == whole.messages
    assert continued.end_reason == whole.end_reason
    forged = Turn(whole.turns[0].response, whole.turns[0].action, "something else", 0.1, False, False)
    with pytest.raises(ReplayDiverged, match="turn 0"):
        sandbox.run(run(EpisodeResult(11, list(whole.messages[:3]), [forged])))
    with pytest.raises(ReplayDiverged, match="reset"):
        sandbox.run(run(EpisodeResult(11, [Message("user", "not the opening")], [])))


# --------------------------------------------------------------------------- stop and continue


def test_a_stopped_play_continues_exactly_and_across_a_weight_update(sandbox, engine, tokenizer):
    """A play stopped after its first reply, carried through JSON and continued, is token for token
    the uninterrupted play (same seeds, same weights); after a weight update its later tokens carry
    the new version."""
    settings = _settings(plays=PlayRules(max_concurrent=4))
    env = _spec("long", LONG)

    def player(real):
        return Player(settings, sandbox=sandbox.service, engine=real, tokenizer=tokenizer,
                      chat_format=ChatFormat(tokenizer), seed=5, stop_token_ids=())

    whole_player = player(engine)
    group = whole_player.fresh_groups(2, [env])[0]
    whole = sandbox.run(whole_player._continue(group, group.unfinished[0], asyncio.Event()), timeout=120)
    assert isinstance(whole, Play) and whole.turns == 3, "the tiny model must end its replies for this test"

    stop = asyncio.Event()
    stopping = player(StopAfterCalls(engine, stop, after=1))
    carried = sandbox.run(stopping._continue(group, group.unfinished[0], stop), timeout=120)
    assert isinstance(carried, CarriedPlay) and len(carried.turns) == 1 and len(carried.messages) == 3
    carried = CarriedPlay.from_json(json.loads(json.dumps(carried.to_json())))
    done = sandbox.run(player(engine)._continue(group, carried, asyncio.Event()), timeout=120)
    assert done.trajectory.token_ids == whole.trajectory.token_ids
    assert done.trajectory.rollout_logprobs == pytest.approx(whole.trajectory.rollout_logprobs, abs=1e-5)
    assert done.turn_log == whole.turn_log and done.episode_return == whole.episode_return

    # stopped while the engine writes the second reply: the request is cancelled, the play carried
    # from the turn boundary, and it still ends as the uninterrupted play
    stop = asyncio.Event()
    cancelling = StopDuringCall(engine, stop, after=2)
    cut = sandbox.run(player(cancelling)._continue(group, group.unfinished[0], stop), timeout=120)
    assert isinstance(cut, CarriedPlay) and len(cut.turns) == 1 and cancelling.calls == 2
    assert cut.to_json() == carried.to_json()
    again = sandbox.run(player(engine)._continue(group, cut, asyncio.Event()), timeout=120)
    assert again.trajectory.token_ids == whole.trajectory.token_ids

    # the same weights published as version 1: the continued turns are written by version 1
    before = engine.weight_version
    named = [(name, tensor.detach().clone()) for name, tensor in engine.model.state_dict().items()]
    sandbox.run(engine.update_weights(named, before + 1), timeout=120)
    later = sandbox.run(player(engine)._continue(group, carried, asyncio.Event()), timeout=120)
    versions = later.trajectory.token_weight_versions
    assert versions is not None and {v for v in versions if v is not None} == {before, before + 1}
    assert later.trajectory.weight_version == before
    first_reply = carried.conversation["_versions"][1:]
    assert list(versions[:len(first_reply)]) == first_reply  # the carried tokens keep the version that wrote them


# --------------------------------------------------------------------------- the step


def _pool(tmp_path: Path) -> str:
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "a_quick.py").write_text(QUICK)
    (pool / "b_long.py").write_text(LONG)
    for name in ("a_quick", "b_long"):
        (pool / f"{name}.hint.txt").write_text("Any reply will do.")
    return str(pool)


def _orchestrator(sandbox, engine, tokenizer, run_dir, pool, **overrides):
    settings = _settings(designer_enabled=False, fixed_env_dir=pool, k=4, **overrides)
    return Orchestrator(settings, sandbox=sandbox.service, engine=engine, tokenizer=tokenizer, corpus=None,
                        memory=None, run_dir=run_dir, seed=1234)


def _groups(out):
    by: dict[tuple[str, int], list[int]] = {}
    for t in out.agent_samples:
        by.setdefault((t.env_id, t.generated_step), []).append(t.index)
    return {key: sorted(v) for key, v in by.items()}


def test_steps_carry_unfinished_groups_whole_and_resume_exactly(sandbox, engine, tokenizer, tmp_path):
    """One play at a time, half the set needed: step 1 trains the first environment's group and
    carries the second's (not started); step 2 finishes that group (trained at its origin step's
    seeds) and carries this step's groups; a resume from step 1's state repeats step 2 exactly;
    step 3 (max_carry_steps 1) and a regeneration step follow the design."""
    pool = _pool(tmp_path)
    orch = _orchestrator(sandbox, engine, tokenizer, tmp_path / "a", pool)
    out0 = sandbox.run(orch.run_step(Step(0)), timeout=180)  # regeneration: waits for every play
    assert out0.metrics["rollout/carried_over"] == 0 and out0.metrics["rollout/aborted"] == 0
    ids = [env.env_id for env in orch.envs]
    assert len(ids) == 2 and out0.metrics["agent/episodes"] == 4 and out0.metrics["agent/hint_episodes"] == 4

    out1 = sandbox.run(orch.run_step(Step(1)), timeout=180)
    assert out1.metrics["rollout/carried_over"] == 2 and out1.metrics["rollout/aborted"] == 0
    assert set(_groups(out1)) <= {(ids[0], 1)} and out1.metrics["agent/episodes"] == 2
    assert [(g.env.env_id, g.origin_step, g.carries, len(g.unfinished)) for g in orch.step_player.carried] == [(ids[1], 1, 1, 2)]
    state = json.loads(json.dumps(orch.state_dict()))
    assert len(state["carried"]) == 1

    out2 = sandbox.run(orch.run_step(Step(2)), timeout=180)
    # the carried group ended first and trains here, whole; this step's own groups are carried
    assert out2.metrics["agent/episodes"] == 2 and out2.metrics["rollout/carried_over"] == 4
    assert set(_groups(out2)) <= {(ids[1], 1)}
    assert sorted((g.env.env_id, g.origin_step) for g in orch.step_player.carried) == sorted((i, 2) for i in ids)
    # the carried group's plays used step 1's seeds: its episodes open as step 1's would have
    resumed = _orchestrator(sandbox, engine, tokenizer, tmp_path / "b", pool)
    resumed.load_state_dict(state)
    out2b = sandbox.run(resumed.run_step(Step(2)), timeout=180)
    assert [(t.env_id, t.index, t.token_ids, t.reward, t.advantage) for t in out2b.agent_samples] == \
        [(t.env_id, t.index, t.token_ids, t.reward, t.advantage) for t in out2.agent_samples]
    assert json.loads(json.dumps(resumed.state_dict())) == json.loads(json.dumps(orch.state_dict()))

    # step 3: the first carried group ends; the other was carried once already: aborted with its plays
    out3 = sandbox.run(orch.run_step(Step(3)), timeout=180)
    assert out3.metrics["rollout/aborted"] == 2 and out3.metrics["rollout/carried_over"] == 4
    assert set(_groups(out3)) <= {(ids[0], 2)} and out3.metrics["agent/episodes"] == 2
    assert [(g.env.env_id, g.origin_step, g.carries) for g in orch.step_player.carried] == [(i, 3, 1) for i in ids]

    # step 4 regenerates: what is carried ends before the new set, nothing is carried out; the new set's
    # own groups are its record, the ending set's train too
    out4 = sandbox.run(orch.run_step(Step(4)), timeout=180)
    assert orch.step_player.carried == [] and out4.metrics["rollout/carried_over"] == 0 and out4.metrics["rollout/aborted"] == 0
    assert out4.metrics["agent/episodes"] == 4 and out4.metrics["agent/hint_episodes"] == 4
    assert set(_groups(out4)) <= {(i, s) for i in ids for s in (3, 4)}
    assert {s for _, s in _groups(out4)} == {3, 4}
    assert all(len(indices) == 2 for indices in _groups(out4).values())  # groups train whole


def test_concurrent_plays_are_each_trained_aborted_or_carried_once(sandbox, engine, tokenizer, tmp_path):
    """Four plays at a time: which plays are stopped mid-episode depends on timing, so this checks what
    must hold whatever the timing: groups train whole, with distinct indices, and every play started
    is trained, aborted or still carried, exactly once."""
    orch = _orchestrator(sandbox, engine, tokenizer, tmp_path / "run", _pool(tmp_path), plays=PlayRules(max_concurrent=4))
    seen: set[tuple[str, int, int]] = set()
    completed = aborted = 0.0
    for n in range(4):
        out = sandbox.run(orch.run_step(Step(n)), timeout=180)
        completed += out.metrics["rollout/completed"]
        aborted += out.metrics["rollout/aborted"]
        for (env_id, origin), indices in _groups(out).items():
            assert indices == [0, 1] and origin <= n
            for i in indices:
                assert (env_id, origin, i) not in seen
                seen.add((env_id, origin, i))
        assert all(0 < len(g.unfinished) <= 2 and g.carries == 1 for g in orch.step_player.carried)
        state = json.loads(json.dumps(orch.state_dict()))  # every carried state is JSON
        assert len(state["carried"]) == len(orch.step_player.carried)
    left = sum(g.size for g in orch.step_player.carried)
    assert completed + aborted + left == 4 * 2 * 2
    # the engine ends the cancelled rows at its next decode step: let it, before the loop stops for good
    from spade.rollout.engine import SamplingParams
    sandbox.run(engine.generate(GenerationRequest((1, 2, 3), SamplingParams(max_new_tokens=1))), timeout=60)


def test_designer_rewards_wait_for_the_carried_plays_of_the_ending_set(sandbox, engine, tokenizer, tmp_path):
    """k 2 with the designer on: step 1 carries one environment's group; regeneration step 2 finishes it
    before the new set is designed, and the released designer rewards see both environments' step-1
    returns (the carried group's counted at step 1, the step it began in)."""
    from test_orchestrator import COIN_SOURCE, EXAMPLE_SOURCE, ScriptedDesigner

    designer = ScriptedDesigner(engine, tokenizer, [EXAMPLE_SOURCE, COIN_SOURCE])
    orch = Orchestrator(_settings(k=2), sandbox=sandbox.service, engine=designer, tokenizer=tokenizer, corpus=None,
                        memory=None, run_dir=tmp_path, seed=1234)
    sandbox.run(orch.run_step(Step(0)), timeout=180)
    ids = [env.env_id for env in orch.envs]
    out1 = sandbox.run(orch.run_step(Step(1)), timeout=180)
    assert out1.metrics["rollout/carried_over"] == 2 and [g.env.env_id for g in orch.step_player.carried] == [ids[1]]
    assert {e.env_id: dict(e.later_returns) for e in orch.buffer.pending}[ids[1]] == {}

    released = []
    release = orch.buffer.release

    def spy(step):  # the entries as the release scores them
        released.extend((e.env_id, dict(e.later_returns)) for e in orch.buffer.pending)
        return release(step)

    orch.buffer.release = spy
    out2 = sandbox.run(orch.run_step(Step(2)), timeout=180)
    assert out2.metrics["designer/released"] == 2 and orch.step_player.carried == []
    assert sorted(env_id for env_id, _ in released) == sorted(ids)
    assert all(list(later) == [1] and len(later[1]) == 2 for _, later in released)
    assert {(t.env_id, t.generated_step) for t in out2.agent_samples} <= {(ids[1], 1)} | {
        (env.env_id, 2) for env in orch.envs}
    assert any(t.env_id == ids[1] and t.generated_step == 1 for t in out2.agent_samples)
