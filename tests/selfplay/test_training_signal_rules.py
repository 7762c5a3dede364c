"""Issue 39, training signal: the released code's batch rules (``selfplay.batch``: plays per
environment from the global batch, designer samples first and the cut to the global batch, the
release of every waiting design at the last step; with ``rewards.advantage_agent_samples: null``
the designer weight from the step's real counts) and its failed hints (``selfplay.hint_attempts``,
``selfplay.rewards.failed_hint``). Each against hand-computed values; the defaults unchanged.
Real sandbox, real tiny engine for the agent, the scripted designer of test_orchestrator."""

from __future__ import annotations

import json

import pytest

from spade.config import ConfigError, from_mapping
from spade.designer.prompts import HINT_SYSTEM
from spade.rl.samples import Role
from spade.rollout.engine import GenerationRequest, GenerationResult
from spade.selfplay.batch_rules import BatchRules
from spade.selfplay.orchestrator import Orchestrator
from spade.selfplay.rewards.reward_settings import RewardSettings
from spade.selfplay.settings import SelfPlaySettings
from spade.selfplay.step import Step
from test_orchestrator import TINY_SAMPLING, COIN_SOURCE, EXAMPLE_SOURCE, ScriptedDesigner, _plateau, engine, tiny_settings, tokenizer  # noqa: F401

RELEASED_BATCH = BatchRules(global_batch=5, nohint_plays="global_batch", cut_to_global_batch=True,
                            release_at_final_step=True)


def _orchestrator(sandbox, designer, tokenizer, run_dir, *, final_step=None, **overrides) -> Orchestrator:
    return Orchestrator(tiny_settings(**overrides), sandbox=sandbox.service, engine=designer, tokenizer=tokenizer,
                        corpus=None, memory=None, run_dir=run_dir, seed=1234, final_step=final_step)


def test_keys_defaults_and_validation():
    s = SelfPlaySettings()
    assert s.batch == BatchRules() and s.hint_attempts == 1 and s.rewards.failed_hint == "drop"
    assert s.nohint_plays(24) == s.nohint_plays(20) == 16  # g_nohint, whatever the set
    released = BatchRules(nohint_plays="global_batch")
    assert [released.plays_per_env(16, n) for n in (24, 20, 1)] == [8, 10, 192]  # ceil(192 / n)
    assert BatchRules().assemble("ab", "D") == ["a", "b", "D"]
    assert BatchRules(global_batch=2, cut_to_global_batch=True).assemble("abc", "D") == ["D", "a"]
    with pytest.raises(ConfigError, match=r"selfplay\.batch\.nohint_plays.*g_nohint, global_batch"):
        from_mapping(SelfPlaySettings, {"batch": {"nohint_plays": "ceil"}}, where="selfplay")
    with pytest.raises(ConfigError, match=r"selfplay\.hint_attempts"):
        from_mapping(SelfPlaySettings, {"hint_attempts": 0}, where="selfplay")
    with pytest.raises(ConfigError, match=r"failed_hint.*drop, hint_return_zero"):
        from_mapping(RewardSettings, {"failed_hint": "zero"}, where="selfplay.rewards")


def test_spade_default_batch(sandbox, engine, tokenizer, tmp_path):
    """Defaults: g_nohint plays per environment, agents first, nothing cut, nothing flushed."""
    designer = ScriptedDesigner(engine, tokenizer, [EXAMPLE_SOURCE, COIN_SOURCE])
    orch = _orchestrator(sandbox, designer, tokenizer, tmp_path, final_step=1)
    sandbox.run(orch.run_step(Step(0)), timeout=120)
    out = sandbox.run(orch.run_step(Step(1)), timeout=120)
    assert out.metrics["agent/episodes"] == 4 and out.designer_samples == [] and len(orch.buffer) == 2


def test_released_batch_rules(sandbox, engine, tokenizer, tmp_path):
    designer = ScriptedDesigner(engine, tokenizer, [EXAMPLE_SOURCE, COIN_SOURCE])
    orch = _orchestrator(sandbox, designer, tokenizer, tmp_path, final_step=1, batch=RELEASED_BATCH,
                         rewards=RewardSettings(advantage_agent_samples=None))
    out0 = sandbox.run(orch.run_step(Step(0)), timeout=120)
    assert out0.metrics["agent/episodes"] == 6  # ceil(5 / 2) = 3 plays of each of the 2 environments
    assert len(out0.samples) == 5 and out0.metrics["agent/samples"] == 5  # 6 agent samples cut to 5
    assert [t.env_id for t in out0.samples].count(orch.envs[1].env_id) == 2  # the tail is what goes
    pending = {p.env_id: p for p in orch.buffer.pending}
    agents_before_cut = 6

    out1 = sandbox.run(orch.run_step(Step(1)), timeout=120)  # the last step: set 0 released now (k = 2)
    assert out1.metrics["designer/released"] == 2 and len(orch.buffer) == 0
    assert [t.role for t in out1.samples] == [Role.DESIGNER] * 2 + [Role.AGENT] * 3  # designers first, cut to 5
    # the weight from the step's real counts: min(50, 6 agent samples / 2 designer samples * k 2) = 6
    assert out1.metrics["designer/advantage_scale"] == pytest.approx(min(50.0, agents_before_cut / 2 * 2))
    blends = []
    for env in orch.envs:
        entry = pending[env.env_id]
        later = logged_nohint_returns(tmp_path, 1)[env.env_id]  # every play, the cut ones too
        h, n0 = list(entry.hint_returns), list(entry.nohint_returns)
        regret = sum(h) / len(h) - sum(n0) / len(n0)
        blends.append(0.4 * min(1.0, max(0.0, regret / 0.15)) + 0.6 * _plateau(sum(n0 + later) / len(n0 + later)))
    mean = sum(blends) / 2
    for trajectory, blend in zip(out1.designer_samples, blends):
        assert trajectory.reward == pytest.approx(blend)
        assert trajectory.advantage == pytest.approx(6 * (blend - mean), abs=1e-6)


def logged_nohint_returns(run_dir, step: int) -> dict[str, list[float]]:
    """The step's no-hint returns per environment, as the trajectory log keeps them (before any cut)."""
    lines = [json.loads(line) for line in (run_dir / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()]
    return {line["env_id"]: line["nohint_returns"] for line in lines if line["kind"] == "env_returns"}


class FlakyHints(ScriptedDesigner):
    """The scripted designer whose first ``fail`` hint calls reply with nothing."""

    def __init__(self, real, tokenizer, sources, fail: int):
        super().__init__(real, tokenizer, sources)
        self.fail = fail

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if HINT_SYSTEM[:60] in self.tokenizer.decode(list(request.prompt_ids)) and self.fail > 0:
            self.fail -= 1
            self.hint_calls += 1
            end = self.tokenizer("<|im_end|>", add_special_tokens=False)["input_ids"]
            return GenerationResult(tuple(end), (-1.0,) * len(end), "stop", self.weight_version)
        return await super().generate(request)


def test_hint_attempts(sandbox, engine, tokenizer, tmp_path):
    """One call (spade): an empty reply leaves the environment hintless; three (released): retried."""
    one = FlakyHints(engine, tokenizer, [COIN_SOURCE], fail=1)
    orch = _orchestrator(sandbox, one, tokenizer, tmp_path / "one", envs_per_set=1)
    sandbox.run(orch.regenerate_and_admit(Step(0), _Out()), timeout=120)
    assert one.hint_calls == 1 and orch.envs[0].hint == ""
    three = FlakyHints(engine, tokenizer, [COIN_SOURCE], fail=2)
    orch = _orchestrator(sandbox, three, tokenizer, tmp_path / "three", envs_per_set=1, hint_attempts=3)
    sandbox.run(orch.regenerate_and_admit(Step(0), _Out()), timeout=120)
    assert three.hint_calls == 3 and orch.envs[0].hint != ""


class _Out:
    metrics: dict = {}


@pytest.mark.parametrize("failed_hint", ["drop", "hint_return_zero"])
def test_failed_hint(sandbox, engine, tokenizer, tmp_path, failed_hint):
    """Every hint call fails: ``drop`` (spade) trains no designer sample for the environment;
    ``hint_return_zero`` (released) keeps it, regret = 0 - mean no-hint return (floored to 0 by the
    blend: the returns here are >= 0), so its reward is the plateau term alone."""
    designer = FlakyHints(engine, tokenizer, [EXAMPLE_SOURCE, COIN_SOURCE], fail=2)
    orch = _orchestrator(sandbox, designer, tokenizer, tmp_path, rewards=RewardSettings(failed_hint=failed_hint))
    out0 = sandbox.run(orch.run_step(Step(0)), timeout=120)
    assert all(env.hint == "" for env in orch.envs) and "agent/hint_return_mean" not in out0.metrics
    if failed_hint == "drop":
        assert len(orch.buffer) == 0
        sandbox.run(orch.run_step(Step(1)), timeout=120)
        out2 = sandbox.run(orch.run_step(Step(2)), timeout=120)
        assert out2.designer_samples == []
        return
    assert len(orch.buffer) == 2 and all(p.hint_returns == () for p in orch.buffer.pending)
    out1 = sandbox.run(orch.run_step(Step(1)), timeout=120)
    pending = {p.env_id: p for p in orch.buffer.pending}
    out2 = sandbox.run(orch.run_step(Step(2)), timeout=120)
    assert len(out2.designer_samples) == 2
    for trajectory in out2.designer_samples:
        entry = pending[trajectory.env_id]
        window = list(entry.nohint_returns) + [t.reward for t in out1.agent_samples if t.env_id == trajectory.env_id]
        assert trajectory.reward == pytest.approx(0.6 * _plateau(sum(window) / len(window)))
    assert out2.metrics["designer/regret_mean"] == pytest.approx(
        sum(-sum(p.nohint_returns) / len(p.nohint_returns) for p in pending.values()) / 2)


class RecordingHintSampling(ScriptedDesigner):
    """The scripted designer that keeps the sampling settings each hint call reached the engine with."""

    def __init__(self, real, tokenizer, sources):
        super().__init__(real, tokenizer, sources)
        self.hint_sampling: list = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if HINT_SYSTEM[:60] in self.tokenizer.decode(list(request.prompt_ids)):
            self.hint_sampling.append((request.sampling.top_p, request.sampling.top_k))
        return await super().generate(request)


@pytest.mark.parametrize("hint, expected", [({}, (0.95, 20)), ({"top_p": 0.9, "top_k": None}, (0.9, None))])
def test_hint_sampling(sandbox, engine, tokenizer, tmp_path, hint, expected):
    """The hint call samples with its own record's top-p / top-k: spade's default is every role's
    0.95 / 20; the reproduction recipes give it top-p 0.9 and no top-k, what the released hint call
    got from its adapter."""
    designer = RecordingHintSampling(engine, tokenizer, [COIN_SOURCE])
    orch = _orchestrator(sandbox, designer, tokenizer, tmp_path, envs_per_set=1, sampling=TINY_SAMPLING.replace(hint=hint))
    sandbox.run(orch.regenerate_and_admit(Step(0), _Out()), timeout=120)
    assert designer.hint_sampling == [expected]
