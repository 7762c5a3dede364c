"""spade.training.offload on CPU: the storage free / restore path, bit-exactness, and a train step
after a round trip.

On the CPU the offloader is a no-op by default (host and device are the same memory);
``move_on_host=True`` runs the path the GPU takes (copy each storage to a host buffer, shrink it
to 0 bytes, grow it back and copy in), without pinning or ``torch.cuda`` calls. The tiny Qwen3
model (tests/test_models_parity.tiny_hf) is trained in fp32 (the optimizer's parameters alias
the model's) and bf16 (separate fp32 main parameters), with and without the distributed
optimizer, in a single-process gloo world. test_gpu_offload.py checks the GPU side.
"""

from __future__ import annotations

import pytest
import torch

from megatron_fixtures import megatron_world  # noqa: F401  (fixture)
from spade.models import ParallelLayout
from spade.models.builder import BuildOptions
from spade.training import OptimizerSettings, build_model, build_optimizer, init_parallel, make_micro_batches, train_step
from spade.training.offload import KINDS, TrainingOffloader
from test_models_parity import checkpoint_state, tiny_hf
from test_training import random_samples

pytestmark = pytest.mark.usefixtures("megatron_world")

SETUPS = [
    pytest.param(torch.float32, False, id="fp32"),
    pytest.param(torch.float32, True, id="fp32-distopt"),
    pytest.param(torch.bfloat16, False, id="bf16"),
    pytest.param(torch.bfloat16, True, id="bf16-distopt"),
]


def build(dtype: torch.dtype, distributed: bool):
    """A fresh, identically seeded tiny model with its Adam (same weights on every call)."""
    init_parallel(ParallelLayout(), seed=1234)
    hf_model, spec = tiny_hf("qwen3")
    model = build_model(spec, ParallelLayout(), options=BuildOptions(params_dtype=dtype),
                        hf_state=checkpoint_state(hf_model, spec), use_distributed_optimizer=distributed)
    optimizer, scheduler = build_optimizer(model.chunks, OptimizerSettings(
        lr=1e-3, use_distributed_optimizer=distributed))
    return model, optimizer, scheduler


def batches(seed: int):
    return make_micro_batches(random_samples([9, 5, 12, 7], seed=seed), 20, packed=False)


def torch_optimizers(optimizer):
    return [inner.optimizer for inner in optimizer.chained_optimizers]


def live_tensors(model, optimizer) -> dict[str, torch.Tensor]:
    """Every tensor the offloader must restore, by a stable name (the live objects, not copies)."""
    out = {}
    ddp = model.chunks[0]
    for index, buffer in enumerate(ddp.buffers):
        out[f"grad_data:{index}"] = buffer.grad_data
        if buffer.param_data is not None:
            out[f"param_data:{index}"] = buffer.param_data
    for name, param in model.unwrapped()[0].named_parameters():
        out[f"param:{name}"] = param
        out[f"main_grad:{name}"] = param.main_grad
    for i, torch_optimizer in enumerate(torch_optimizers(optimizer)):
        for g, group in enumerate(torch_optimizer.param_groups):
            for j, param in enumerate(group["params"]):
                out[f"main_param:{i}.{g}.{j}"] = param
                for key, value in torch_optimizer.state.get(param, {}).items():
                    out[f"{key}:{i}.{g}.{j}"] = value
    return out


def snapshot(model, optimizer) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in live_tensors(model, optimizer).items()}


def assert_identical(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def trained(dtype, distributed):
    """A model after one update, so main_grad, main params and Adam moments are all non-trivial."""
    model, optimizer, scheduler = build(dtype, distributed)
    train_step(model.chunks, optimizer, scheduler, batches(1))
    return model, optimizer, scheduler


# ------------------------------------------------------------------ the CPU default


def test_on_cpu_offload_is_a_noop_that_reports_what_it_covers():
    model, optimizer, _ = trained(torch.float32, False)
    before = snapshot(model, optimizer)
    offloader = TrainingOffloader(model.chunks, optimizer)
    assert not offloader.moves and not offloader.offloaded
    report = offloader.offload()
    assert offloader.offloaded and report.moved_bytes == 0 and report.direction == "offload"
    assert set(report.bytes_by_kind) == set(KINDS)
    assert all(t.untyped_storage().nbytes() > 0 for t in live_tensors(model, optimizer).values())

    real = TrainingOffloader(model.chunks, optimizer, move_on_host=True)
    assert real.offload().bytes_by_kind == report.bytes_by_kind  # the same storages, counted alike
    real.onload()
    assert offloader.onload().moved_bytes == 0 and not offloader.offloaded
    assert_identical(snapshot(model, optimizer), before)


# ------------------------------------------------------------------ the real path, on CPU tensors


@pytest.mark.parametrize("dtype, distributed", SETUPS)
def test_offload_frees_every_storage_and_onload_restores_every_bit(dtype, distributed):
    model, optimizer, _ = trained(dtype, distributed)
    before = snapshot(model, optimizer)
    live = live_tensors(model, optimizer)
    # small host blocks: the grad buffer and the embedding's Adam moments span several of them
    offloader = TrainingOffloader(model.chunks, optimizer, move_on_host=True, host_block_bytes=2**16)

    report = offloader.offload()
    assert offloader.offloaded
    assert report.moved_bytes <= offloader.host_buffer_bytes < report.moved_bytes + 2**16 + 512 * report.storages
    freed = {name for name, tensor in live.items() if tensor.untyped_storage().nbytes() == 0}
    assert freed == set(live), sorted(set(live) - freed)
    assert report.moved_bytes == report.total_bytes > 0
    counts = report.bytes_by_kind
    assert counts["params"] > 0 and counts["grads"] > 0 and counts["optimizer_state"] > 0
    # fp32: the optimizer's parameters are the model's (or views of the DDP param buffer)
    assert (counts["main_params"] > 0) == (dtype == torch.bfloat16)
    grad_bytes = sum(b.grad_data.numel() * b.grad_data.element_size() for b in model.chunks[0].buffers)
    assert counts["grads"] == grad_bytes  # main_grads and the optimizer's .grad are views of the buffer

    again = offloader.offload()  # offloading twice is harmless
    assert again.moved_bytes == 0 and offloader.offloaded

    back = offloader.onload()
    assert back.moved_bytes == report.moved_bytes and not offloader.offloaded
    assert offloader.onload().moved_bytes == 0  # and so is onloading twice
    assert_identical(snapshot(model, optimizer), before)

    # the aliases survived: main_grads (and dist-opt params) are still views of the DDP buffers
    buffer = model.chunks[0].buffers[0]
    for param in model.unwrapped()[0].parameters():
        assert param.main_grad.untyped_storage().data_ptr() == buffer.grad_data.untyped_storage().data_ptr()
        if distributed:
            assert param.untyped_storage().data_ptr() == buffer.param_data.untyped_storage().data_ptr()


@pytest.mark.parametrize("dtype, distributed", SETUPS)
def test_train_step_after_a_round_trip_is_the_same_as_without(dtype, distributed):
    plain = build(dtype, distributed)
    cycled = build(dtype, distributed)
    offloader = TrainingOffloader(cycled[0].chunks, cycled[1], move_on_host=True)
    for step in range(3):
        if step > 0:  # step 0: before Adam has any state
            with offloader.released() as report:
                assert report.moved_bytes > 0
                assert cycled[0].unwrapped()[0].decoder.layers[0].mlp.linear_fc1.weight.untyped_storage().nbytes() == 0
        want = train_step(plain[0].chunks, plain[1], plain[2], batches(step))
        got = train_step(cycled[0].chunks, cycled[1], cycled[2], batches(step))
        assert (got.loss, got.grad_norm, got.lr) == (want.loss, want.grad_norm, want.lr), step
    assert_identical(snapshot(cycled[0], cycled[1]), snapshot(plain[0], plain[1]))


def test_state_created_after_the_first_offload_is_covered_later():
    model, optimizer, scheduler = build(torch.float32, False)
    offloader = TrainingOffloader(model.chunks, optimizer, move_on_host=True)
    first = offloader.offload()
    assert first.bytes_by_kind["optimizer_state"] == 0  # no Adam state before the first step
    offloader.onload()
    train_step(model.chunks, optimizer, scheduler, batches(0))
    second = offloader.offload()
    exp_avg = torch_optimizers(optimizer)[0].state
    assert second.bytes_by_kind["optimizer_state"] > 0
    assert all(s["exp_avg_sq"].untyped_storage().nbytes() == 0 for s in exp_avg.values())
    assert second.moved_bytes > first.moved_bytes
    offloader.onload()
    metrics = second.metrics()
    assert metrics["offload/offload_gb"] == pytest.approx(second.moved_bytes / 2**30)
    assert {"offload/offload_s", "offload/params_gb", "offload/optimizer_state_gb"} <= set(metrics)


def test_a_model_without_optimizer_and_plain_modules_work():
    module = torch.nn.Linear(4, 3)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    offloader = TrainingOffloader([module], move_on_host=True)
    report = offloader.offload()
    assert report.bytes_by_kind["params"] == (12 + 3) * 4 and module.weight.untyped_storage().nbytes() == 0
    offloader.onload()
    for key, value in module.state_dict().items():
        assert torch.equal(value, before[key])


@pytest.mark.parametrize("dtype, distributed", SETUPS)
def test_two_stage_offload_state_first_then_parameters(dtype, distributed):
    """The trainer's order: gradients and optimizer state leave first while the parameters stay
    on the device (they are streamed to the rollout engine), then the parameters follow. The two
    offloaders split the storages without overlap, and bring back every bit."""
    model, optimizer, _ = trained(dtype, distributed)
    before = snapshot(model, optimizer)
    live = live_tensors(model, optimizer)
    state = TrainingOffloader(model.chunks, optimizer, kinds=("grads", "main_params", "optimizer_state"),
                              move_on_host=True)
    params = TrainingOffloader(model.chunks, optimizer, kinds=("params",), move_on_host=True)
    whole = TrainingOffloader(model.chunks, optimizer).offload()  # what one offloader would cover

    first = state.offload()
    assert first.moved_bytes == whole.total_bytes - whole.bytes_by_kind["params"] > 0
    for name, param in model.unwrapped()[0].named_parameters():
        assert param.untyped_storage().nbytes() > 0, name  # still usable for the weight sync
    second = params.offload()
    assert second.moved_bytes == whole.bytes_by_kind["params"] > 0
    assert all(t.untyped_storage().nbytes() == 0 for t in live.values())

    params.onload()
    state.onload()
    assert_identical(snapshot(model, optimizer), before)
    with pytest.raises(ValueError, match="kinds"):
        TrainingOffloader(model.chunks, optimizer, kinds=("weights",))
