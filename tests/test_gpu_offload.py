"""spade.training.offload on a CUDA GPU: the device memory really goes, comes back, bit for bit.

Skipped without CUDA (conftest). test_offload.py covers the same copy / free / restore logic on
CPU tensors; here the allocator's own numbers are checked: ``torch.cuda.memory_allocated()``
drops by (nearly) the bytes reported moved and rises back, the host buffer is pinned, the values
(snapshotted to the CPU, so the snapshot itself takes no device memory) are bit-identical and a
train step afterwards works. One tiny model in bf16 with and without the distributed optimizer,
and a Qwen3-0.6B-shaped random-weight model whose byte counts are checked against its size.
"""

from __future__ import annotations

import math

import pytest
import torch

from megatron_fixtures import megatron_world  # noqa: F401  (fixture)
from spade.models import ParallelLayout, read_model_spec
from spade.models.builder import BuildOptions
from spade.training import (
    OptimizerSettings,
    build_model,
    build_optimizer,
    compute_logprobs,
    init_parallel,
    make_micro_batches,
    train_step,
)
from spade.training.offload import TrainingOffloader
from test_models_parity import checkpoint_state, tiny_hf
from test_offload import live_tensors
from test_training import random_samples

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("megatron_world")]

QWEN3_0_6B = dict(  # Qwen/Qwen3-0.6B config.json shapes (weights random)
    architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=1024, intermediate_size=3072,
    num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
    tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=40960,
)


def gpu_trainer(spec, hf_state, *, distributed: bool):
    init_parallel(ParallelLayout(), seed=1234)
    model = build_model(spec, ParallelLayout(), options=BuildOptions(params_dtype=torch.bfloat16),
                        hf_state=hf_state, use_distributed_optimizer=distributed)
    assert next(model.chunks[0].parameters()).is_cuda
    optimizer, scheduler = build_optimizer(model.chunks, OptimizerSettings(
        lr=1e-4, use_distributed_optimizer=distributed))
    return model, optimizer, scheduler


def cpu_snapshot(model, optimizer) -> dict[str, torch.Tensor]:
    return {name: t.detach().to("cpu", copy=True) for name, t in live_tensors(model, optimizer).items()}


def allocated() -> int:
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def round_trip(model, optimizer, micro_batches, *, min_released: float = 0.0):
    """Offload and onload once, checking the allocator's numbers and the values; returns the report.

    ``min_released``: the share of the moved bytes that ``empty_cache`` must hand back to the
    driver (``memory_reserved``). Small tensors share the allocator's 2 MiB segments with other
    allocations, so only a model of real size can promise much here."""
    logprobs_before = compute_logprobs(model.chunks, micro_batches)
    values_before = cpu_snapshot(model, optimizer)
    torch.cuda.empty_cache()
    offloader = TrainingOffloader(model.chunks, optimizer)
    assert offloader.moves

    before = allocated()
    reserved_before = torch.cuda.memory_reserved()
    report = offloader.offload()
    after = allocated()
    assert report.moved_bytes == report.total_bytes > 0
    assert before - after >= 0.9 * report.moved_bytes, (before, after, report)
    assert reserved_before - torch.cuda.memory_reserved() >= min_released * report.moved_bytes
    assert offloader.host_buffer_pinned and offloader.host_buffer_bytes >= report.moved_bytes
    assert all(t.untyped_storage().nbytes() == 0 for t in live_tensors(model, optimizer).values()
               if t.is_cuda)
    assert offloader.offload().moved_bytes == 0  # twice is harmless

    back = offloader.onload()
    restored = allocated()
    assert back.moved_bytes == report.moved_bytes
    assert restored - after >= 0.9 * report.moved_bytes and restored >= before - 0.1 * report.moved_bytes
    assert offloader.onload().moved_bytes == 0

    values_after = cpu_snapshot(model, optimizer)
    for name, value in values_before.items():
        assert torch.equal(values_after[name], value), name
    for got, want in zip(compute_logprobs(model.chunks, micro_batches), logprobs_before):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)  # the weights are equal (above)
    return report


@pytest.mark.parametrize("distributed", [False, True], ids=["adam", "distopt"])
def test_offload_frees_gpu_memory_and_restores_it_exactly(distributed):
    hf_model, spec = tiny_hf("qwen3")
    state = checkpoint_state(hf_model, spec)
    model, optimizer, scheduler = gpu_trainer(spec, state, distributed=distributed)
    micro_batches = make_micro_batches(random_samples([9, 5, 12, 7], seed=1), 4096, packed=False)
    first = train_step(model.chunks, optimizer, scheduler, micro_batches)  # Adam state exists now

    report = round_trip(model, optimizer, micro_batches)
    assert report.bytes_by_kind["optimizer_state"] > 0 and report.bytes_by_kind["grads"] > 0

    # the next step matches a twin that never offloaded (GPU backward may use atomics: close, not equal)
    twin, twin_optimizer, twin_scheduler = gpu_trainer(spec, state, distributed=distributed)
    assert train_step(twin.chunks, twin_optimizer, twin_scheduler, micro_batches).loss == pytest.approx(first.loss)
    got = train_step(model.chunks, optimizer, scheduler, micro_batches)
    want = train_step(twin.chunks, twin_optimizer, twin_scheduler, micro_batches)
    assert not got.skipped and math.isfinite(got.grad_norm)
    assert got.loss == pytest.approx(want.loss, abs=1e-3)
    assert got.grad_norm == pytest.approx(want.grad_norm, rel=1e-2)


@pytest.mark.slow
def test_qwen3_0_6b_shaped_model_offloads_its_whole_training_state():
    spec = read_model_spec(QWEN3_0_6B)
    model, optimizer, scheduler = gpu_trainer(spec, None, distributed=False)
    micro_batches = make_micro_batches(random_samples([64, 48], seed=2), 4096, packed=False)
    train_step(model.chunks, optimizer, scheduler, micro_batches)

    params = list(model.unwrapped()[0].parameters())
    numel = sum(p.numel() for p in params)
    report = round_trip(model, optimizer, micro_batches, min_released=0.5)
    counts = report.bytes_by_kind
    assert counts["params"] == pytest.approx(2 * numel, rel=0.01)  # bf16 weights
    assert counts["grads"] == pytest.approx(4 * numel, rel=0.01)  # the fp32 DDP grad buffer
    assert counts["main_params"] == pytest.approx(4 * numel, rel=0.01)  # fp32 main params
    assert 8 * numel <= counts["optimizer_state"] <= 8 * numel + 4 * len(params)  # moments (+ step)
    assert report.moved_bytes == pytest.approx(18 * numel, rel=0.01)  # ~10 GiB for 596M parameters
    assert not train_step(model.chunks, optimizer, scheduler, micro_batches).skipped
