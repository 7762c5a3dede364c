"""Each CPU patch of megatron_patches, in one process with a gloo world of size 1.

Where it can be shown cheaply, a test first checks that the upstream function still fails on this
CPU machine (so the patch is not dead code), then that the replacement gives the right result.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import megatron_patches
import prewarmed
from megatron_fixtures import megatron_world  # noqa: F401  (fixture)
from megatron_patches._util import original_of

pytestmark = pytest.mark.usefixtures("megatron_world")

ROOT = Path(__file__).resolve().parents[2]
needs_cpu = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU patches stand down on CUDA")


def tiny_config(**overrides):
    from megatron.core.transformer import TransformerConfig

    fields = dict(
        num_layers=1,
        hidden_size=32,
        ffn_hidden_size=48,
        num_attention_heads=4,
        num_query_groups=2,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


def tiny_gpt(config, vocab_size: int = 64):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(
        num_experts=config.num_moe_experts, qk_layernorm=config.qk_layernorm, normalization="RMSNorm"
    )
    return GPTModel(
        config, spec, vocab_size=vocab_size, max_sequence_length=64, position_embedding_type="rope"
    )


def run_tokens(model, batch: int = 2, seq: int = 8, vocab_size: int = 64):
    ids = torch.randint(0, vocab_size, (batch, seq))
    positions = torch.arange(seq).expand(batch, -1)
    return model(ids, positions, None)


# ------------------------------------------------------------------ apply_all, version, CUDA


def test_apply_all_is_idempotent():
    megatron_patches.apply_all()
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    patched = RotaryEmbedding.get_emb
    assert not any(megatron_patches.apply_all().values())
    assert RotaryEmbedding.get_emb is patched
    assert {p.NAME for p in megatron_patches.PATCHES} >= {
        "rotary", "memory_buffer", "causal_mask", "rng", "moe_router", "moe_gemm",
        "moe_dispatcher", "all_to_all", "norm_sequence_parallel", "distrib_optimizer_steps",
        "parallel_state_teardown",
    }


def test_version_mismatch_is_refused(monkeypatch):
    from megatron.core import package_info

    monkeypatch.setattr(package_info, "__version__", "0.15.2")
    with pytest.raises(RuntimeError) as raised:
        megatron_patches.apply_all()
    assert "0.15.2" in str(raised.value) and "0.16.1" in str(raised.value)


def test_installed_version_is_the_pinned_one():
    assert megatron_patches.installed_megatron_version() == megatron_patches.EXPECTED_MEGATRON_CORE_VERSION


def test_patches_stand_down_when_cuda_is_available():
    """Fresh interpreter that claims CUDA: nothing CPU-specific may be replaced."""
    script = textwrap.dedent(
        """
        import json, torch
        torch.cuda.is_available = lambda: True
        import megatron_patches
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
        from megatron.core.transformer.torch_norm import WrappedTorchNorm
        result = megatron_patches.apply_all()
        result["_rotary_marked"] = hasattr(RotaryEmbedding.get_emb, "__spade_patch__")
        with megatron_patches.cpu_device_mode():
            try:
                torch.zeros(1, device="cuda")
                result["_mode_active"] = True
            except Exception:
                result["_mode_active"] = False
        print(json.dumps(result))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # moe_gemm and distrib_optimizer_steps fix upstream bugs without TE/Apex, parallel_state_teardown
    # one of the parallel state: independent of CUDA.
    assert {k for k, v in result.items() if v} <= {"moe_gemm", "distrib_optimizer_steps", "parallel_state_teardown",
                                                   "norm_sequence_parallel"}


def test_local_spec_norms_build_under_sequence_parallel_when_cuda_is_available():
    """A GPU machine without Transformer Engine builds the local spec, whose RMSNorms are
    megatron-core's torch norm; under sequence parallelism (every multi-GPU recipe) they must build
    there too, tagged for the tensor-parallel gradient all-reduce. Fresh interpreter that claims CUDA."""
    script = textwrap.dedent(
        """
        import json, torch
        import torch.nn.functional as F
        torch.cuda.is_available = lambda: True
        import megatron_patches
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer import TransformerConfig
        from megatron.core.transformer.spec_utils import build_module

        megatron_patches.apply_all()
        config = TransformerConfig(
            num_layers=1, hidden_size=32, ffn_hidden_size=48, num_attention_heads=4, num_query_groups=2,
            normalization="RMSNorm", qk_layernorm=True, gated_linear_unit=True, activation_func=F.silu,
            add_bias_linear=False, tensor_model_parallel_size=2, sequence_parallel=True,
            use_cpu_initialization=True)
        layer = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm").submodules
        attention = layer.self_attention.submodules
        norms = {
            "input_layernorm": build_module(layer.input_layernorm, config=config, hidden_size=32, eps=1e-6),
            "pre_mlp_layernorm": build_module(layer.pre_mlp_layernorm, config=config, hidden_size=32, eps=1e-6),
            "q_layernorm": build_module(attention.q_layernorm, config=config, hidden_size=8, eps=1e-6),
        }
        x = torch.randn(5, 32)
        print(json.dumps({
            name: {"type": type(norm).__name__,
                   "tagged": all(getattr(p, "sequence_parallel", False) for p in norm.parameters())}
            for name, norm in norms.items()
        } | {"_matches": torch.equal(norms["input_layernorm"](x), torch.nn.RMSNorm(32, eps=1e-6)(x))}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result.pop("_matches") is True
    assert result == {name: {"type": "RMSNorm", "tagged": True}
                      for name in ("input_layernorm", "pre_mlp_layernorm", "q_layernorm")}


# ------------------------------------------------------------------ rotary


@needs_cpu
@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_get_emb_on_cpu(interleaved):
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    rope = RotaryEmbedding(
        kv_channels=8, rotary_percent=1.0, rotary_interleaved=interleaved, rotary_base=100,
        use_cpu_initialization=True,
    )
    with pytest.raises(AssertionError):  # upstream moves inv_freq to CUDA
        original_of(RotaryEmbedding, "get_emb")(rope, 5)
    emb = rope.get_emb(5, offset=2)
    inv_freq = 1.0 / (100 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    angles = torch.outer(torch.arange(2, 7, dtype=torch.float32), inv_freq)
    expected = angles.repeat_interleave(2, dim=-1) if interleaved else torch.cat((angles, angles), -1)
    assert emb.shape == (5, 1, 1, 8) and emb.device.type == "cpu"
    torch.testing.assert_close(emb[:, 0, 0], expected)


# ------------------------------------------------------------------ parallel state teardown


_TEARDOWN_RELEASES_GROUPS = """
import glob, sys, torch, torch.distributed as dist
import megatron_patches
from megatron_patches._util import original_of
megatron_patches.apply_all()
from megatron.core import parallel_state as ps
if sys.argv[2] == "upstream":
    ps.destroy_model_parallel = original_of(ps, "destroy_model_parallel")
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

def gloo_threads():
    return sum("gloo" in open(p).read() for p in glob.glob("/proc/self/task/*/comm"))

dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
dist.barrier()  # a worker names itself once running: after a collective it has (none counted otherwise, under load)
before = gloo_threads()
ps.initialize_model_parallel(1, 1)
rope = RotaryEmbedding(kv_channels=8, rotary_percent=1.0, rotary_base=100, use_cpu_initialization=True,
                       cp_group=ps.get_context_parallel_group())
rope(5)  # an lru_cache'd method: the cache holds rope, and rope its group
del rope
ps.destroy_model_parallel()
dist.destroy_process_group()
print(before, gloo_threads())
"""


@pytest.mark.parametrize("patched", [False, True])
def test_destroying_the_parallel_state_releases_every_group(tmp_path, patched):
    """After ``destroy_model_parallel`` and ``destroy_process_group`` no gloo thread is left: every
    group was released and torn down. Upstream alone leaves groups held (four module globals and the
    rotary embeddings' method caches), whose threads then run into interpreter exit."""
    path = tmp_path / "teardown.py"
    path.write_text(_TEARDOWN_RELEASES_GROUPS)
    done = subprocess.run([prewarmed.python(), str(path), str(tmp_path / "rendezvous"),
                           "patched" if patched else "upstream"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = map(int, done.stdout.split()[-2:])
    assert before > 0
    assert (after == 0) == patched, (before, after)


# ------------------------------------------------------------------ global memory buffer


@needs_cpu
def test_global_memory_buffer_on_cpu():
    from megatron.core.utils import GlobalMemoryBuffer

    buffers = GlobalMemoryBuffer()
    with pytest.raises(AssertionError):
        original_of(GlobalMemoryBuffer, "get_tensor")(buffers, (2, 3), torch.float32, "x")
    first = buffers.get_tensor((2, 3), torch.float32, "x")
    smaller = buffers.get_tensor((4,), torch.float32, "x")
    assert first.shape == (2, 3) and first.device.type == "cpu"
    assert smaller.data_ptr() == first.data_ptr()  # reused
    bigger = buffers.get_tensor((5, 5), torch.float32, "x")
    assert bigger.shape == (5, 5) and buffers.buffer[("x", torch.float32)].numel() == 25


# ------------------------------------------------------------------ causal mask


@needs_cpu
def test_causal_masks_on_cpu():
    from megatron.core.fusions import fused_softmax
    from megatron.core.transformer import utils as transformer_utils

    with pytest.raises(AssertionError):
        original_of(transformer_utils, "get_default_causal_mask")(4)
    for module in (transformer_utils, fused_softmax):
        mask = module.get_default_causal_mask(4)
        assert mask.dtype == torch.bool and mask.device.type == "cpu"
        assert torch.equal(mask, torch.ones(4, 4).triu(1).bool())

    sq, skv, (left, right) = 3, 6, (2, 0)
    window = transformer_utils.get_sliding_window_causal_mask(sq, skv, (left, right))
    for i in range(sq):
        for j in range(skv):
            offset = j - (i + skv - sq)  # key position relative to the query's aligned position
            assert bool(window[i, j]) == (not -left <= offset <= right)


@needs_cpu
def test_unfused_softmax_builds_its_causal_mask_on_cpu():
    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.utils import attention_mask_func

    softmax = FusedScaleMaskSoftmax(
        input_in_fp16=False, input_in_bf16=False, attn_mask_type=AttnMaskType.causal,
        scaled_masked_softmax_fusion=False, mask_func=attention_mask_func,
        softmax_in_fp32=True, scale=None,
    )
    scores = torch.randn(1, 2, 5, 5)
    probs = softmax(scores, None)
    expected = torch.softmax(scores.masked_fill(torch.ones(5, 5).triu(1).bool(), -math.inf), -1)
    torch.testing.assert_close(probs, expected)


# ------------------------------------------------------------------ rng tracker


@needs_cpu
def test_rng_streams_on_cpu():
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    megatron_patches.seed_model_parallel_rng(7)
    tracker = get_cuda_rng_tracker()
    assert {"data-parallel-rng", "model-parallel-rng", "expert-parallel-rng"} <= set(tracker.get_states())
    reference = torch.rand(4)

    megatron_patches.seed_model_parallel_rng(7)  # seeding installs a fresh tracker
    with get_cuda_rng_tracker().fork():
        first = torch.rand(4)
    after_fork = torch.rand(4)
    with get_cuda_rng_tracker().fork():
        second = torch.rand(4)
    assert torch.equal(after_fork, reference)  # the default stream did not move
    assert not torch.equal(first, reference) and not torch.equal(first, second)  # own, advancing

    megatron_patches.seed_model_parallel_rng(7)
    with get_cuda_rng_tracker().fork():
        assert torch.equal(torch.rand(4), first)  # reproducible


@needs_cpu
def test_activation_recompute_replays_dropout_on_cpu():
    from megatron.core import tensor_parallel

    weight = torch.randn(6, 6, requires_grad=True)

    def block(x):
        with tensor_parallel.get_cuda_rng_tracker().fork():
            return F.dropout(x @ weight, p=0.5, training=True)

    x = torch.randn(3, 6, requires_grad=True)
    megatron_patches.seed_model_parallel_rng(11)
    block(x).sum().backward()
    plain = (x.grad.clone(), weight.grad.clone())
    x.grad, weight.grad = None, None

    megatron_patches.seed_model_parallel_rng(11)
    tensor_parallel.checkpoint(block, False, x).sum().backward()
    torch.testing.assert_close((x.grad, weight.grad), plain)


# ------------------------------------------------------------------ MoE


@needs_cpu
def test_router_gating_keeps_weight_on_cpu():
    from megatron.core.transformer.moe.router import Router, TopKRouter
    from megatron.core.process_groups_config import ProcessGroupCollection

    config = tiny_config(num_moe_experts=4, moe_router_topk=2, moe_router_dtype="fp32")
    router = TopKRouter(config, pg_collection=ProcessGroupCollection.use_mpu_process_groups())
    tokens = torch.randn(5, 32)
    with pytest.raises(AssertionError):
        original_of(Router, "gating")(router, tokens)
    logits = router.gating(tokens)
    assert router.weight.device.type == "cpu" and logits.dtype == torch.float32
    torch.testing.assert_close(logits, tokens @ router.weight.t())


def test_router_gemm_name_is_bound():
    from megatron.core.transformer.moe import moe_utils

    assert hasattr(moe_utils, "te_general_gemm")
    inp = torch.randn(3, 8, requires_grad=True)
    weight = torch.randn(4, 8, requires_grad=True)
    moe_utils.router_gating_linear(inp, weight, None, torch.float32).sum().backward()
    torch.testing.assert_close(weight.grad, torch.ones(3, 4).t() @ inp.detach())


@needs_cpu
def test_move_tensor_to_host_converts_cpu_tensors():
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    splits = torch.tensor([3, 1])
    assert original_of(moe_utils, "maybe_move_tensor_to_cpu")(splits, as_numpy=True) is splits
    for module in (moe_utils, token_dispatcher):
        converted = module.maybe_move_tensor_to_cpu(splits, as_numpy=True)
        assert converted.tolist() == [3, 1] and not torch.is_tensor(converted)
    assert token_dispatcher.MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is not None


@needs_cpu
@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_moe_model_forward_backward_on_cpu(dispatcher):
    config = tiny_config(
        num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16, moe_router_dtype="fp32",
        moe_token_dispatcher_type=dispatcher, moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=0.01, qk_layernorm=True,
    )
    model = tiny_gpt(config)
    logits = run_tokens(model)
    assert logits.shape == (2, 8, 64) and torch.isfinite(logits).all()
    logits.square().mean().backward()
    router = model.decoder.layers[0].mlp.router
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


# ------------------------------------------------------------------ all-to-all


def test_split_sizes_become_lists():
    import numpy as np

    from megatron_patches.all_to_all import as_split_list

    assert as_split_list(None) is None
    for sizes in (torch.tensor([2, 0, 5]), np.array([2, 0, 5]), (2, 0, 5)):
        converted = as_split_list(sizes)
        assert converted == [2, 0, 5] and all(type(s) is int for s in converted)


_TWO_RANK_ALL_TO_ALL = """
import glob, os, sys, time, numpy as np, torch, torch.distributed as dist, torch.multiprocessing as mp

def run(rank, store_path):
    # megatron (which imports torch._dynamo) before the group: dynamo imported later holds on to it
    import megatron_patches
    megatron_patches.apply_all()
    from megatron.core.tensor_parallel.mappings import all_to_all
    # a file rendezvous: no TCP port to race other processes for
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    # rank 0 sends 1 row to itself and 2 to rank 1; rank 1 sends 3 to rank 0 and 0 to itself
    send = {0: np.array([1, 2]), 1: np.array([3, 0])}[rank]
    recv = {0: np.array([1, 3]), 1: np.array([2, 0])}[rank]
    x = torch.full((int(send.sum()), 2), float(rank), requires_grad=True)
    y = all_to_all(dist.group.WORLD, x, recv, send)
    assert y.shape[0] == int(recv.sum()), y.shape
    expected = [0.0] * int(recv[0]) + [1.0] * int(recv[1])
    assert y[:, 0].tolist() == expected, (rank, y)
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    # The graph holds the group: drop it so that destroying the group joins gloo's threads here.
    # A group left to interpreter exit can abort the rank there (SIGABRT, "terminate called
    # without an active exception") when a gloo thread still has a tensor to release.
    del x, y
    dist.barrier()  # neither rank tears gloo down while the other is still in a collective
    dist.destroy_process_group()
    # the thread that ran the last collective can hold the group a moment longer
    deadline = time.monotonic() + 10
    while (gloo := [p for p in glob.glob("/proc/self/task/*/comm") if "gloo" in open(p).read()]) \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not gloo, gloo

if __name__ == "__main__":
    mp.spawn(run, args=(sys.argv[1],), nprocs=2)
    print("ok")
"""


@needs_cpu
def test_uneven_all_to_all_over_gloo(tmp_path):
    """Two gloo ranks exchange uneven splits given as numpy arrays, forward and backward."""
    script = tmp_path / "a2a.py"
    script.write_text(_TWO_RANK_ALL_TO_ALL)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "rendezvous")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


# ------------------------------------------------------------------ norm under sequence parallel


def test_torch_norm_accepts_sequence_parallel():
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    config = SimpleNamespace(
        layernorm_zero_centered_gamma=False, persist_layer_norm=False, sequence_parallel=True,
        memory_efficient_layer_norm=False, normalization="RMSNorm",
    )
    upstream_new = original_of(WrappedTorchNorm, "__new__").__func__
    with pytest.raises(AssertionError):
        upstream_new(WrappedTorchNorm, config, 16, 1e-6)
    norm = WrappedTorchNorm(config, 16, eps=1e-6)
    assert isinstance(norm, torch.nn.RMSNorm) and norm.eps == 1e-6
    assert all(getattr(p, "sequence_parallel", False) for p in norm.parameters())

    config.sequence_parallel = False
    plain = WrappedTorchNorm(config, 16)
    assert not any(getattr(p, "sequence_parallel", False) for p in plain.parameters())


# ------------------------------------------------------------------ cpu_device_mode


@needs_cpu
def test_cpu_device_mode_redirects_cuda_placements():
    x = torch.ones(3)
    with megatron_patches.cpu_device_mode():
        assert torch.zeros(2, device="cuda").device.type == "cpu"
        assert torch.tensor([1.0], device=torch.device("cuda", 0)).device.type == "cpu"
        assert torch.empty(2, device=torch.cuda.current_device()).device.type == "cpu"
        assert x.new_empty((2,), device="cuda:0").device.type == "cpu"
        assert x.cuda() is x
        assert x.to("cuda").device.type == "cpu"
        assert x.type() == "torch.cuda.FloatTensor"
        assert x.type("torch.cuda.HalfTensor").dtype == torch.float16
        torch.cuda.synchronize()
        with megatron_patches.cpu_device_mode():  # nesting
            assert torch.cuda.current_device() == 0
        assert torch.cuda.current_device() == 0
    assert x.type() == "torch.FloatTensor"
    with pytest.raises(AssertionError):
        torch.cuda.current_device()


@needs_cpu
@pytest.mark.parametrize(
    "dtype, distributed_optimizer", [(torch.float32, False), (torch.bfloat16, True)]
)
def test_ddp_and_optimizer_train_under_cpu_device_mode(dtype, distributed_optimizer):
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module

    config = tiny_config(params_dtype=dtype, bf16=dtype == torch.bfloat16)
    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=distributed_optimizer, grad_reduce_in_fp32=True
    )
    model = tiny_gpt(config)
    with pytest.raises(AssertionError):  # upstream DDP allocates its grad buffer on CUDA
        DistributedDataParallel(config, ddp_config, model)

    with megatron_patches.cpu_device_mode():
        wrapped = Float16Module(config, model) if dtype == torch.bfloat16 else model
        ddp = DistributedDataParallel(config, ddp_config, wrapped)
        optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam", lr=1e-2, bf16=dtype == torch.bfloat16, params_dtype=dtype,
                use_distributed_optimizer=distributed_optimizer, clip_grad=1.0,
            ),
            [ddp],
        )
    before = model.embedding.word_embeddings.weight.detach().clone()
    ids = torch.randint(0, 64, (2, 8))
    positions = torch.arange(8).expand(2, -1)
    losses = []
    for _ in range(3):
        with megatron_patches.cpu_device_mode():
            ddp.zero_grad_buffer()
            optimizer.zero_grad()
            loss = ddp(ids, positions, None, labels=ids).float().mean()
            loss.backward()
            finalize_model_grads([ddp])
            updated, grad_norm, _ = optimizer.step()
        assert updated and math.isfinite(grad_norm)
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert not torch.equal(before, model.embedding.word_embeddings.weight.detach())


def test_cpu_device_mode_reaches_custom_function_backward():
    """The autograd engine drops torch-function modes in custom backward; the patch restores it."""

    class AllocatesOnCurrentDevice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2 + torch.zeros(grad.shape, device=torch.cuda.current_device())

    x = torch.ones(3, requires_grad=True)
    with megatron_patches.cpu_device_mode():
        AllocatesOnCurrentDevice.apply(x).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    with pytest.raises(Exception):  # outside the mode the same backward reaches for a GPU
        AllocatesOnCurrentDevice.apply(torch.ones(3, requires_grad=True)).sum().backward()


# ------------------------------------------------------------------ distributed optimizer steps


def _distributed_adam(seed: int = 0):
    """Tiny GPT in DDP with a (torch-Adam) distributed optimizer: (ddp, chained optimizer)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    torch.manual_seed(seed)
    config = tiny_config()
    with megatron_patches.cpu_device_mode():
        ddp = DistributedDataParallel(
            config, DistributedDataParallelConfig(use_distributed_optimizer=True), tiny_gpt(config)
        )
        optimizer = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", lr=1e-2, use_distributed_optimizer=True), [ddp]
        )
    return ddp, optimizer


def _train(ddp, optimizer, steps: int) -> None:
    from megatron.core.distributed import finalize_model_grads

    ids = torch.randint(0, 64, (2, 8))
    positions = torch.arange(8).expand(2, -1)
    for _ in range(steps):
        with megatron_patches.cpu_device_mode():
            ddp.zero_grad_buffer()
            optimizer.zero_grad()
            ddp(ids, positions, None, labels=ids).float().mean().backward()
            finalize_model_grads([ddp])
            assert optimizer.step()[0]


def _inner(optimizer):
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    assert len(inner) == 1 and isinstance(inner[0], DistributedOptimizer)
    return inner[0]


def _param_steps(optimizer) -> list[torch.Tensor]:
    return [s["step"] for s in _inner(optimizer).optimizer.state.values()]


needs_torch_adam = pytest.mark.skipif(
    not megatron_patches.distrib_optimizer_steps.needed(), reason="Apex/TE fused Adam is in use"
)


@needs_cpu
@needs_torch_adam
def test_fresh_distributed_optimizer_builds_its_state_dict():
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    _, optimizer = _distributed_adam()
    inner = _inner(optimizer)
    with pytest.raises(AssertionError):  # upstream: no state, so no single step value
        original_of(DistributedOptimizer, "state_dict")(inner)
    state = inner.state_dict()
    assert {g["step"] for g in state["optimizer"]["param_groups"]} == {0.0}
    steps = _param_steps(optimizer)
    assert steps and all(s.item() == 0.0 for s in steps)


@needs_cpu
@needs_torch_adam
def test_distributed_optimizer_round_trip_keeps_per_param_steps(tmp_path):
    from megatron.core import dist_checkpointing
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    metadata = {"distrib_optim_sharding_type": "dp_reshardable", "chained_optim_avoid_prefix": True}
    ddp, optimizer = _distributed_adam()
    _train(ddp, optimizer, 3)
    assert all(s.item() == 3.0 for s in _param_steps(optimizer))

    # Upstream load_state_dict hands every parameter one shared step tensor.
    inner = _inner(optimizer)
    original_of(DistributedOptimizer, "load_state_dict")(inner, inner.state_dict())
    assert len({id(s) for s in _param_steps(optimizer)}) == 1 < len(_param_steps(optimizer))

    ddp, optimizer = _distributed_adam()
    _train(ddp, optimizer, 3)
    with megatron_patches.cpu_device_mode():
        model_state = ddp.module.sharded_state_dict()
        state = {"model": model_state,
                 "optimizer": optimizer.sharded_state_dict(model_state, metadata=metadata)}
        dist_checkpointing.save(state, str(tmp_path))

    ddp, optimizer = _distributed_adam(seed=1)  # fresh: never stepped
    with torch.no_grad(), megatron_patches.cpu_device_mode():
        model_state = ddp.module.sharded_state_dict()
        request = {"model": model_state, "optimizer": optimizer.sharded_state_dict(
            model_state, is_loading=True, metadata=metadata)}
        loaded = dist_checkpointing.load(request, str(tmp_path))
        ddp.module.load_state_dict(loaded["model"])
        optimizer.load_state_dict(loaded["optimizer"])
    steps = _param_steps(optimizer)
    assert len({id(s) for s in steps}) == len(steps) > 1
    assert all(s.item() == 3.0 for s in steps)
    _train(ddp, optimizer, 1)  # each parameter advances once, not once per parameter
    assert all(s.item() == 4.0 for s in _param_steps(optimizer))
