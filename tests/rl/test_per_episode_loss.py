"""Issue 39, per-turn samples as released: an episode's turn samples are one episode in the loss
(``loss.aggregation: sample_mean``: one token mean over all its turns, counted once) and in the
batch (the cut keeps, the fault fill copies, and the designer weight counts whole episodes).

The released code keeps an episode's turn samples in one slime group whose reducer takes the
token mean over the group and counts groups (``slime/trajectory_converter.py:100-116``,
``slime/spade_rollout.py:902-906``); spade gives the turn samples loss and count weights instead
(``TrainSample.loss_weight``, ``count_weight``; ``spade.selfplay.plays.turn_samples.episode_weights``).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from megatron_fixtures import megatron_world  # noqa: F401  (fixture)
from spade.models import ParallelLayout, RankCoords
from spade.models.builder import naming_for
from spade.models.loading import group_gather
from spade.models.weight_map import iter_hf_weights
from spade.rl.logprobs import logprobs_from_logits
from spade.rl.loss import policy_loss
from spade.rl.samples import Role, Trajectory, TrainSample
from spade.selfplay.batch_rules import BatchRules
from spade.selfplay.orchestrator import _agent_episodes
from spade.selfplay.plays.play_rules import fill_round_robin
from spade.selfplay.plays.turn_samples import episode_weights, episodes
from spade.training import LossSettings, make_micro_batches
from spade.training.train_step import forward_backward
from test_training import main_grads, megatron_model, random_samples

D = torch.float64


def turn(mask: tuple[int, ...], index: int = 0, role: Role = Role.AGENT) -> Trajectory:
    return Trajectory(token_ids=tuple(range(len(mask) + 1)), loss_mask=mask, index=index, role=role,
                      env_id="e", generated_step=0, advantage=1.0, logprob_temperature=1.0)


# --------------------------------------------------------------------------- the weights


def test_episode_weights_share_one_count_and_weigh_turns_by_their_loss_tokens():
    weighted = episode_weights([turn((0, 1, 1)), turn((1,)), turn((0, 1, 1, 1))])  # 2, 1 and 3 of 6 tokens
    assert [t.loss_weight for t in weighted] == pytest.approx([2 / 6, 1 / 6, 3 / 6])
    assert [t.count_weight for t in weighted] == [1, 0, 0]
    one = episode_weights([turn((0, 1))])
    assert (one[0].loss_weight, one[0].count_weight) == (1.0, 1)
    samples = [weighted[0].to_train_sample(), TrainSample([1, 2], [1], 0.5)]
    assert [(s.loss_weight, s.count_weight) for s in samples] == [(pytest.approx(1 / 3), 1), (1.0, 1)]
    # a record with the default weights is written as before the fields; others round-trip
    assert "loss_weight" not in one[0].to_json() and "count_weight" not in one[0].to_json()
    assert Trajectory.from_json(weighted[2].to_json()) == weighted[2]
    with pytest.raises(ValueError, match="count_weight must be an integer >= 0"):
        TrainSample([1, 2], [1], 0.5, count_weight=0.5)


def test_sample_mean_with_turn_weights_is_the_per_episode_token_mean():
    # episode A: three turns of 2, 1 and 3 loss tokens; episode B: one turn of 2. pg = -A (ratio 1)
    adv = torch.tensor([[1.0, 3.0, 0, 0], [5.0, 0, 0, 0], [2.0, 2.0, 8.0, 0], [4.0, 6.0, 0, 0]], dtype=D)
    mask = (adv != 0).to(D)
    logp = torch.zeros(4, 4, dtype=D)
    weights = torch.tensor([2 / 6, 1 / 6, 3 / 6, 1.0], dtype=D)
    counts = torch.tensor([1, 0, 0, 1])
    loss, _ = policy_loss(logp, logp.clone(), adv, mask, aggregation="sample_mean",
                          sample_weights=weights, sample_counts=counts)
    # A's token mean: -(1+3+5+2+2+8)/6 = -3.5; B's: -5; two episodes
    assert float(loss) == pytest.approx((-3.5 - 5.0) / 2)
    plain, _ = policy_loss(logp, logp.clone(), adv, mask, aggregation="sample_mean")  # turns as samples
    assert float(plain) == pytest.approx((-2.0 - 5.0 - 4.0 - 5.0) / 4)
    with pytest.raises(ValueError, match="sample_weights is for aggregation sample_mean"):
        policy_loss(logp, logp.clone(), adv, mask, sample_weights=weights)


# --------------------------------------------------------------------------- the Megatron step


def _episode_samples() -> tuple[list[TrainSample], list[list[int]]]:
    """A 3-turn episode (4, 6 and 3 loss tokens) and a 1-turn episode, weighted by hand."""
    turns = random_samples([9, 12, 7, 10], seed=5, logprobs=True)
    weights = [(4 / 13, 1), (6 / 13, 0), (3 / 13, 0), (1.0, 1)]
    advantages = [0.7, 0.7, 0.7, -1.3]  # each turn sample has its episode's advantage
    assert [s.num_loss_tokens for s in turns] == [4, 6, 3, 5]
    samples = [dataclasses.replace(s, advantages=a, loss_weight=w, count_weight=c)
               for s, a, (w, c) in zip(turns, advantages, weights)]
    return samples, [[0, 1, 2], [3]]


def _released_loss_and_grads(hf_model, samples, groups) -> tuple[float, dict[str, torch.Tensor]]:
    """The released reducer computed directly: per episode, one token_mean policy_loss over all its
    turns' tokens; the mean over episodes; gradients by autograd through the transformers model."""
    hf_model.zero_grad()
    losses = []
    for group in groups:
        members = [samples[i] for i in group]
        width = max(s.num_targets for s in members)

        def stack(values):
            return torch.stack([torch.nn.functional.pad(v, (0, width - v.numel())) for v in values])

        logprobs = [logprobs_from_logits(hf_model(s.token_ids.unsqueeze(0)).logits[0, :-1] / s.temperature,
                                         s.token_ids[1:]) for s in members]
        loss, _ = policy_loss(stack(logprobs), stack([s.old_logprobs for s in members]),
                              torch.tensor([s.advantages for s in members]), stack([s.loss_mask for s in members]),
                              rollout_logprobs=stack([s.rollout_logprobs for s in members]))
        losses.append(loss)
    total = torch.stack(losses).mean()
    total.backward()
    return float(total.detach()), {n: p.grad.detach().clone() for n, p in hf_model.named_parameters()}


def _hf_named(model, spec, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return dict(iter_hf_weights(grads, spec, ParallelLayout(), RankCoords.current(), group_gather(),
                                naming_for(model.options)))


@pytest.mark.usefixtures("megatron_world")
def test_per_turn_samples_train_the_released_per_episode_token_mean():
    """Loss and gradients of the weighted turn samples under sample_mean are the released
    per-episode token mean, in one micro-batch or split so that a micro-batch holds only turns that
    do not carry their episode's count."""
    hf_model, spec, model = megatron_model("qwen3")
    samples, groups = _episode_samples()
    expected, hf_grads = _released_loss_and_grads(hf_model, samples, groups)
    settings = LossSettings(aggregation="sample_mean")
    whole = make_micro_batches(samples, 10_000, packed=False)
    split = make_micro_batches(samples, 12, packed=False)
    assert len(whole) == 1 and len(split) == 4
    assert any(mb.sample_count == 0 and mb.num_loss_tokens for mb in split)
    for micro_batches in (whole, split):
        summary = forward_backward(model.chunks, micro_batches, settings)
        assert summary.loss == pytest.approx(expected, abs=1e-5)
        assert summary.samples == 4 and summary.loss_tokens == 18
        got = _hf_named(model, spec, main_grads(model))
        assert got.keys() == hf_grads.keys()
        for name, grad in hf_grads.items():
            torch.testing.assert_close(got[name], grad, atol=1e-6, rtol=1e-4, msg=name)
    # counted as four samples (the weights dropped), the step trains another loss
    plain = [dataclasses.replace(s, loss_weight=1.0, count_weight=1) for s in samples]
    other = forward_backward(model.chunks, make_micro_batches(plain, 10_000, packed=False), settings)
    assert abs(other.loss - expected) > 1e-3


@pytest.mark.usefixtures("megatron_world")
def test_defaults_are_unchanged_by_the_weights():
    """Default weights build the micro-batches as before (no weight tensors), and token_mean
    ignores the weights of turn samples."""
    _, _, model = megatron_model("qwen3")
    samples, _ = _episode_samples()
    plain = [dataclasses.replace(s, loss_weight=1.0, count_weight=1) for s in samples]
    batch = make_micro_batches(plain, 10_000, packed=False)[0]
    assert batch.loss_weights is None and batch.count_weights is None and batch.sample_count == 4
    weighted = forward_backward(model.chunks, make_micro_batches(samples, 10_000, packed=False), LossSettings())
    unweighted = forward_backward(model.chunks, [batch], LossSettings())
    assert weighted.loss == pytest.approx(unweighted.loss, abs=1e-7)


# --------------------------------------------------------------------------- the batch


def _three_episodes() -> list[Trajectory]:
    a = episode_weights([turn((1,), 0), turn((1, 1), 0), turn((1,), 0)])
    b = episode_weights([turn((1,), 1)])
    c = episode_weights([turn((1,), 2), turn((0, 1), 2)])
    return [*a, *b, *c]


def test_episodes_group_turn_samples_after_the_one_that_counts():
    samples = _three_episodes()
    assert [[t.index for t in e] for e in episodes(samples)] == [[0, 0, 0], [1], [2, 2]]
    assert _agent_episodes(samples) == 3
    plain = [turn((1,), i) for i in (0, 0, 1)]  # one sequence each: every sample is an episode
    assert episodes(plain) == [[s] for s in plain] and _agent_episodes(plain) == 3


def test_cut_keeps_whole_episodes_and_counts_them():
    samples = _three_episodes()
    designers = [turn((1,), 9, Role.DESIGNER)]
    batch = BatchRules(global_batch=3, cut_to_global_batch=True).assemble(episodes(samples), episodes(designers))
    kept = [t for e in batch for t in e]
    # designers first, then two whole episodes (4 turn samples): 3 counted, not 3 samples
    assert [(t.role, t.index) for t in kept] == [(Role.DESIGNER, 9), *[(Role.AGENT, 0)] * 3, (Role.AGENT, 1)]
    assert sum(t.count_weight for t in kept) == 3


def test_fault_fill_copies_whole_episodes_and_the_weight_counts_the_copies():
    samples = _three_episodes()[:4]  # episodes 0 (three turns) and 1 survived; five plays were asked for
    filled = [t for e in fill_round_robin(episodes(samples), 5) for t in e]
    assert [t.index for t in filled] == [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]
    assert [[t.index for t in e] for e in episodes(filled)] == [[0] * 3, [1], [0] * 3, [1], [0] * 3]
    assert _agent_episodes(filled) == 5
