"""Training log-probs at the temperature each sample was drawn with (issue 20).

The engine returns log-probs of ``softmax(logits / T)`` with ``T`` the role's sampling temperature;
the trainer must compute old, new and reference log-probs at the same ``T``, or every truncated
importance weight and the KL term are biased. The references here are independent: a hand
``log_softmax(logits / T)`` of the transformers model's logits, and the engine's own log-probs of
samples drawn through the real agent (``Player``) and designer (``LocalGenerator``) paths from the
very weights the Megatron model holds (fp32, CPU).
"""

from __future__ import annotations

import asyncio
import json
from typing import Optional

import pytest
import torch

from chat_templates import bpe_tokenizer
from megatron_fixtures import megatron_world  # noqa: F401  (fixture)
from spade.config import ConfigError
from spade.envs.protocol import ResetResult, StepResult
from spade.models import ParallelLayout, read_model_spec
from spade.models.builder import BuildOptions
from spade.rl.logprobs import logprobs_from_logits, token_logprobs
from spade.rl.loss import policy_loss
from spade.rl.samples import Role, TrainSample, Trajectory
from spade.rollout import HFEngine
from spade.rollout.conversation import ChatFormat
from spade.selfplay.sources.text_generators import LocalGenerator, TextSampling
from spade.selfplay.sources.designer_source import EnvSpec
from spade.selfplay.plays.player import Player, PlayRequest
from spade.selfplay.trajectories import role_logprob_temperature
from spade.selfplay.settings import SamplingSettings, SelfPlaySettings
from spade.train_config import from_dict
from spade.training import (LossSettings, build_model, compute_logprobs, forward_backward, init_parallel,
                            make_micro_batches)
from spade.training.forward_logprobs import batch_temperature
from test_models_parity import checkpoint_state

FP32 = BuildOptions(params_dtype=torch.float32)


# ------------------------------------------------------------------ per-token temperatures, unit level


def test_per_row_temperatures_give_each_row_its_own_distribution():
    """One call, rows at T 0.6, 1.0 and 1.7: each row equals log_softmax(logits / its T)."""
    gen = torch.Generator().manual_seed(0)
    seq, batch, hidden_size, vocab = 7, 3, 8, 23
    hidden = torch.randn(seq, batch, hidden_size, generator=gen)
    weight = torch.randn(vocab, hidden_size, generator=gen)
    targets = torch.randint(0, vocab, (batch, seq), generator=gen)
    temps = torch.tensor([0.6, 1.0, 1.7])
    got = token_logprobs(hidden, weight, targets, chunk_size=4, temperature=temps.unsqueeze(1))
    logits = (hidden @ weight.t()).transpose(0, 1)  # [B, T, V]
    for row, t in enumerate(temps.tolist()):
        expected = torch.log_softmax(logits[row] / t, dim=-1).gather(1, targets[row].unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(got[row], expected, atol=1e-5, rtol=0)
    # per token ([B, T]) is the same as per row when the rows are constant
    per_token = temps.unsqueeze(1).expand(batch, seq).contiguous()
    torch.testing.assert_close(token_logprobs(hidden, weight, targets, chunk_size=3, temperature=per_token), got)


def test_per_token_temperature_gradients():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, 2, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(9, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 9, (2, 5), generator=gen)
    temps = torch.rand(2, 5, generator=gen, dtype=torch.float64) + 0.3
    assert torch.autograd.gradcheck(lambda a, b: token_logprobs(a, b, targets, chunk_size=3, temperature=temps),
                                    (hidden, weight))


def test_bad_temperatures_are_refused():
    hidden, weight, targets = torch.randn(3, 2, 4), torch.randn(5, 4), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="> 0"):
        token_logprobs(hidden, weight, targets, temperature=torch.tensor([[0.6], [0.0]]))
    with pytest.raises(ValueError, match="broadcast"):
        token_logprobs(hidden, weight, targets, temperature=torch.ones(3, 3))


def test_micro_batches_carry_each_samples_temperature():
    samples = [TrainSample([1, 2, 3, 4], [0, 1, 1], 1.0, temperature=0.6),
               TrainSample([5, 6], [1], -1.0, temperature=1.0)]
    (padded,) = make_micro_batches(samples, 1000, packed=False)
    rows = {index: row for row, index in enumerate(padded.sample_indices)}
    assert padded.temperatures.shape == padded.targets.shape
    assert torch.all(padded.temperatures[rows[0]] == 0.6) and torch.all(padded.temperatures[rows[1]] == 1.0)
    assert isinstance(batch_temperature(padded), torch.Tensor)
    (same,) = make_micro_batches([samples[0], TrainSample([7, 8, 9], [1, 1], 0.5, temperature=0.6)], 1000,
                                 packed=False)
    assert batch_temperature(same) == pytest.approx(0.6)  # one value: the scalar path
    (packed,) = make_micro_batches(samples, 1000, packed=True)
    for row, index in enumerate(packed.sample_indices):
        slots = packed.unpack_index[row, : samples[index].num_targets]
        assert torch.all(packed.temperatures[0, slots] == samples[index].temperature)


# ------------------------------------------------------------------ the Megatron model, mixed temperatures


def _tiny_pair(vocab_size: int, seed: int = 0):
    from support.models import tiny_qwen3

    hf_model = tiny_qwen3(vocab_size, seed=seed, randomize=True, max_position_embeddings=1024, rope_theta=1e6)
    spec = read_model_spec(hf_model.config)
    init_parallel(ParallelLayout(), seed=1234)
    model = build_model(spec, ParallelLayout(), options=FP32, hf_state=checkpoint_state(hf_model, spec))
    return hf_model, model


@pytest.mark.usefixtures("megatron_world")
def test_trainer_logprobs_of_a_mixed_micro_batch_follow_each_samples_temperature():
    hf_model, model = _tiny_pair(200)
    gen = torch.Generator().manual_seed(3)
    temps = (0.6, 1.0, 0.3)
    samples = [TrainSample(torch.randint(0, 200, (n,), generator=gen), [1] * (n - 1), 1.0, temperature=t)
               for n, t in zip((9, 6, 11), temps)]
    (batch,) = make_micro_batches(samples, 10_000, packed=False)
    for sample, values in zip(samples, compute_logprobs(model.chunks, [batch], chunk_size=4)):
        with torch.no_grad():
            logits = hf_model(sample.token_ids.unsqueeze(0)).logits[0, :-1]
        expected = logprobs_from_logits(logits / sample.temperature, sample.token_ids[1:])
        torch.testing.assert_close(values, expected, atol=1e-4, rtol=0)


# ------------------------------------------------------------------ engine and trainer share the weights


class _GuessEnv:
    """In-process two-turn environment (no sandbox needed for the log-prob question)."""

    class_name = "GuessEnv"

    def __init__(self, max_turns: Optional[int]):
        self.max_turns = max_turns
        self.turn = 0

    async def reset(self, seed: Optional[int] = None) -> ResetResult:
        return ResetResult("say something short")

    async def step(self, action: str) -> StepResult:
        self.turn += 1
        done = self.turn >= 2
        return StepResult("again" if not done else "done", 1.0 if done else 0.0, done, False)

    async def close(self) -> None:
        pass


class _InProcessSandbox:
    async def open(self, source: str, *, max_turns: Optional[int] = None) -> _GuessEnv:
        return _GuessEnv(max_turns)


@pytest.fixture(scope="module")
def shared_weights(megatron_world):  # noqa: F811
    tokenizer = bpe_tokenizer()
    hf_model, model = _tiny_pair(len(tokenizer), seed=2)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    engine = HFEngine((hf_model, tokenizer), eos_token_ids=(eos,))
    yield tokenizer, engine, model, eos
    engine.close()


def _settings(temperature: float) -> SelfPlaySettings:
    sampling = SamplingSettings().replace(designer=dict(max_tokens=14, temperature=temperature), hint=dict(max_tokens=8),
                                          agent=dict(max_tokens=10, temperature=temperature))
    return SelfPlaySettings(envs_per_set=2, k=2, g_nohint=1, g_hint=1, max_attempts=1, max_turns=2,
                            max_context_tokens=4096, sampling=sampling)


def _agent_trajectory(settings, tokenizer, engine, eos) -> Trajectory:
    player = Player(settings, sandbox=_InProcessSandbox(), engine=engine, tokenizer=tokenizer,
                    chat_format=ChatFormat(tokenizer), seed=7, stop_token_ids=(eos,))
    env = EnvSpec(env_id="e0", slot=0, skill="s", source="", hint="", class_name="GuessEnv", max_turns=2,
                  generated_step=0)
    (play,) = asyncio.run(player.play_all(0, [PlayRequest(env, False, 0)]))
    return play.trajectory.replace(role=Role.AGENT, env_id="e0", advantage=1.0)


def _designer_trajectory(settings, tokenizer, engine, eos) -> Trajectory:
    generator = LocalGenerator(engine, tokenizer, ChatFormat(tokenizer), max_context_tokens=4096,
                               stop_token_ids=(eos,))
    designer = settings.sampling.designer
    sampling = TextSampling(temperature=designer.temperature, top_p=designer.top_p, top_k=designer.top_k,
                            max_tokens=designer.max_tokens, timeout_s=120.0, seed=11)
    messages = [{"role": "system", "content": "You design games."}, {"role": "user", "content": "Write one."}]
    generated = asyncio.run(generator.generate(messages, sampling))
    return generated.trajectory.replace(role=Role.DESIGNER, env_id="e1", advantage=-1.0)


@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_engine_and_trainer_agree_on_agent_and_designer_samples(shared_weights, temperature):
    """Same weights in the hf engine and the Megatron model: the trainer's log-probs of an agent
    and a designer sample equal the engine's, so TIS weights are 1, none is clipped, and the
    logged behaviour-to-training gap and KL are ~0."""
    tokenizer, engine, model, eos = shared_weights
    settings = _settings(temperature)
    trajectories = [_agent_trajectory(settings, tokenizer, engine, eos),
                    _designer_trajectory(settings, tokenizer, engine, eos)]
    for trajectory in trajectories:
        assert trajectory.logprob_temperature == temperature
        assert trajectory.logprob_temperature == role_logprob_temperature(settings, trajectory.role)
        assert trajectory.trainable and trajectory.rollout_logprobs is not None
    samples = [t.to_train_sample() for t in trajectories]
    batches = make_micro_batches(samples, 10_000, packed=False)
    for sample, trained in zip(samples, compute_logprobs(model.chunks, batches, chunk_size=16)):
        mask = sample.loss_mask.bool()
        gap = (trained[mask] - sample.rollout_logprobs[mask]).abs()
        assert float(gap.max()) < 1e-4, float(gap.max())
    summary = forward_backward(model.chunks, batches, LossSettings())
    assert summary.tis_weight_mean == pytest.approx(1.0, abs=1e-4)
    assert summary.tis_clip_frac == 0.0
    assert summary.rollout_logprob_abs_diff < 1e-4
    assert 0.0 <= summary.rollout_kl < 1e-7


# ------------------------------------------------------------------ the new metrics, by hand


def test_rollout_gap_metrics_match_hand_values():
    logp = torch.tensor([[-1.0, -2.0, -0.5]])
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    rollout = torch.tensor([[-1.5, -1.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, metrics = policy_loss(logp, old, torch.tensor([1.0]), mask, rollout_logprobs=rollout)
    d = [0.5, -1.0]  # old - rollout on the two loss tokens
    assert metrics.rollout_logprob_abs_diff == pytest.approx((0.5 + 1.0) / 2)
    k3 = [torch.exp(torch.tensor(x)).item() - x - 1.0 for x in d]
    assert metrics.rollout_kl == pytest.approx(sum(k3) / 2)
    _, none = policy_loss(logp, old, torch.tensor([1.0]), mask)
    assert none.rollout_logprob_abs_diff == 0.0 and none.rollout_kl == 0.0


# ------------------------------------------------------------------ config and old records


def test_loss_temperature_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match=r"loss\.temperature: removed.*temperature each sample was drawn with"):
        from_dict({"loss": {"temperature": 1.0}})
    assert "temperature" not in {f for f in LossSettings.__dataclass_fields__}


def test_old_records_without_the_field_take_the_roles_temperature():
    settings = SelfPlaySettings(sampling=SamplingSettings().replace(designer=dict(temperature=0.6),
                                                                    agent=dict(temperature=0.7)))
    record = Trajectory(token_ids=(1, 2, 3), loss_mask=(0, 1), rollout_logprobs=(0.0, -0.4), role=Role.DESIGNER,
                        advantage=0.5, logprob_temperature=0.6).to_json()
    del record["logprob_temperature"]  # as written before the field existed
    old = json.loads(json.dumps(record))
    with pytest.raises(ValueError, match="logprob_temperature"):
        Trajectory.from_json(old).to_train_sample()  # never silently trained at T = 1
    loaded = Trajectory.from_json(old, default_logprob_temperature=role_logprob_temperature(settings, Role.DESIGNER))
    assert loaded.to_train_sample().temperature == 0.6
    assert role_logprob_temperature(settings, Role.AGENT) == 0.7
    assert role_logprob_temperature(SelfPlaySettings(sampling=SamplingSettings().replace(agent=dict(temperature=0.0))),
                                    Role.AGENT) == 1.0  # greedy
    # a record that has the field keeps it, whatever the default
    kept = Trajectory.from_json({**old, "logprob_temperature": 0.9}, default_logprob_temperature=0.6)
    assert kept.logprob_temperature == 0.9


# ------------------------------------------------------------------ SGLang: the default log-probs, never the T = 1 ones


def test_sglang_servers_never_return_temperature_one_logprobs():
    from spade.rollout.sglang.deployment import server_environment
    from spade.rollout.sglang.settings import SGLangSection

    for value in ("1", "true", "True"):
        with pytest.raises(ConfigError, match=r"engine\.sglang\.server_env.*SGLANG_RETURN_ORIGINAL_LOGPROB"):
            SGLangSection(server_env={"SGLANG_RETURN_ORIGINAL_LOGPROB": value})
    # inherited from the trainer's environment: switched off for the servers
    env = server_environment(SGLangSection(), base={"SGLANG_RETURN_ORIGINAL_LOGPROB": "1", "PATH": "/usr/bin"})
    assert env["SGLANG_RETURN_ORIGINAL_LOGPROB"] == "0" and env["PATH"] == "/usr/bin"
