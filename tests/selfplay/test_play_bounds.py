"""The released trainer's time bounds (issue 39): ``selfplay.plays.hint_turn_timeout_s`` (300 s on a
hinted play's reply), ``selfplay.plays.nohint_play_timeout_s`` (300 s on a no-hint play) and
``selfplay.set_generation_timeout_s`` (900 s on a set's designer attempts), each with a tiny bound and
an engine made slow for the calls it should catch; the sandbox, runner, policies, player and designer
round are the real ones."""

from __future__ import annotations

import asyncio

import pytest

from spade.config import ConfigError, from_mapping
from spade.envs.protocol import ErrorKind, Stage
from spade.envs.runner import EndReason
from spade.selfplay.plays.play_rules import PlayRules
from spade.selfplay.settings import SelfPlaySettings
from spade.selfplay.step import Step
from test_orchestrator import COIN_SOURCE, ScriptedDesigner, engine, make  # noqa: F401  (fixtures)
from test_play_rules import SEED_ENV, Replies, _player, _spec, tokenizer  # noqa: F401  (fixture)


class SlowFor(Replies):
    """Answers "ok" at once, or to a prompt holding ``marker`` (and not ``unless``) after ``delay``
    seconds (None: never, the request waits until it is cancelled)."""

    def __init__(self, tokenizer, marker: str, delay: float | None, unless: str | None = None):  # noqa: F811
        super().__init__(tokenizer)
        self.marker, self.delay, self.unless, self.slow_calls = marker, delay, unless, 0

    async def generate(self, request):
        prompt = self.tokenizer.decode(list(request.prompt_ids))
        if self.marker in prompt and (self.unless is None or self.unless not in prompt):
            self.slow_calls += 1
            if self.delay is None:
                await asyncio.Event().wait()
            await asyncio.sleep(self.delay)
        return await super().generate(request)


class SlowDesigner(ScriptedDesigner):
    def __init__(self, *args, delay: float):
        super().__init__(*args)
        self.delay = delay

    async def generate(self, request):
        result = await super().generate(request)
        if self.designer_calls and "I will write a game" in self.tokenizer.decode(list(result.token_ids)):
            await asyncio.sleep(self.delay)
        return result


def test_keys_default_to_no_bound_and_name_themselves():
    settings = SelfPlaySettings()
    assert (settings.plays.hint_turn_timeout_s, settings.plays.nohint_play_timeout_s,
            settings.set_generation_timeout_s) == (None, None, None)
    released = from_mapping(SelfPlaySettings, {"set_generation_timeout_s": 900, "plays": {
        "hint_turn_timeout_s": 300, "nohint_play_timeout_s": 300}}, where="selfplay")
    assert (released.plays.hint_turn_timeout_s, released.plays.nohint_play_timeout_s,
            released.set_generation_timeout_s) == (300, 300, 900)
    for mapping, key in (({"plays": {"hint_turn_timeout_s": 0}}, r"selfplay\.plays\.hint_turn_timeout_s"),
                         ({"plays": {"nohint_play_timeout_s": -1.0}}, r"selfplay\.plays\.nohint_play_timeout_s"),
                         ({"set_generation_timeout_s": 0}, r"selfplay\.set_generation_timeout_s")):
        with pytest.raises(ConfigError, match=key + r": must be a number of seconds > 0 or null"):
            from_mapping(SelfPlaySettings, mapping, where="selfplay")
    with pytest.raises(ConfigError, match=r"selfplay\.plays\.nohint_play_timeout_s: a bound with partial_rollouts"):
        from_mapping(SelfPlaySettings, {"plays": {"nohint_play_timeout_s": 300},
                                        "partial_rollouts": {"enabled": True}}, where="selfplay")


@pytest.mark.parametrize("budgets", ["like_nohint", "released"])
def test_a_slow_hinted_reply_ends_its_play_scored_zero(sandbox, tokenizer, budgets):  # noqa: F811
    engine = SlowFor(tokenizer, "a hint", None)
    bounded = _player(sandbox, engine, tokenizer, hint_turn_timeout_s=0.05, hint_arm_budgets=budgets)
    plays = sandbox.run(bounded.play_all(0, bounded.requests([_spec(SEED_ENV)], with_hint=True)), timeout=60)
    hinted = [p for p in plays if p.hinted]
    assert [(p.episode_return, p.end_reason, p.turns) for p in hinted] == [(0.0, EndReason.POLICY_STOPPED.value, 0)] * 3
    assert [(p.episode_return, p.end_reason) for p in plays if not p.hinted] == [(1.0, "terminated")] * 3
    # unbounded (spade), the same slow replies are waited for and win
    engine = SlowFor(tokenizer, "a hint", 0.1)
    free = _player(sandbox, engine, tokenizer, hint_arm_budgets=budgets)
    plays = sandbox.run(free.play_all(0, free.requests([_spec(SEED_ENV)], with_hint=True)), timeout=60)
    assert [p.episode_return for p in plays if p.hinted] == [1.0] * 3 and engine.slow_calls == 3


def test_a_slow_nohint_play_is_dropped_without_a_retry(sandbox, tokenizer):  # noqa: F811
    engine = SlowFor(tokenizer, "say anything", None, unless="a hint")  # the no-hint replies never come
    player = _player(sandbox, engine, tokenizer, nohint_play_timeout_s=1.0)
    plays = sandbox.run(player.play_all(0, player.requests([_spec(SEED_ENV)], with_hint=True)), timeout=60)
    assert [p for p in plays if not p.hinted] == [] and player.play_timeouts == 3
    assert [p.episode_return for p in plays if p.hinted] == [1.0] * 3  # the bound is the no-hint arm's
    assert engine.slow_calls == 3  # one attempt per no-hint play, none retried
    assert player.fault_drops == 0 and player.hung_envs == set()


def test_a_slow_set_generation_keeps_nothing(sandbox, engine, tokenizer, tmp_path):  # noqa: F811
    designer = SlowDesigner(engine, tokenizer, [COIN_SOURCE], delay=0.5)
    orch = make(sandbox, designer, tokenizer, tmp_path / "bound", None, use_memory=False, set_generation_timeout_s=0.2)
    out = sandbox.run(orch.run_step(Step(0)), timeout=120)
    assert orch.envs == [] and out.metrics["env/admitted"] == 0 and designer.hint_calls == 0
    assert out.metrics["env/rejected"] == 2 and out.metrics[f"env/rejected_{ErrorKind.TIMEOUT.value}"] == 2
    assert out.agent_samples == []
    regen = sandbox.run(orch.source.next_set(4), timeout=120)
    assert {(r.kind, r.stage) for r in regen.rejections} == {(ErrorKind.TIMEOUT, Stage.GENERATE)}
    # a bound the set fits in: designed, admitted, then hinted
    designer = SlowDesigner(engine, tokenizer, [COIN_SOURCE], delay=0.05)
    orch = make(sandbox, designer, tokenizer, tmp_path / "fits", None, use_memory=False, set_generation_timeout_s=60)
    out = sandbox.run(orch.run_step(Step(0)), timeout=120)
    assert out.metrics["env/admitted"] == 2 and designer.hint_calls == 2 and all(env.hint for env in orch.envs)
