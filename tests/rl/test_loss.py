"""policy_loss against numbers worked out by hand (see the comment beside each expectation)."""

from __future__ import annotations

import math

import pytest
import torch

from spade.rl.loss import LossMetrics, policy_loss

D = torch.float64
LN2 = math.log(2.0)


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=D)


def ratio_logprobs(ratios, requires_grad: bool = True) -> torch.Tensor:
    """log-probs whose ratio to old_logprobs = 0 is exactly the given numbers."""
    return torch.tensor([[math.log(r) for r in row] for row in ratios], dtype=D, requires_grad=requires_grad)


def assert_grad(x: torch.Tensor, expected) -> None:
    torch.testing.assert_close(x.grad, t(expected), rtol=1e-9, atol=1e-12)


def ones_like_rows(rows: int, cols: int) -> torch.Tensor:
    return torch.ones(rows, cols, dtype=D)


def test_unclipped_tokens():
    logp = ratio_logprobs([[1.1, 0.9]])
    loss, m = policy_loss(logp, torch.zeros(1, 2, dtype=D), t([2.0]), ones_like_rows(1, 2))
    # ratios 1.1 and 0.9 sit inside [0.8, 1.28]: pg = -r * A = [-2.2, -1.8], mean -2.0
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()
    # d(-r * A)/d logp = -r * A, divided by 2 tokens: [-1.1, -0.9]
    assert_grad(logp, [[-1.1, -0.9]])
    assert m.clip_frac_low == 0.0 and m.clip_frac_high == 0.0
    assert m.ratio_mean == pytest.approx(1.0)  # (1.1 + 0.9) / 2


def test_clipped_high_for_positive_advantage():
    logp = ratio_logprobs([[1.5, 1.5]])
    loss, m = policy_loss(logp, torch.zeros(1, 2, dtype=D), t([[1.0, -1.0]]), ones_like_rows(1, 2))
    # token 0: A = +1, min(1.5, 1.28) = 1.28 -> pg = -1.28 (clipped, no gradient)
    # token 1: A = -1, min(-1.5, -1.28) = -1.5 -> pg = +1.5 (unclipped)
    # mean: (-1.28 + 1.5) / 2 = 0.11
    assert loss.item() == pytest.approx(0.11)
    loss.backward()
    # token 1 gradient: -r * A / 2 = -1.5 * -1 / 2 = 0.75
    assert_grad(logp, [[0.0, 0.75]])
    assert m.clip_frac_high == pytest.approx(0.5)
    assert m.clip_frac_low == 0.0


def test_clipped_low_for_negative_advantage():
    logp = ratio_logprobs([[0.5, 0.5]])
    loss, m = policy_loss(logp, torch.zeros(1, 2, dtype=D), t([[-1.0, 1.0]]), ones_like_rows(1, 2))
    # token 0: A = -1, min(-0.5, -0.8) = -0.8 -> pg = 0.8 (clipped, no gradient)
    # token 1: A = +1, min(0.5, 0.8) = 0.5 -> pg = -0.5 (unclipped)
    # mean: (0.8 - 0.5) / 2 = 0.15
    assert loss.item() == pytest.approx(0.15)
    loss.backward()
    # token 1 gradient: -r * A / 2 = -0.25
    assert_grad(logp, [[0.0, -0.25]])
    assert m.clip_frac_low == pytest.approx(0.5)
    assert m.clip_frac_high == 0.0


def test_custom_clip_range():
    logp = ratio_logprobs([[1.5]])
    loss, _ = policy_loss(logp, torch.zeros(1, 1, dtype=D), t([1.0]), ones_like_rows(1, 1),
                          eps_low=0.1, eps_high=0.6)
    # 1.5 < 1.6: unclipped, pg = -1.5
    assert loss.item() == pytest.approx(-1.5)


def test_truncated_importance_sampling_cap_active_and_inactive():
    logp = torch.zeros(1, 2, dtype=D, requires_grad=True)
    old = torch.zeros(1, 2, dtype=D)
    rollout = t([[-math.log(3.0), -math.log(1.5)]])
    loss, m = policy_loss(logp, old, t([1.0]), ones_like_rows(1, 2), rollout_logprobs=rollout)
    # weights exp(0 - rollout) = [3.0 -> capped at 2.0, 1.5]; ratio 1, A = 1: pg = [-2.0, -1.5]
    # mean: -1.75
    assert loss.item() == pytest.approx(-1.75)
    loss.backward()
    # gradient -r * A * w / 2 = [-1.0, -0.75]; the weight itself is constant
    assert_grad(logp, [[-1.0, -0.75]])
    assert m.tis_weight_mean == pytest.approx(1.75)  # (2.0 + 1.5) / 2
    assert m.tis_clip_frac == pytest.approx(0.5)


def test_tis_cap_argument():
    loss, m = policy_loss(torch.zeros(1, 1, dtype=D), torch.zeros(1, 1, dtype=D), t([1.0]), ones_like_rows(1, 1),
                          rollout_logprobs=t([[-math.log(3.0)]]), tis_cap=5.0)
    # weight 3.0 is under the cap 5.0: pg = -3.0
    assert loss.item() == pytest.approx(-3.0)
    assert m.tis_clip_frac == 0.0


def test_tis_weight_uses_old_not_current_logprobs():
    # ratio exp(log 1.1 - 0) = 1.1; weight exp(0 - (-log 1.5)) = 1.5: pg = -1.1 * 1 * 1.5 = -1.65
    loss, m = policy_loss(ratio_logprobs([[1.1]]), torch.zeros(1, 1, dtype=D), t([1.0]), ones_like_rows(1, 1),
                          rollout_logprobs=t([[-math.log(1.5)]]))
    assert loss.item() == pytest.approx(-1.65)
    assert m.tis_weight_mean == pytest.approx(1.5)


def test_low_var_kl():
    logp = torch.zeros(1, 2, dtype=D, requires_grad=True)
    ref = t([[LN2, -LN2]])
    loss, m = policy_loss(logp, torch.zeros(1, 2, dtype=D), t([0.0]), ones_like_rows(1, 2),
                          ref_logprobs=ref, kl_coef=0.1)
    # A = 0, so pg = 0. d = ref - logp = [ln 2, -ln 2]
    # exp(d) - d - 1 = [2 - ln2 - 1, 0.5 + ln2 - 1]; their sum is 0.5, mean 0.25
    # loss = 0.1 * 0.25 = 0.025
    assert loss.item() == pytest.approx(0.025)
    assert m.kl_mean == pytest.approx(0.25)
    assert m.pg_loss == 0.0
    loss.backward()
    # d/dlogp (exp(d) - d - 1) = 1 - exp(d) = [-1, 0.5]; times 0.1 / 2 tokens = [-0.05, 0.025]
    assert_grad(logp, [[-0.05, 0.025]])


def test_kl_is_clamped_at_ten():
    logp = torch.zeros(1, 1, dtype=D, requires_grad=True)
    loss, m = policy_loss(logp, torch.zeros(1, 1, dtype=D), t([0.0]), ones_like_rows(1, 1),
                          ref_logprobs=t([[12.0]]), kl_coef=0.5)
    # exp(12) - 12 - 1 is about 162,742, clamped to 10: loss = 0.5 * 10 = 5
    assert loss.item() == pytest.approx(5.0)
    assert m.kl_mean == pytest.approx(10.0)
    loss.backward()
    assert logp.grad.item() == 0.0


def test_kl_is_reported_but_not_added_with_zero_coef():
    loss, m = policy_loss(torch.zeros(1, 2, dtype=D), torch.zeros(1, 2, dtype=D), t([1.0]), ones_like_rows(1, 2),
                          ref_logprobs=t([[LN2, -LN2]]))
    assert loss.item() == pytest.approx(-1.0)  # ratio 1, A = 1
    assert m.kl_mean == pytest.approx(0.25)


def test_tis_and_kl_together():
    # ratio 1, A = 1, weight 2 (capped from 3), KL with d = ln 2: 2 - ln2 - 1 = 1 - ln2
    # pg = -1 * 2 + 0.1 * (1 - ln 2)
    loss, _ = policy_loss(torch.zeros(1, 1, dtype=D), torch.zeros(1, 1, dtype=D), t([1.0]), ones_like_rows(1, 1),
                          rollout_logprobs=t([[-math.log(3.0)]]), ref_logprobs=t([[LN2]]), kl_coef=0.1)
    assert loss.item() == pytest.approx(-2.0 + 0.1 * (1.0 - LN2))


def test_token_mean_vs_seq_mean_token_mean_with_empty_sequence():
    logp = torch.zeros(3, 2, dtype=D, requires_grad=True)
    adv = t([[1.0, 3.0], [4.0, 9.0], [7.0, 7.0]])
    mask = t([[1, 1], [1, 0], [0, 0]])
    # ratio 1 everywhere, so pg = -A; masked tokens: -1, -3 (seq 0) and -4 (seq 1); seq 2 has none
    tok, m_tok = policy_loss(logp, torch.zeros(3, 2, dtype=D), adv, mask)
    # token_mean: (-1 - 3 - 4) / 3
    assert tok.item() == pytest.approx(-8.0 / 3.0)
    seq, m_seq = policy_loss(logp, torch.zeros(3, 2, dtype=D), adv, mask, aggregation="seq_mean_token_mean")
    # per sequence: -2 and -4; the empty sequence is left out: mean -3
    assert seq.item() == pytest.approx(-3.0)
    assert m_seq.pg_loss == pytest.approx(-3.0)
    assert m_tok.num_tokens == 3.0
    seq.backward()
    # seq 0 tokens: -1 / 2 / 2 sequences = -0.25 and -3 / 4 = -0.75; seq 1: -4 / 1 / 2 = -2
    assert_grad(logp, [[-0.25, -0.75], [-2.0, 0.0], [0.0, 0.0]])


def test_all_masked_out_gives_zero_loss_and_metrics():
    logp = torch.zeros(2, 2, dtype=D, requires_grad=True)
    for aggregation in ("token_mean", "seq_mean_token_mean"):
        loss, m = policy_loss(logp, torch.zeros(2, 2, dtype=D), t([1.0, 2.0]), torch.zeros(2, 2),
                              aggregation=aggregation)
        assert loss.item() == 0.0
        assert all(value == 0.0 for value in m.to_dict().values())
        loss.backward()
        assert torch.equal(logp.grad, torch.zeros(2, 2, dtype=D))


def test_sequence_and_token_advantages_agree():
    logp = ratio_logprobs([[1.5, 0.9], [0.5, 1.2]], requires_grad=False)
    old = torch.zeros(2, 2, dtype=D)
    mask = t([[1, 1], [1, 0]])
    a, m_a = policy_loss(logp, old, t([2.0, -1.0]), mask)
    b, m_b = policy_loss(logp, old, t([[2.0, 2.0], [-1.0, -1.0]]), mask)
    # tokens: (1.5, +2) clipped -> -2.56; (0.9, +2) -> -1.8; (0.5, -1) clipped -> +0.8
    # mean: (-2.56 - 1.8 + 0.8) / 3 = -3.56 / 3
    assert a.item() == pytest.approx(-3.56 / 3.0)
    assert b.item() == pytest.approx(a.item())
    assert m_a == m_b


def test_metrics_cover_masked_tokens_only():
    logp = ratio_logprobs([[1.5, 0.5, 1.5, 0.5, 1.0, 2.0]], requires_grad=False)
    adv = t([[1.0, -1.0, -1.0, 1.0, 1.0, 1.0]])
    mask = t([[1, 1, 1, 1, 1, 0]])  # the last token (ratio 2, A > 0, clipped) is not trained on
    _, m = policy_loss(logp, torch.zeros(1, 6, dtype=D), adv, mask)
    assert isinstance(m, LossMetrics)
    # 1 of 5 masked tokens is clipped high (1.5, A > 0), 1 of 5 clipped low (0.5, A < 0)
    assert m.clip_frac_high == pytest.approx(0.2)
    assert m.clip_frac_low == pytest.approx(0.2)
    assert m.clip_frac == pytest.approx(0.4)
    # ratios 1.5, 0.5, 1.5, 0.5, 1.0: mean 1.0 (the masked-out 2.0 does not count)
    assert m.ratio_mean == pytest.approx(1.0)
    # no rollout log-probs: weight 1; no reference: KL 0
    assert m.tis_weight_mean == 1.0 and m.tis_clip_frac == 0.0 and m.kl_mean == 0.0
    # pg: -1.28, 0.8, 1.5, -0.5, -1.0; sum -0.48, mean -0.096
    assert m.pg_loss == pytest.approx(-0.096)
    assert m.loss == pytest.approx(-0.096)
    d = m.to_dict()
    assert set(d) >= {"clip_frac_low", "clip_frac_high", "clip_frac", "tis_weight_mean", "kl_mean",
                      "ratio_mean", "pg_loss", "loss", "num_tokens"}
    assert all(isinstance(value, float) for value in d.values())


def test_bool_mask_and_low_precision_inputs():
    logp = torch.log(torch.tensor([[1.1, 0.9]], dtype=torch.bfloat16))
    loss, _ = policy_loss(logp, torch.zeros(1, 2, dtype=torch.bfloat16), torch.tensor([1.0]),
                          torch.tensor([[True, False]]))
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(-1.1, abs=1e-2)


def test_gradcheck_smooth_case():
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(3, 5, dtype=D, generator=gen)
    # stay well inside the clip band so the loss is smooth around the inputs
    logp = (old + 0.05 * torch.randn(3, 5, dtype=D, generator=gen)).requires_grad_()
    adv = torch.randn(3, dtype=D, generator=gen)
    rollout = old + 0.3 * torch.randn(3, 5, dtype=D, generator=gen)
    ref = old + 0.5 * torch.randn(3, 5, dtype=D, generator=gen)
    mask = (torch.rand(3, 5, generator=gen) > 0.3).to(D)
    for aggregation in ("token_mean", "seq_mean_token_mean"):
        def fn(x: torch.Tensor) -> torch.Tensor:
            return policy_loss(x, old, adv, mask, rollout_logprobs=rollout, ref_logprobs=ref, kl_coef=0.05,
                               aggregation=aggregation)[0]

        assert torch.autograd.gradcheck(fn, (logp,))


def test_only_logprobs_receive_gradient():
    logp = torch.zeros(1, 2, dtype=D, requires_grad=True)
    old = torch.zeros(1, 2, dtype=D, requires_grad=True)
    adv = t([1.0]).requires_grad_()
    loss, _ = policy_loss(logp, old, adv, ones_like_rows(1, 2))
    loss.backward()
    assert logp.grad is not None
    assert old.grad is None and adv.grad is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(aggregation="seq_mean"), r"aggregation='seq_mean'.*token_mean, seq_mean_token_mean"),
        (dict(kl_coef=0.1), r"kl_coef.*requires ref_logprobs"),
        (dict(kl_coef=-1.0), r"kl_coef"),
        (dict(tis_cap=0.0), r"tis_cap"),
        (dict(eps_low=1.0), r"eps_low"),
        (dict(eps_high=-0.1), r"eps_high"),
        (dict(rollout_logprobs=torch.zeros(2, 3)), r"rollout_logprobs"),
        (dict(ref_logprobs=torch.zeros(3, 2)), r"ref_logprobs"),
    ],
)
def test_validation_of_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        policy_loss(torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 2), **kwargs)


def test_validation_of_shapes():
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="logprobs must be"):
        policy_loss(torch.zeros(6), torch.zeros(6), torch.zeros(2), torch.ones(6))
    with pytest.raises(ValueError, match="old_logprobs"):
        policy_loss(z, torch.zeros(3, 2), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="loss_mask"):
        policy_loss(z, z, torch.zeros(2), torch.ones(2, 2))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(z, z, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(z, z, torch.zeros(2, 1), torch.ones(2, 3))
