"""The self-play step orchestrator end to end: real sandbox, real HFEngine (tiny random Qwen3).

A random tiny model never writes a valid environment, so the designer path is tested twice:
with the real engine (every candidate is rejected, saved with its reason, slots stay empty), and
with :class:`ScriptedDesigner`, a test double for the designer role only, while the agent plays
with the real engine.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from chat_templates import bpe_tokenizer
from spade.config import ConfigError, from_mapping
from spade.designer.memory import Memory
from spade.designer.prompts import DESIGNER_SYSTEM, HINT_SYSTEM, clean_hint
from spade.designer.skills import SkillSettings
from spade.rl.samples import Role
from spade.rollout import HFEngine
from spade.rollout.engine import GenerationRequest, GenerationResult, RolloutEngine
from spade.selfplay.orchestrator import Orchestrator, StepOutput, StepPlays
from spade.selfplay.settings import AdmissionSettings, SamplingSettings, SelfPlaySettings
from spade.selfplay.step import Step
from support.models import tiny_qwen3

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_SOURCE = (ROOT / "examples" / "envs" / "remainder_oracle.py").read_text()
COIN_SOURCE = '''
import random


class CoinEnv:
    def __init__(self, max_turns=3):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.parity = self.rng.randint(0, 1)
        self.turn = 0
        return "Guess the hidden parity: answer with text of the right length parity.", {}

    def step(self, action):
        self.turn += 1
        if len(action) % 2 == self.parity:
            return "right", 1.0, True, False, {}
        return "wrong", 0.0, self.turn >= self.max_turns, False, {}
'''
HINT = "Think about the parity of your answer's length. Use \\boxed{}."


# 16 tokens for the designer, the agent's turns and the hint
TINY_SAMPLING = SamplingSettings().replace(designer={"max_tokens": 16}, agent={"max_tokens": 16}, hint={"max_tokens": 16})


def tiny_settings(**overrides) -> SelfPlaySettings:
    values = dict(envs_per_set=2, k=2, g_nohint=2, g_hint=2, max_attempts=2, sampling=TINY_SAMPLING,
                  max_turns=3, max_context_tokens=8192,
                  skills=SkillSettings(window=1),  # one active skill: both slots share it
                  # CoinEnv pays a constant reply half the time: these tests are not about admission
                  admission=AdmissionSettings(probes=False))
    values.update(overrides)
    return SelfPlaySettings(**values)


@pytest.fixture(scope="module")
def tokenizer():
    return bpe_tokenizer()


@pytest.fixture(scope="module")
def engine(tokenizer):
    """A tiny random Qwen3 whose end-of-turn token is made likely, so agent replies end and vary."""
    model = tiny_qwen3(tokenizer, max_position_embeddings=8192, eos_bias=3.0)
    engine = HFEngine((model, tokenizer), eos_token_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),))
    yield engine
    engine.close()


class ScriptedDesigner(RolloutEngine):
    """TEST DOUBLE, not a real part: it replaces the model's intelligence for the DESIGNER role only.

    Designer calls (recognised by the designer system prompt) get a fixed response wrapping one of
    ``sources`` (in turn, one per call) in a ```python fence; hint calls get ``HINT``. Token ids come
    from the tokenizer, log-probs are -1.0. Every other request (the agent's turns) goes to the real
    engine.
    """

    def __init__(self, real: RolloutEngine, tokenizer, sources: list[str]):
        self.real, self.tokenizer, self.sources = real, tokenizer, sources
        self.designer_calls = self.hint_calls = 0

    @property
    def weight_version(self) -> int:
        return self.real.weight_version

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        prompt = self.tokenizer.decode(list(request.prompt_ids))
        if DESIGNER_SYSTEM[:60] in prompt:
            source = self.sources[self.designer_calls % len(self.sources)]
            self.designer_calls += 1
            text = f"I will write a game.\n```python\n{source}\n```"
        elif HINT_SYSTEM[:60] in prompt:
            self.hint_calls += 1
            text = HINT
        else:
            return await self.real.generate(request)
        ids = self.tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
        return GenerationResult(tuple(ids), tuple([-1.0] * len(ids)), "stop", self.weight_version)

    async def update_weights(self, named_tensors, version):
        await self.real.update_weights(named_tensors, version)

    def close(self) -> None:
        pass


def make(sandbox, engine, tokenizer, run_dir: Path, memory: Memory | None, **overrides) -> Orchestrator:
    return Orchestrator(tiny_settings(**overrides), sandbox=sandbox.service, engine=engine, tokenizer=tokenizer,
                        corpus=None, memory=memory, run_dir=run_dir, seed=1234)


# --------------------------------------------------------------------------- settings


def test_settings_defaults_and_validation():
    s = SelfPlaySettings()
    assert (s.k, s.envs_per_set, s.g_nohint, s.g_hint, s.max_attempts) == (4, 24, 16, 16, 5)
    roles = s.sampling
    assert (roles.designer.temperature, roles.agent.temperature, roles.hint.temperature) == (0.6, 0.6, 0.3)
    assert {(r.top_p, r.top_k) for r in (roles.designer, roles.agent, roles.hint, roles.screen)} == {(0.95, 20)}
    assert (roles.designer.max_tokens, roles.agent.max_tokens, roles.hint.max_tokens) == (16384, 8192, 4096)
    assert (s.max_turns, s.max_context_tokens, s.difficulty, s.memory_capacity) == (25, 32768, "medium", 200)
    loaded = from_mapping(SelfPlaySettings, {"g_nohint": 8, "rewards": {"regret_scale": 0.2},
                                             "skills": {"curriculum": "two_skill"}}, where="selfplay")
    assert loaded.g_nohint == 8 and loaded.rewards.regret_scale == 0.2 and loaded.skills.curriculum == "two_skill"
    with pytest.raises(ConfigError, match="selfplay.g_nohint"):
        from_mapping(SelfPlaySettings, {"g_nohint": 0}, where="selfplay")
    with pytest.raises(ConfigError, match="selfplay.fixed_env_dir"):
        SelfPlaySettings(designer_enabled=False)
    with pytest.raises(ConfigError, match="difficulty"):
        from_mapping(SelfPlaySettings, {"difficulty": "brutal"}, where="selfplay")


# --------------------------------------------------------------------------- real engine designer


def test_real_engine_candidates_are_rejected_and_saved(sandbox, engine, tokenizer, tmp_path):
    memory = Memory(tmp_path / "memory.sqlite")
    orchestrator = make(sandbox, engine, tokenizer, tmp_path, memory)
    out = sandbox.run(orchestrator.run_step(Step(0)), timeout=120)
    m = out.metrics
    assert m["designer/attempts"] == 4 and m["env/rejected"] == 4 and m["env/admitted"] == 0
    assert sum(v for k, v in m.items() if k.startswith("env/rejected_")) == 4
    assert m["env/set_size"] == 0 and m["agent/episodes"] == 0
    assert out.agent_samples == [] and out.designer_samples == [] and orchestrator.envs == []
    saved = sorted((tmp_path / "rejected" / "step_000000").glob("*.json"))
    assert [p.name for p in saved] == ["slot0_attempt0.json", "slot0_attempt1.json",
                                       "slot1_attempt0.json", "slot1_attempt1.json"]
    for path in saved:
        data = json.loads(path.read_text())
        assert set(data["reason"]) == {"kind", "stage", "message"} and data["reason"]["message"]
        assert m[f"env/rejected_{data['reason']['kind']}"] >= 1
        assert isinstance(data["response"], str)
    assert len(memory) == 0
    # A later step of the window plays the (empty) set and releases nothing.
    out1 = sandbox.run(orchestrator.run_step(Step(1)), timeout=60)
    assert out1.metrics["designer/released"] == 0 and "env/admitted" not in out1.metrics
    assert out1.metrics["designer/samples"] == 0 and out1.metrics["agent/samples"] == len(out1.agent_samples)


# --------------------------------------------------------------------------- scripted designer


def _plateau(win, lo=0.4, hi=0.6, ramp=0.25):
    if win < lo:
        return max(0.0, 1 - (lo - win) / ramp)
    if win > hi:
        return max(0.0, 1 - (win - hi) / ramp)
    return 1.0


def _z(values):
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return [0.0] * len(values) if std == 0 else [(v - mean) / (std + 1e-8) for v in values]


def _check_agent_samples(out: StepOutput):
    by_env: dict[str, list] = {}
    for trajectory in out.agent_samples:
        assert trajectory.role is Role.AGENT and trajectory.generated_step == out.step.updates_done
        by_env.setdefault(trajectory.env_id, []).append(trajectory)
    for env_id, trajectories in by_env.items():
        expected = _z([t.reward for t in trajectories])
        for trajectory, z in zip(trajectories, expected):
            assert trajectory.advantage == pytest.approx(z, abs=1e-6)
            sample = trajectory.to_train_sample()
            assert sample.advantages == pytest.approx(z, abs=1e-6)
            assert sample.loss_mask.numel() == sample.token_ids.numel() - 1
            assert sample.num_loss_tokens >= 1
            logp = sample.rollout_logprobs
            assert torch.all(logp[sample.loss_mask == 0] == 0) and torch.all(logp[sample.loss_mask == 1] <= 0)


def _comparable(out: StepOutput):
    def sample(t):
        return (list(t.token_ids), list(t.loss_mask), round(float(t.advantage), 9),
                None if t.rollout_logprobs is None else [round(x, 5) for x in t.rollout_logprobs])

    metrics = {k: round(v, 9) for k, v in out.metrics.items() if not k.startswith("time/")}
    return ([sample(s) for s in out.agent_samples], [sample(s) for s in out.designer_samples], metrics)


def test_scripted_designer_full_cycle_and_resume(sandbox, engine, tokenizer, tmp_path):
    run_a = tmp_path / "a"
    memory_a = Memory(run_a / "memory.sqlite")
    designer = ScriptedDesigner(engine, tokenizer, [EXAMPLE_SOURCE, COIN_SOURCE])
    orch = make(sandbox, designer, tokenizer, run_a, memory_a)

    # Step 0: regeneration, hints, hinted + no-hint plays, memory.
    out0 = sandbox.run(orch.run_step(Step(0)), timeout=120)
    m0 = out0.metrics
    assert m0["env/admitted"] == 2 and m0["env/rejected"] == 0 and m0["designer/attempts"] == 2
    assert designer.designer_calls == 2 and designer.hint_calls == 2
    ids = [env.env_id for env in orch.envs]
    assert ids == ["s000000-e00", "s000000-e01"]
    assert all(env.hint == clean_hint(HINT) for env in orch.envs)
    saved = run_a / "envs" / "step_000000"
    for env_id in ids:
        assert (saved / f"{env_id}.py").exists() and (saved / f"{env_id}.hint.txt").read_text() == clean_hint(HINT)
        assert json.loads((saved / f"{env_id}.json").read_text())["skill"] == orch.envs[0].skill
    assert m0["agent/episodes"] == 4 and m0["agent/hint_episodes"] == 4 and m0["env/set_size"] == 2
    assert out0.designer_samples == [] and m0["designer/released"] == 0 and m0["designer/pending"] == 2
    _check_agent_samples(out0)
    records = {r.env_id: r for r in memory_a.list()}
    assert set(records) == set(ids)
    pending0 = {p.env_id: p for p in orch.buffer.pending}
    for env_id in ids:
        n = list(pending0[env_id].nohint_returns)
        h = list(pending0[env_id].hint_returns)
        assert len(n) == 2 and len(h) == 2
        assert records[env_id].win_rate == sum(r > 0 for r in n) / 2
        assert records[env_id].regret == pytest.approx(sum(h) / 2 - sum(n) / 2)
        assert sorted(n) == sorted(t.reward for t in out0.agent_samples if t.env_id == env_id)

    # The step's returns and its kept episodes are on disk for the analysis.
    lines = [json.loads(line) for line in (run_a / "trajectories" / "step_000000.jsonl").read_text().splitlines()]
    returns = {line["env_id"]: line for line in lines if line["kind"] == "env_returns"}
    assert set(returns) == set(ids)
    for env_id in ids:
        assert sorted(returns[env_id]["nohint_returns"]) == sorted(pending0[env_id].nohint_returns)
        assert sorted(returns[env_id]["hint_returns"]) == sorted(pending0[env_id].hint_returns)
    episodes = [line for line in lines if line["kind"] == "episode"]
    assert sorted((e["env_id"], e["arm"], e["index"]) for e in episodes) == sorted(
        (env_id, arm, i) for env_id in ids for arm in ("nohint", "hint") for i in range(2))
    hinted = [e for e in episodes if e["arm"] == "hint"]
    assert all("HINT:" in e["opening"] for e in hinted) and not any("HINT:" in e["opening"] for e in episodes
                                                                      if e["arm"] == "nohint")
    for e in episodes:  # the returns are listed by play index
        assert e["turns"] and e["return"] == returns[e["env_id"]][f"{e['arm']}_returns"][e["index"]]

    # Step 1: no regeneration, no hints, window returns recorded, nothing released.
    out1 = sandbox.run(orch.run_step(Step(1)), timeout=120)
    assert "env/admitted" not in out1.metrics and "agent/hint_episodes" not in out1.metrics
    assert out1.metrics["agent/episodes"] == 4 and out1.designer_samples == [] and designer.designer_calls == 2
    _check_agent_samples(out1)
    state = json.loads(json.dumps(orch.state_dict()))
    shutil.copy(run_a / "memory.sqlite", tmp_path / "memory_b.sqlite")
    pending1 = {p["env_id"]: p for p in state["designer_buffer"]["pending"]}

    # Step 2 = s + k: released designer samples, advantages by hand.
    out2 = sandbox.run(orch.run_step(Step(2)), timeout=120)
    assert out2.metrics["designer/released"] == 2 and len(out2.designer_samples) == 2
    blends = []
    for env_id in ids:
        entry = pending1[env_id]
        h, n0 = entry["hint_returns"], entry["nohint_returns"]
        (later_step, n1), = entry["later_returns"]
        assert later_step == 1
        assert sorted(n1) == sorted(t.reward for t in out1.agent_samples if t.env_id == env_id)
        regret = sum(h) / len(h) - sum(n0) / len(n0)
        win = sum(n0 + n1) / len(n0 + n1)
        blends.append(0.4 * min(1.0, max(0.0, regret / 0.15)) + 0.6 * _plateau(win))
    # the designer advantage weight: the released global batch 192 / 2 released * k 2 = 192 -> cap 50
    scale = min(50.0, 192 / 2 * 2)
    assert out2.metrics["designer/advantage_scale"] == scale
    mean = sum(blends) / 2  # both environments share the one active skill
    for trajectory, blend in zip(out2.designer_samples, blends):
        assert trajectory.role is Role.DESIGNER and trajectory.generated_step == 0
        assert trajectory.advantage == pytest.approx(scale * (blend - mean), abs=1e-6)
        assert trajectory.reward == pytest.approx(blend)
        # The designer sample is the designer call: prompt (no loss) + scripted response (loss, logp -1).
        sample = trajectory.to_train_sample()
        fields = state["pending_samples"][trajectory.env_id]
        assert sample.token_ids.tolist() == fields["token_ids"] and fields["role"] == "designer"
        generated = sample.rollout_logprobs[sample.loss_mask == 1]
        assert generated.numel() >= 10 and torch.all(generated == -1.0)
        assert tokenizer.decode(sample.token_ids.tolist()).count(DESIGNER_SYSTEM[:60]) == 1
    assert out2.metrics["env/admitted"] == 2 and len(memory_a) == 4  # new set, its memory records
    assert any(abs(t.advantage) > 0.1 for t in out2.designer_samples)  # the seeds give distinct blends
    assert any(abs(t.advantage) > 0.1 for t in out1.agent_samples)  # and a split environment
    _check_agent_samples(out2)

    # Resume from the state after step 1: step 2 is identical.
    memory_b = Memory(tmp_path / "memory_b.sqlite")
    resumed = make(sandbox, ScriptedDesigner(engine, tokenizer, [EXAMPLE_SOURCE, COIN_SOURCE]), tokenizer,
                   tmp_path / "b", memory_b)
    (tmp_path / "b" / "trajectories").mkdir(parents=True)
    (tmp_path / "b" / "trajectories" / "step_000002.jsonl").write_text("{}\n")  # from a run that went on
    resumed.load_state_dict(state)
    assert not (tmp_path / "b" / "trajectories" / "step_000002.jsonl").exists()
    out2b = sandbox.run(resumed.run_step(Step(2)), timeout=120)
    assert _comparable(out2b) == _comparable(out2)
    assert json.loads(json.dumps(resumed.state_dict())) == json.loads(json.dumps(orch.state_dict()))


def test_frozen_designer_and_fixed_pool(sandbox, engine, tokenizer, tmp_path):
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "coin.py").write_text(COIN_SOURCE)
    (pool / "coin.hint.txt").write_text(HINT)
    (pool / "broken.py").write_text("this is not python(")
    orch = make(sandbox, engine, tokenizer, tmp_path / "run", None, designer_enabled=False, fixed_env_dir=str(pool))
    out = sandbox.run(orch.run_step(Step(0)), timeout=120)
    assert out.metrics["env/admitted"] == 1 and out.metrics["env/rejected_syntax_error"] == 1
    assert out.metrics["agent/episodes"] == 2 and out.metrics["agent/hint_episodes"] == 2
    assert len(orch.buffer) == 0 and out.designer_samples == []
    _check_agent_samples(out)


# --------------------------------------------------------------------------- the step's stages


def test_the_step_runs_algorithm_1s_stages_in_order(tokenizer, tmp_path):
    """SPEC 1: regenerate (1), play (2), agent advantages (3), designer rewards released, then this
    set's designs queued (4), memory (6); between regenerations only 2-4 (the release)."""
    orch = Orchestrator(tiny_settings(), sandbox=None, engine=None, tokenizer=tokenizer, corpus=None, memory=None,
                        run_dir=tmp_path, seed=1)
    calls: list[tuple[str, int]] = []

    def record(name, result=None):
        async def stage_async(step, *args, **kwargs):
            calls.append((name, step.updates_done))
            return result

        def stage(*args, **kwargs):
            step = args[0] if isinstance(args[0], Step) else args[0].step
            calls.append((name, step.updates_done))

        return stage_async if name in ("regenerate_and_admit", "play") else stage

    orch.regenerate_and_admit = record("regenerate_and_admit", {})
    orch.play = record("play", StepPlays({}, {}))
    for name in ("score_agent_plays", "release_designer_rewards", "enqueue_designs", "update_memory"):
        setattr(orch, name, record(name))
    outs = [asyncio.run(orch.run_step(Step(n))) for n in range(3)]  # k = 2: sets at steps 0 and 2
    stages = ["regenerate_and_admit", "play", "score_agent_plays", "release_designer_rewards", "enqueue_designs",
              "update_memory"]
    between = ["play", "score_agent_plays", "release_designer_rewards"]
    assert calls == [(name, 0) for name in stages] + [(name, 1) for name in between] + [(name, 2) for name in stages]
    for out in outs:  # the counts every step carries, set once by the orchestrator
        assert out.metrics["agent/samples"] == 0 and out.metrics["designer/samples"] == 0
        assert out.metrics["designer/pending"] == 0
    assert orch.last_step == 2
