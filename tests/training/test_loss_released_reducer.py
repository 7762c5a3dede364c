"""Issue 39, training signal: the released code's loss reducer (``loss.aggregation: sample_mean``)
and its log-prob temperature (``loss.logprob_temperature``), each against hand-computed values,
with spade's defaults (``token_mean``, ``sampling``) unchanged."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from megatron_fixtures import megatron_world  # noqa: F401  (fixture)
from spade.config import ConfigError, from_mapping
from spade.rl.loss import policy_loss
from spade.rl.samples import TrainSample
from spade.training import LossSettings, make_micro_batches
from spade.training.train_step import forward_backward
from test_training import hf_logprobs, main_grads, megatron_model, random_samples

D = torch.float64


def test_sample_mean_is_the_sum_of_sample_means_over_every_sample():
    # three sequences; the third has no loss token. pg = -A * ratio with ratio 1 (logp == old).
    logp = torch.zeros(3, 2, dtype=D)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]], dtype=D)
    adv = torch.tensor([[1.0, 3.0], [2.0, 9.0], [5.0, 5.0]], dtype=D)  # per token
    # sequence token means of -A: -2 and -2; the empty one adds 0 and counts 1
    loss, metrics = policy_loss(logp, logp.clone(), adv, mask, aggregation="sample_mean")
    assert float(loss) == pytest.approx((-2.0 - 2.0 + 0.0) / 3)
    seq, _ = policy_loss(logp, logp.clone(), adv, mask, aggregation="seq_mean_token_mean")
    assert float(seq) == pytest.approx((-2.0 - 2.0) / 2)  # the empty sequence does not count
    tok, _ = policy_loss(logp, logp.clone(), adv, mask)  # spade's default: token_mean
    assert float(tok) == pytest.approx(-(1 + 3 + 2) / 3)
    assert metrics.num_tokens == 3.0


def test_loss_settings_keys_and_defaults():
    default = LossSettings()
    assert default.aggregation == "token_mean" and default.logprob_temperature == "sampling"
    released = from_mapping(LossSettings, {"aggregation": "sample_mean", "logprob_temperature": 1.0}, where="loss")
    assert released.aggregation == "sample_mean" and released.logprob_temperature == 1.0
    with pytest.raises(ConfigError, match=r"loss\.aggregation.*token_mean, seq_mean_token_mean, sample_mean"):
        from_mapping(LossSettings, {"aggregation": "sum"}, where="loss")
    with pytest.raises(ConfigError, match=r"logprob_temperature.*sampling"):
        from_mapping(LossSettings, {"logprob_temperature": "rollout"}, where="loss")
    with pytest.raises(ConfigError, match=r"logprob_temperature.*sampling.*number > 0"):
        from_mapping(LossSettings, {"logprob_temperature": 0.0}, where="loss")


def _with_empty_sample(samples: list[TrainSample], index: int) -> list[TrainSample]:
    empty = dataclasses.replace(samples[index], loss_mask=torch.zeros_like(samples[index].loss_mask))
    return samples[:index] + [empty] + samples[index + 1:]


@pytest.mark.usefixtures("megatron_world")
def test_sample_mean_divides_by_the_step_sample_count_across_micro_batches():
    """The step's loss and gradients under ``sample_mean`` are one ``policy_loss`` call on the
    whole batch, a sample without loss tokens counted in the denominator, however the batch is
    split (here one micro-batch holds only that sample)."""
    hf_model, _, model = megatron_model("llama-tied")
    samples = _with_empty_sample(random_samples([9, 4, 13, 7, 10], seed=3, logprobs=True), 2)
    settings = LossSettings(aggregation="sample_mean")
    whole = make_micro_batches(samples, 10_000, packed=False)
    split = make_micro_batches(samples, 14, packed=False)
    assert len(whole) == 1 and len(split) >= 4
    assert any(mb.num_loss_tokens == 0 and mb.sample_indices for mb in split)
    one = forward_backward(model.chunks, whole, settings)
    grads_one = main_grads(model)
    many = forward_backward(model.chunks, split, settings)
    grads_many = main_grads(model)

    width = max(s.num_targets for s in samples)

    def stack(values):
        out = torch.zeros(len(samples), width)
        for row, v in enumerate(values):
            out[row, : v.numel()] = v
        return out

    expected, _ = policy_loss(
        stack([hf_logprobs(hf_model, s) for s in samples]), stack([s.old_logprobs for s in samples]),
        torch.tensor([s.advantages for s in samples]), stack([s.loss_mask for s in samples]),
        rollout_logprobs=stack([s.rollout_logprobs for s in samples]), aggregation="sample_mean")
    assert one.loss == pytest.approx(float(expected), abs=1e-5)
    assert many.loss == pytest.approx(one.loss, abs=1e-6)
    for key, grad in grads_one.items():
        torch.testing.assert_close(grads_many[key], grad, atol=1e-6, rtol=1e-5, msg=key)
    # the same samples under seq_mean_token_mean divide by 4, not 5
    seq = forward_backward(model.chunks, whole, LossSettings(aggregation="seq_mean_token_mean"))
    assert seq.loss == pytest.approx(one.loss * 5 / 4, rel=1e-5)


@pytest.mark.usefixtures("megatron_world")
def test_logprob_temperature_one_compares_the_t1_policy_with_the_sampler():
    """``sampling`` (default): the trainer's log-probs at each sample's own temperature (0.6 here);
    ``1.0`` (released): at T=1 for every sample, so with rollout log-probs taken at T=0.6 from the
    same weights the TIS weights are no longer 1."""
    from spade.training.learner import at_logprob_temperature

    hf_model, _, model = megatron_model("llama-tied")
    drawn = [dataclasses.replace(s, temperature=0.6, old_logprobs=None, ref_logprobs=None)
             for s in random_samples([9, 6, 11], seed=7)]
    # the engine's log-probs of the drawn tokens: the same weights at the sampling temperature
    drawn = [dataclasses.replace(s, rollout_logprobs=hf_logprobs(hf_model, s)) for s in drawn]
    assert at_logprob_temperature(drawn, "sampling") is drawn
    released = at_logprob_temperature(drawn, 1.0)
    assert [s.temperature for s in released] == [1.0, 1.0, 1.0]
    assert [s.temperature for s in drawn] == [0.6, 0.6, 0.6]  # the records are not changed

    batches = lambda samples: make_micro_batches(samples, 10_000, packed=False)  # noqa: E731
    same = forward_backward(model.chunks, batches(drawn), LossSettings())
    assert same.tis_weight_mean == pytest.approx(1.0, abs=1e-5) and same.rollout_kl == pytest.approx(0.0, abs=1e-6)
    moved = forward_backward(model.chunks, batches(released), LossSettings(logprob_temperature=1.0))
    # hand reference: mean over loss tokens of min(exp(logp_T1 - logp_T0.6), 2)
    weights, tokens = 0.0, 0.0
    for s in drawn:
        t1 = hf_logprobs(hf_model, dataclasses.replace(s, temperature=1.0))
        mask = s.loss_mask.to(torch.float64)
        w = torch.clamp(torch.exp(t1.double() - s.rollout_logprobs.double()), max=2.0)
        weights += float((w * mask).sum())
        tokens += float(mask.sum())
    assert moved.tis_weight_mean == pytest.approx(weights / tokens, abs=1e-5)
    assert abs(moved.tis_weight_mean - 1.0) > 1e-3


# ------------------------------------------- loss.sample_mean_denominator: the released short batch


def test_sample_mean_denominator_setting():
    assert LossSettings().sample_mean_denominator == "samples"
    fixed = from_mapping(LossSettings, {"aggregation": "sample_mean", "sample_mean_denominator": 192}, where="loss")
    assert fixed.sample_mean_denominator == 192
    with pytest.raises(ConfigError, match=r"loss\.sample_mean_denominator: 'all' is not allowed; choose one of: samples"):
        from_mapping(LossSettings, {"aggregation": "sample_mean", "sample_mean_denominator": "all"}, where="loss")
    with pytest.raises(ConfigError, match=r"loss\.sample_mean_denominator.*integer >= 1"):
        from_mapping(LossSettings, {"aggregation": "sample_mean", "sample_mean_denominator": 0}, where="loss")
    with pytest.raises(ConfigError, match=r"loss\.sample_mean_denominator: a number needs aggregation sample_mean"):
        from_mapping(LossSettings, {"sample_mean_denominator": 192}, where="loss")


def test_short_batch_divides_by_the_global_batch_with_kl_by_hand():
    """Three samples of a global batch of 8, KL on: the released loss is the sum of the three sample
    means (policy term + 0.5 x low-variance KL) over 8, not over 3."""
    from spade.training.learner import over_denominator

    logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0], [-1.5, 0.0]], dtype=D)
    ref = torch.tensor([[-1.5, -2.0], [-0.5, 0.0], [-1.0, 0.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]], dtype=D)
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=D)
    # ratio 1 (old = logp): the policy term of a token is -A; the KL term exp(ref - logp) - (ref - logp) - 1
    k3 = lambda d: math.exp(d) - d - 1  # noqa: E731
    means = [(-1.0 + 0.5 * k3(-0.5) + -1.0 + 0.5 * k3(0.0)) / 2, 2.0 + 0.5 * k3(0.0), -0.5 + 0.5 * k3(0.5)]
    samples = [TrainSample(torch.arange(3), torch.ones(2), advantages=float(a)) for a in adv]
    weighted = over_denominator(samples, 8)
    assert [s.loss_weight for s in weighted] == pytest.approx([3 / 8] * 3)
    assert over_denominator(samples, "samples") is samples and over_denominator(samples, 3) is samples
    loss, _ = policy_loss(logp, logp.clone(), adv, mask, ref_logprobs=ref, kl_coef=0.5, aggregation="sample_mean",
                          sample_weights=torch.tensor([s.loss_weight for s in weighted], dtype=D),
                          sample_counts=torch.tensor([s.count_weight for s in weighted], dtype=D))
    assert float(loss) == pytest.approx(sum(means) / 8)
    rescaled, _ = policy_loss(logp, logp.clone(), adv, mask, ref_logprobs=ref, kl_coef=0.5, aggregation="sample_mean")
    assert float(rescaled) == pytest.approx(sum(means) / 3)  # spade's "samples", the released reducer with KL off


@pytest.mark.usefixtures("megatron_world")
def test_short_batch_denominator_through_the_megatron_step():
    """The weights reach the Megatron step: loss and gradients are 5/8 of the rescaled ones."""
    from spade.training.learner import over_denominator

    _, _, model = megatron_model("llama-tied")
    samples = random_samples([9, 4, 13, 7, 10], seed=5, logprobs=True)
    settings = LossSettings(aggregation="sample_mean")
    batches = lambda s: make_micro_batches(s, 14, packed=False)  # noqa: E731
    full = forward_backward(model.chunks, batches(samples), settings)
    grads = main_grads(model)
    short = forward_backward(model.chunks, batches(over_denominator(samples, 8)),
                             dataclasses.replace(settings, sample_mean_denominator=8))
    assert short.loss == pytest.approx(full.loss * 5 / 8, rel=1e-5)
    for key, grad in main_grads(model).items():
        torch.testing.assert_close(grad, grads[key] * 5 / 8, atol=1e-6, rtol=1e-4, msg=key)
