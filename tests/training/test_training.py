"""spade.training in one process (gloo world of one, TP1): settings, batching, the train step.

Tiny random transformers models (2 layers, hidden 64, vocabulary 200, which Megatron pads to 256)
loaded into Megatron; the independent references are the transformers model's own logits and
``spade.rl.loss.policy_loss`` applied to them directly. The multi-rank layouts are in
test_training_distributed.py.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from spade.models.builder import build_transformer_config
import torch

from megatron_fixtures import megatron_world  # noqa: F401  (fixture)
from spade.config import ConfigError, from_mapping
from spade.models import ParallelLayout
from spade.models.builder import BuildOptions
from spade.rl.logprobs import logprobs_from_logits
from spade.rl.loss import policy_loss
from spade.training import (
    LossSettings,
    OptimizerSettings,
    TrainSample,
    build_model,
    build_optimizer,
    compute_logprobs,
    data_parallel_shard,
    forward_backward,
    init_parallel,
    make_micro_batches,
    train_step,
)
from spade.training.batching import default_packing
from test_models_parity import VOCAB, checkpoint_state, tiny_hf

FP32 = BuildOptions(params_dtype=torch.float32)
ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ helpers


def random_samples(lengths, *, seed=0, per_token_advantages=False, logprobs=False) -> list[TrainSample]:
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for length in lengths:
        ids = torch.randint(0, VOCAB, (length,), generator=gen)
        mask = torch.zeros(length - 1)
        mask[(length - 1) // 2:] = 1.0
        advantages = (torch.randn(length - 1, generator=gen) if per_token_advantages
                      else float(torch.randn((), generator=gen)))
        extra = {}
        if logprobs:
            extra = {name: -torch.rand(length - 1, generator=gen) * 3
                     for name in ("old_logprobs", "rollout_logprobs", "ref_logprobs")}
        samples.append(TrainSample(ids, mask, advantages, **extra))
    return samples


def hf_logprobs(hf_model, sample: TrainSample) -> torch.Tensor:
    """log_softmax(logits / T) at the sample's temperature, gathered at its targets."""
    with torch.no_grad():
        logits = hf_model(sample.token_ids.unsqueeze(0)).logits[0, :-1]
    return logprobs_from_logits(logits / sample.temperature, sample.token_ids[1:])


def megatron_model(name: str, **kwargs):
    init_parallel(ParallelLayout(), seed=1234)
    hf_model, spec = tiny_hf(name)
    model = build_model(spec, ParallelLayout(), options=FP32, hf_state=checkpoint_state(hf_model, spec), **kwargs)
    return hf_model, spec, model


def main_grads(model) -> dict[str, torch.Tensor]:
    return {n: p.main_grad.detach().clone() for n, p in model.unwrapped()[0].named_parameters()}


# ------------------------------------------------------------------ optimizer settings


def test_optimizer_defaults_are_the_spec():
    settings = OptimizerSettings()
    assert (settings.lr, settings.betas, settings.weight_decay, settings.clip_grad) == (1e-6, (0.9, 0.98), 0.1, 1.0)
    assert settings.schedule == "constant" and not settings.use_distributed_optimizer


def test_bad_schedule_names_the_key_and_the_choices():
    with pytest.raises(ValueError) as raised:
        OptimizerSettings(schedule="exponential")
    message = str(raised.value)
    assert "schedule" in message and "exponential" in message
    assert all(choice in message for choice in ("constant", "cosine", "linear"))
    with pytest.raises(ConfigError, match=r"optimizer\.schedule.*constant, cosine, linear"):
        from_mapping(OptimizerSettings, {"schedule": "step"}, where="optimizer")


@pytest.mark.parametrize("change, key", [
    ({"schedule": "cosine"}, "total_steps"),
    ({"schedule": "linear", "total_steps": 5, "warmup_steps": 5}, "total_steps"),
    ({"betas": (0.9, 1.0)}, "betas"),
    ({"lr": -1e-6}, "lr"),
    ({"min_lr": 1.0}, "min_lr"),
    ({"clip_grad": -1.0}, "clip_grad"),
    ({"weight_decay": -0.1}, "weight_decay"),
    ({"warmup_steps": -1}, "warmup_steps"),
])
def test_invalid_optimizer_settings_name_the_key(change, key):
    with pytest.raises(ValueError, match=key):
        OptimizerSettings(**change)


def test_settings_from_yaml_mapping():
    settings = from_mapping(OptimizerSettings, {"lr": 3e-6, "betas": [0.9, 0.95], "schedule": "cosine",
                                                "total_steps": 100}, where="optimizer")
    assert settings.betas == (0.9, 0.95) and settings.total_steps == 100
    with pytest.raises(ValueError, match="aggregation"):
        LossSettings(aggregation="sum")


@pytest.mark.usefixtures("megatron_world")
def test_schedules_and_weight_decay_groups():
    _, _, model = megatron_model("qwen3")
    optimizer, scheduler = build_optimizer(model.chunks, OptimizerSettings(
        lr=1e-3, min_lr=1e-4, schedule="cosine", warmup_steps=2, total_steps=6))
    seen = []
    for _ in range(8):
        seen.append(optimizer.param_groups[0]["lr"])
        scheduler.step(1)
    expected = [0.0, 5e-4, 1e-3] + [1e-4 + 0.5 * (1 + math.cos(math.pi * k / 4)) * 9e-4 for k in (1, 2, 3, 4)] + [1e-4]
    assert seen == pytest.approx(expected)
    decays = {group["weight_decay"] for group in optimizer.param_groups}
    assert decays == {0.0, 0.1}  # norms (1-D) are not decayed, matrices are

    _, _, model = megatron_model("qwen3")
    optimizer, scheduler = build_optimizer(model.chunks, OptimizerSettings())
    for _ in range(3):
        scheduler.step(1)
    assert all(group["lr"] == 1e-6 for group in optimizer.param_groups)


@pytest.mark.usefixtures("megatron_world")
def test_distributed_optimizer_must_match_the_ddp_wrapping():
    _, _, model = megatron_model("qwen3")
    with pytest.raises(ValueError, match="use_distributed_optimizer"):
        build_optimizer(model.chunks, OptimizerSettings(use_distributed_optimizer=True))


# ------------------------------------------------------------------ samples and batching


def test_train_sample_alignment_and_validation():
    sample = TrainSample.from_token_mask([5, 6, 7, 8], [0, 0, 1, 1], advantages=0.5)
    assert sample.loss_mask.tolist() == [0.0, 1.0, 1.0]  # entry i is token i + 1
    assert (sample.length, sample.num_targets, sample.num_loss_tokens) == (4, 3, 2)
    with pytest.raises(ValueError, match="one entry per target"):
        TrainSample([5, 6, 7], [0, 1, 1], 1.0)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        TrainSample([5], [], 1.0)
    with pytest.raises(ValueError, match="old_logprobs"):
        TrainSample([5, 6, 7], [1, 1], 1.0, old_logprobs=[0.1])
    with pytest.raises(ValueError, match="advantages"):
        TrainSample([5, 6, 7], [1, 1], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="0 or 1"):
        TrainSample([5, 6, 7], [1, 2], 1.0)


@pytest.mark.parametrize("budget", [16, 40, 100, 1000])
@pytest.mark.parametrize("packed", [False, True])
def test_micro_batches_respect_the_budget_and_cover_every_sample(budget, packed):
    lengths = [3, 17, 9, 30, 5, 12, 12, 2, 8, 21]
    samples = random_samples(lengths)
    batches = make_micro_batches(samples, budget, packed=packed)
    covered = sorted(i for mb in batches for i in mb.sample_indices)
    assert covered == list(range(len(samples)))
    for mb in batches:
        assert mb.is_packed == packed
        if mb.batch_size > 1:
            assert mb.computed_tokens <= budget
        else:
            assert mb.computed_tokens == max(samples[mb.sample_indices[0]].length, 0)
    if not packed:  # padded cost is rows x longest row
        assert all(mb.computed_tokens == mb.batch_size * mb.seq_len for mb in batches)


@pytest.mark.parametrize("packed", [False, True])
def test_targets_masks_and_logprobs_are_aligned(packed):
    samples = random_samples([7, 4, 11, 6], per_token_advantages=True, logprobs=True)
    batches = make_micro_batches(samples, 10_000, packed=packed, pad_to_multiple_of=4)
    (mb,) = batches
    assert mb.input_ids.shape[1] % 4 == 0
    flat_ids = mb.input_ids[0] if packed else None
    for row, index in enumerate(mb.sample_indices):
        sample = samples[index]
        n = sample.num_targets
        assert torch.equal(mb.loss_mask[row, :n], sample.loss_mask)
        assert not mb.loss_mask[row, n:].any()  # padding never counted
        assert torch.equal(mb.advantages[row, :n], sample.advantages)
        assert torch.equal(mb.old_logprobs[row, :n], sample.old_logprobs)
        assert torch.equal(mb.ref_logprobs[row, :n], sample.ref_logprobs)
        assert torch.equal(mb.rollout_logprobs[row, :n], sample.rollout_logprobs)
        if packed:
            positions = mb.unpack_index[row, :n]
            assert torch.equal(flat_ids[positions], sample.token_ids[:-1])
            assert torch.equal(mb.targets[0][positions], sample.token_ids[1:])  # next token, same sequence
        else:
            assert torch.equal(mb.input_ids[row, : sample.length], sample.token_ids)
            assert torch.equal(mb.targets[row, :n], sample.token_ids[1:])
    assert mb.num_loss_tokens == sum(s.num_loss_tokens for s in samples)
    assert mb.num_tokens == sum(s.length for s in samples)
    assert mb.num_loss_sequences == len(samples)
    if packed:
        cu = mb.packed_seq_params.cu_seqlens_q.tolist()
        assert cu[0] == 0 and cu[-1] == mb.input_ids.shape[1]
        assert all((b - a) % 4 == 0 for a, b in zip(cu, cu[1:]))
        assert mb.packed_seq_params.qkv_format == "thd"


def test_scalar_and_per_token_advantages_mix_and_logprobs_are_all_or_none():
    samples = random_samples([5, 6]) + random_samples([7], per_token_advantages=True)
    (mb,) = make_micro_batches(samples, 1000, packed=False)
    assert mb.advantages.shape == (3, 7)
    scalar_row = mb.sample_indices.index(0)
    assert torch.all(mb.advantages[scalar_row, :4] == samples[0].advantages)
    (mb,) = make_micro_batches(random_samples([5, 6]), 1000, packed=False)
    assert mb.advantages.shape == (2,) and mb.old_logprobs is None
    mixed = random_samples([5]) + random_samples([6], logprobs=True)
    with pytest.raises(ValueError, match="all or none"):
        make_micro_batches(mixed, 1000, packed=False)


def test_packing_is_chosen_only_with_transformer_engine():
    assert default_packing() is False  # this machine: no CUDA / TE, Megatron's local attention
    assert not make_micro_batches(random_samples([5, 6]), 1000)[0].is_packed


def test_data_parallel_shards_partition_and_balance():
    samples = random_samples([3, 17, 9, 30, 5, 12, 12, 2, 8, 21, 6])
    shards = [data_parallel_shard(samples, 3, rank) for rank in range(3)]
    assert sorted(i for shard in shards for i in shard) == list(range(len(samples)))
    loads = [sum(samples[i].length for i in shard) for shard in shards]
    assert max(loads) - min(loads) <= max(s.length for s in samples)
    assert shards == [data_parallel_shard(samples, 3, rank) for rank in range(3)]  # deterministic
    assert data_parallel_shard(samples[:1], 2, 1) == []  # a rank may get nothing


# ------------------------------------------------------------------ model, log-probs, train step


@pytest.mark.usefixtures("megatron_world")
@pytest.mark.parametrize("name", ["llama-tied", "qwen3", "qwen3-moe"])
def test_compute_logprobs_matches_transformers(name):
    hf_model, _, model = megatron_model(name)
    samples = random_samples([9, 4, 13, 7], seed=3)
    logprobs = compute_logprobs(model.chunks, make_micro_batches(samples, 30, packed=False), chunk_size=5)
    assert len(logprobs) == len(samples)
    for sample, values in zip(samples, logprobs):
        assert values.shape == (sample.num_targets,) and values.dtype == torch.float32
        torch.testing.assert_close(values, hf_logprobs(hf_model, sample), atol=1e-4, rtol=0)


@pytest.mark.usefixtures("megatron_world")
def test_padded_vocabulary_rows_stay_out_of_the_softmax():
    hf_model, _, model = megatron_model("qwen3")
    output = model.unwrapped()[0].output_layer.weight
    assert output.shape[0] == 256 > VOCAB
    with torch.no_grad():
        output[VOCAB:] = torch.randn(256 - VOCAB, output.shape[1]) * 50  # would dominate the softmax
    samples = random_samples([9, 6], seed=5)
    batches = make_micro_batches(samples, 1000, packed=False)
    for sample, values in zip(samples, compute_logprobs(model.chunks, batches)):
        torch.testing.assert_close(values, hf_logprobs(hf_model, sample), atol=1e-4, rtol=0)
    forward_backward(model.chunks, batches)
    grad = model.unwrapped()[0].output_layer.weight.main_grad
    assert grad[:VOCAB].abs().max() > 0 and not grad[VOCAB:].any()


@pytest.mark.usefixtures("megatron_world")
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_loss_is_policy_loss_of_the_whole_batch(aggregation):
    """Normalised by the global count: the step's loss equals one policy_loss call on the whole
    batch, computed here from the transformers model's log-probs."""
    hf_model, _, model = megatron_model("llama-tied")
    samples = random_samples([9, 4, 13, 7, 10], seed=2, logprobs=True)
    # each sample at the temperature it was drawn with, mixed within micro-batches
    samples = [dataclasses.replace(s, temperature=t) for s, t in zip(samples, (0.6, 1.0, 0.3, 0.6, 1.7))]
    settings = LossSettings(aggregation=aggregation, kl_coef=0.1)
    summary = forward_backward(model.chunks, make_micro_batches(samples, 24, packed=False), settings)

    width = max(s.num_targets for s in samples)
    def stack(values):
        out = torch.zeros(len(samples), width)
        for row, v in enumerate(values):
            out[row, : v.numel()] = v
        return out
    expected, metrics = policy_loss(
        stack([hf_logprobs(hf_model, s) for s in samples]), stack([s.old_logprobs for s in samples]),
        torch.tensor([s.advantages for s in samples]), stack([s.loss_mask for s in samples]),
        rollout_logprobs=stack([s.rollout_logprobs for s in samples]),
        ref_logprobs=stack([s.ref_logprobs for s in samples]), kl_coef=0.1, aggregation=aggregation,
    )
    assert summary.loss == pytest.approx(float(expected), abs=1e-5)
    for key in ("pg_loss", "clip_frac_low", "clip_frac_high", "ratio_mean", "tis_weight_mean", "tis_clip_frac", "kl_mean",
                "rollout_logprob_abs_diff", "rollout_kl"):
        assert getattr(summary, key) == pytest.approx(getattr(metrics, key), abs=1e-5), key
    assert summary.loss_tokens == metrics.num_tokens == sum(s.num_loss_tokens for s in samples)
    assert summary.tokens == sum(s.length for s in samples) and summary.samples == len(samples)


@pytest.mark.usefixtures("megatron_world")
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_micro_batch_split_does_not_change_loss_or_gradients(aggregation):
    _, _, model = megatron_model("qwen3")
    samples = random_samples([9, 4, 13, 7, 10, 3], seed=4, logprobs=True, per_token_advantages=True)
    settings = LossSettings(aggregation=aggregation)
    whole = make_micro_batches(samples, 10_000, packed=False)
    split = make_micro_batches(samples, 20, packed=False)
    assert len(whole) == 1 and len(split) >= 4
    one = forward_backward(model.chunks, whole, settings)
    grads_one = main_grads(model)
    many = forward_backward(model.chunks, split, settings)
    grads_many = main_grads(model)
    assert many.loss == pytest.approx(one.loss, abs=1e-6)
    for key in ("pg_loss", "ratio_mean", "tis_weight_mean", "kl_mean", "rollout_logprob_abs_diff", "rollout_kl"):
        assert getattr(many, key) == pytest.approx(getattr(one, key), abs=1e-6), key
    assert (many.loss_tokens, many.tokens, many.samples) == (one.loss_tokens, one.tokens, one.samples)
    for key, grad in grads_one.items():
        torch.testing.assert_close(grads_many[key], grad, atol=1e-6, rtol=1e-5, msg=key)


@pytest.mark.usefixtures("megatron_world")
@pytest.mark.parametrize("recompute", ["full", "selective"])
@pytest.mark.parametrize("name", ["qwen3", "qwen3-moe"])
def test_activation_recompute_gives_the_same_loss_and_gradients(name, recompute):
    """model.recompute trades memory for compute only: the backward pass recomputes the layers
    (or the core attention) from their inputs and reaches the same gradients."""
    samples = random_samples([9, 4, 13, 7], seed=5, logprobs=True)
    batches = make_micro_batches(samples, 10_000, packed=False)
    results = {}
    for mode in ("none", recompute):
        init_parallel(ParallelLayout(), seed=1234)
        hf_model, spec = tiny_hf(name)
        options = dataclasses.replace(FP32, recompute=mode)
        assert (build_transformer_config(spec, ParallelLayout(), options).recompute_granularity
                == (None if mode == "none" else mode))
        model = build_model(spec, ParallelLayout(), options=options, hf_state=checkpoint_state(hf_model, spec))
        layer = model.unwrapped()[0].decoder.layers[0]
        watched = layer if recompute == "full" else layer.self_attention.core_attention
        calls = []
        handle = watched.register_forward_hook(lambda *_: calls.append(1))
        summary = forward_backward(model.chunks, batches, LossSettings())
        handle.remove()
        results[mode] = (summary.loss, main_grads(model), len(calls))
    (loss, grads, calls), (loss_rc, grads_rc, calls_rc) = results["none"], results[recompute]
    assert calls_rc == 2 * calls > 0  # the recomputed part really ran again in the backward pass
    assert loss_rc == pytest.approx(loss, abs=1e-6)
    assert any(g.abs().max() > 1e-4 for g in grads.values())
    for key, grad in grads.items():
        torch.testing.assert_close(grads_rc[key], grad, atol=1e-6, rtol=1e-5, msg=key)


@pytest.mark.usefixtures("megatron_world")
def test_train_step_lowers_the_loss_on_a_fixed_batch():
    _, _, model = megatron_model("qwen3")
    optimizer, scheduler = build_optimizer(model.chunks, OptimizerSettings(lr=2e-4))
    samples = random_samples([9, 4, 13, 7, 10], seed=6)
    old = compute_logprobs(model.chunks, make_micro_batches(samples, 10_000, packed=False))
    samples = [dataclasses.replace(s, old_logprobs=lp) for s, lp in zip(samples, old)]
    batches = make_micro_batches(samples, 30, packed=False)
    history = [train_step(model.chunks, optimizer, scheduler, batches) for _ in range(4)]
    losses = [m.loss for m in history]
    assert losses[-1] < losses[0] - 0.05 and losses == sorted(losses, reverse=True)
    first = history[0]
    assert first.ratio_mean == pytest.approx(1.0) and first.clip_frac == 0.0  # old = current at step 0
    assert first.lr == 2e-4 and not first.skipped and first.grad_norm > 0
    assert first.micro_batches == len(batches) and first.loss_tokens == sum(s.num_loss_tokens for s in samples)
    assert set(first.to_dict()) >= {"loss", "pg_loss", "clip_frac", "grad_norm", "lr", "loss_tokens", "skipped",
                                     "tis_weight_mean", "tis_clip_frac", "rollout_logprob_abs_diff", "rollout_kl"}


@pytest.mark.usefixtures("megatron_world")
def test_a_learning_rate_of_zero_trains_the_whole_step_and_changes_no_weight():
    """The learning check's control (docs/learning.md): lr 0 runs the real step (loss, gradients,
    clipping, Adam's moments, decoupled weight decay) and leaves every parameter as it was."""
    _, _, model = megatron_model("qwen3")
    optimizer, scheduler = build_optimizer(model.chunks, OptimizerSettings(lr=0.0, weight_decay=0.1))
    before = {name: p.detach().clone() for name, p in model.chunks[0].named_parameters()}
    samples = random_samples([9, 4, 13], seed=3)
    metrics = train_step(model.chunks, optimizer, scheduler, make_micro_batches(samples, 30, packed=False))
    assert metrics.grad_norm > 0 and metrics.loss != 0 and not metrics.skipped and metrics.lr == 0.0
    changed = [name for name, p in model.chunks[0].named_parameters() if not torch.equal(p.detach(), before[name])]
    assert not changed, changed[:5]


@pytest.mark.usefixtures("megatron_world")
def test_packed_micro_batches_are_refused_by_the_local_attention():
    _, _, model = megatron_model("qwen3")
    batches = make_micro_batches(random_samples([5, 6]), 1000, packed=True)
    with pytest.raises(ValueError, match="Transformer Engine"):
        compute_logprobs(model.chunks, batches)


@pytest.mark.usefixtures("megatron_world")
def test_build_model_checks_layout_and_options():
    init_parallel(ParallelLayout(), seed=1)
    _, spec = tiny_hf("qwen3")
    with pytest.raises(RuntimeError, match="tp, pp, ep, etp"):
        build_model(spec, ParallelLayout(tp=2), options=FP32)
    with pytest.raises(ValueError, match="perform_initialization"):
        build_transformer_config(spec, ParallelLayout(tp=2), dataclasses.replace(FP32, perform_initialization=False))


@pytest.mark.usefixtures("megatron_world")
def test_micro_batch_without_loss_tokens_adds_nothing():
    _, _, model = megatron_model("qwen3")
    samples = random_samples([9, 7], seed=8, logprobs=True)
    prompt_only = TrainSample(torch.arange(30) % VOCAB, torch.zeros(29), 1.0)  # longest: own micro-batch
    settings = LossSettings(kl_coef=0.1)
    base = forward_backward(model.chunks, make_micro_batches(samples, 20, packed=False), settings)
    grads = main_grads(model)
    plus = [dataclasses.replace(prompt_only, **{n: torch.zeros(29) for n in ("old_logprobs", "rollout_logprobs", "ref_logprobs")})]
    batches = make_micro_batches(samples + plus, 20, packed=False)
    assert any(mb.num_loss_tokens == 0 for mb in batches)
    more = forward_backward(model.chunks, batches, settings)
    assert more.loss == pytest.approx(base.loss, abs=1e-6) and more.loss_tokens == base.loss_tokens
    assert more.tokens == base.tokens + 30 and more.samples == 3
    for key, grad in grads.items():
        torch.testing.assert_close(main_grads(model)[key], grad, atol=1e-6, rtol=1e-5, msg=key)


@pytest.mark.usefixtures("megatron_world")
def test_overlapped_gradient_reduction_starts_in_the_backward_and_keeps_the_gradients(tmp_path):
    """optimizer.overlap_grad_reduce reaches the learner's DDP wrapping: each gradient bucket's
    data-parallel reduction then starts from the backward pass of the last micro-batch (from the
    second step on: Megatron learns the buckets' readiness in the first), and the loss and
    gradients are those of the reduction after the backward."""
    import json
    from types import SimpleNamespace

    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup

    from support.hf_fixtures import save_tiny_hf
    from spade.training.learner import Learner, LearnerOptions

    hf_dir = save_tiny_hf("qwen3-moe", tmp_path / "model")
    hf_config = json.loads((hf_dir / "config.json").read_text())
    batches = make_micro_batches(random_samples([9, 4, 13, 7], seed=5, logprobs=True), 20, packed=False)
    assert len(batches) > 1
    started_in_backward: list[bool] = []
    start = _ParamAndGradBucketGroup.start_grad_sync

    def watched_start(self, *args, **kwargs):
        started_in_backward.append(torch._C._current_graph_task_id() != -1)
        return start(self, *args, **kwargs)

    results = {}
    for overlap in (False, True):
        init_parallel(ParallelLayout(), seed=1234)
        options = LearnerOptions(optimizer=OptimizerSettings(overlap_grad_reduce=overlap), loss=LossSettings(),
                                 micro_batch_tokens=64, dtype=torch.float32, core_attention="unfused")
        ctx = SimpleNamespace(dp_size=1, dp_rank=0, device=torch.device("cpu"))
        model = Learner.build(hf_dir, hf_config, ParallelLayout(), ctx, options).model
        assert model.chunks[0].ddp_config.overlap_grad_reduce is overlap
        steps = []
        for _ in range(2):
            started_in_backward.clear()
            _ParamAndGradBucketGroup.start_grad_sync = watched_start
            try:
                summary = forward_backward(model.chunks, batches, LossSettings())
            finally:
                _ParamAndGradBucketGroup.start_grad_sync = start
            steps.append((summary.loss, main_grads(model), list(started_in_backward)))
        results[overlap] = steps
    for (loss, grads, starts), (loss_overlap, grads_overlap, starts_overlap) in zip(results[False], results[True]):
        assert starts and not any(starts)
        assert loss_overlap == pytest.approx(loss, abs=1e-6)
        for key, grad in grads.items():
            torch.testing.assert_close(grads_overlap[key], grad, atol=1e-6, rtol=1e-5, msg=key)
    assert results[True][1][2] and all(results[True][1][2])


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "examples" / "recipes").glob("*30b*.yaml")))
def test_30b_recipes_overlap_the_gradient_reduction(recipe):
    from spade.train_config import load_train_config

    assert load_train_config(ROOT / "examples" / "recipes" / recipe, []).optimizer.overlap_grad_reduce is True
