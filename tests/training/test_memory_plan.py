"""The local-spec step-memory estimate and the recompute options (issue 21, fault 2).

* The saved attention of a Qwen3-4B shape at 2 x 4,096 tokens is the hand count
  2 * 32 * 4096^2 elements * 6 bytes (fp32 softmax + bf16 copy) * 36 layers = 216 GiB, and the
  parameter count is transformers' own count of the model.
* The activation terms agree with what autograd really keeps: a tiny bf16 local-spec model on CPU,
  saved tensors counted by storage through ``saved_tensors_hooks``, for no, selective and full
  recompute.
* Settings that cannot fit are refused with the reason and what to change; ``tools/gpu_mfu.py``
  refuses its old defaults (no recompute) and runs the plan at its new ones.
* ``model.recompute_method`` / ``model.recompute_num_layers`` are validated, reach Megatron's
  ``TransformerConfig``, and a step with them gives the loss and gradients of a step without.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_fixtures import megatron_world  # noqa: F401
from spade.config import ConfigError
from spade.models import ParallelLayout, read_model_spec
from spade.models.builder import BuildOptions, build_gpt_model, build_transformer_config
from spade.train_config import from_dict
from spade.training.memory_plan import (GIB, MemoryPlanError, MicroBatchShape, RecomputeSettings, SettingNames,
                                        activation_bytes_per_token_layer, check_fits, estimate_step_memory,
                                        parameter_count)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import gpu_mfu  # noqa: E402

QWEN3_4B = read_model_spec(gpu_mfu.QWEN3_4B)


def test_saved_attention_of_the_4b_shape_is_the_hand_count():
    estimate = estimate_step_memory(QWEN3_4B, ParallelLayout(), MicroBatchShape(rows=2, seq_len=4096))
    by_hand = 2 * 32 * 4096**2 * 6 * 36  # rows * heads * s^2 elements, 4 + 2 bytes, 36 layers
    assert estimate.attention_saved == by_hand
    assert by_hand / GIB == pytest.approx(216.0, abs=0.05)
    assert estimate.attention_layers_saved == 36
    for mode in ("selective", "full"):
        assert estimate_step_memory(QWEN3_4B, ParallelLayout(), MicroBatchShape(2, 4096),
                                    RecomputeSettings(mode)).attention_saved == 0


def test_parameter_count_is_transformers_count():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**{k: v for k, v in gpu_mfu.QWEN3_4B.items() if k != "architectures"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    dense, experts = parameter_count(QWEN3_4B)
    assert (dense, experts) == (sum(p.numel() for p in model.parameters()), 0)  # tied: counted once


def test_weights_gradients_and_adam_by_hand():
    dense, _ = parameter_count(QWEN3_4B)
    estimate = estimate_step_memory(QWEN3_4B, ParallelLayout(), MicroBatchShape(1, 16), distributed_optimizer=True,
                                    data_parallel=4)
    # bf16 parameter 2 + fp32 gradient buffer 4 + (fp32 main parameter + two Adam moments) 12 over 4 ranks
    assert estimate.weights == pytest.approx(dense * (2 + 4 + 12 / 4))


# ---------------------------------------------------------------------------- against autograd

TINY = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=512, hidden_size=256,
            intermediate_size=768, num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
            max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
            hidden_act="silu", attention_bias=False)


def saved_bytes(spec, recompute: str, rows: int, seq: int) -> int:
    """Bytes of distinct storages autograd keeps (parameters excluded) for one bf16 forward."""
    import megatron_patches
    from spade.training.forward_logprobs import _hidden_states_out

    with megatron_patches.cpu_device_mode():
        model = build_gpt_model(spec, ParallelLayout(), BuildOptions(params_dtype=torch.bfloat16, recompute=recompute))
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(0, spec.vocab_size, (rows, seq), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(seq).expand(rows, seq)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), megatron_patches.cpu_device_mode(), \
            _hidden_states_out(model):
        model(ids, positions, None)
    return sum(kept.values())


@pytest.mark.usefixtures("megatron_world")
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_saved_activations_per_layer_match_autograd(recompute):
    """One more layer adds what the estimate says one layer keeps. Without Float16Module the norm
    weights stay fp32, so torch runs its composite RMSNorm (fp32 copies kept): ``fused_norms=False``."""
    rows, seq = 2, 256
    one = read_model_spec(TINY)
    two = dataclasses.replace(one, num_layers=2)
    measured = saved_bytes(two, recompute, rows, seq) - saved_bytes(one, recompute, rows, seq)

    def kept(spec):
        estimate = estimate_step_memory(spec, ParallelLayout(), MicroBatchShape(rows, seq),
                                        RecomputeSettings(recompute), fused_norms=False)
        return estimate.activations + estimate.attention_saved

    predicted = kept(two) - kept(one)
    assert predicted == pytest.approx(measured, rel=0.04), (predicted, measured)


def test_per_token_terms_by_hand():
    spec = read_model_spec(TINY)
    h, q, kv, f = 256, 256, 64, 768
    fused = activation_bytes_per_token_layer(spec, ParallelLayout(), fused_norms=True)
    assert fused == 2 * (4 * h + 3 * q + 3 * kv + 5 * f)
    composite = activation_bytes_per_token_layer(spec, ParallelLayout(), fused_norms=False)
    assert composite == fused + 12 * h + 8 * (q + kv)


# ---------------------------------------------------------------------------- refusing


def test_refusal_says_why_and_what_to_change():
    shape = MicroBatchShape(rows=2, seq_len=4096)
    estimate = estimate_step_memory(QWEN3_4B, ParallelLayout(), shape, distributed_optimizer=True)
    with pytest.raises(MemoryPlanError) as caught:
        check_fits(estimate, 139 * GIB, shape, RecomputeSettings(), device_name="NVIDIA H200")
    message = str(caught.value)
    assert "saved attention scores 216.0 GiB" in message and "NVIDIA H200 (139.0 GiB)" in message
    assert "model.recompute: selective" in message and "run.micro_batch_tokens" in message
    assert "model.memory_check: false" in message
    selective = RecomputeSettings("selective")
    fits = estimate_step_memory(QWEN3_4B, ParallelLayout(), shape, selective, distributed_optimizer=True)
    check_fits(fits, 139 * GIB, shape, selective)  # 2 x 4,096 with selective recompute fits an H200
    with pytest.raises(MemoryPlanError, match="model.recompute: full"):
        check_fits(fits, 80 * GIB, shape, selective, names=SettingNames())


def test_worst_micro_batch_under_a_budget_is_one_long_row():
    assert MicroBatchShape.worst_case(16384, 40960) == MicroBatchShape(1, 16384)
    assert MicroBatchShape.worst_case(8192, 2048) == MicroBatchShape(4, 2048)


def run_gpu_mfu(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_mfu.py"), "--plan-only",
                           "--device-memory-gib", "139", *args], capture_output=True, text=True, timeout=120)


def test_gpu_mfu_refuses_settings_that_cannot_fit_and_plans_its_defaults():
    refused = run_gpu_mfu("--recompute", "none")  # the old defaults: ~216 GiB of saved attention
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "saved attention scores 216.0 GiB" in refused.stderr and "--recompute selective" in refused.stderr
    planned = run_gpu_mfu()  # auto: selective recompute without Transformer Engine
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "recompute selective" in planned.stdout and "fits in 139.0 GiB" in planned.stdout


# ---------------------------------------------------------------------------- recompute options


def test_config_keys_are_validated_with_their_names():
    with pytest.raises(ConfigError, match=r"model\.recompute_method: .*choose one of: uniform, block"):
        from_dict({"model": {"recompute": "full", "recompute_method": "zigzag"}})
    with pytest.raises(ConfigError, match=r"model\.recompute_num_layers: must be >= 1"):
        from_dict({"model": {"recompute": "full", "recompute_num_layers": 0}})
    with pytest.raises(ConfigError, match=r"model\.recompute_method: applies to model\.recompute: full only"):
        from_dict({"model": {"recompute": "selective", "recompute_method": "block"}})
    config = from_dict({"model": {"recompute": "full", "recompute_method": "block", "recompute_num_layers": 2}})
    assert (config.model.recompute_method, config.model.recompute_num_layers, config.model.memory_check) == (
        "block", 2, True)


@pytest.mark.parametrize("options,expected", [
    (BuildOptions(recompute="full", recompute_method="block", recompute_num_layers=2), ("full", "block", 2)),
    (BuildOptions(recompute="full", recompute_method="uniform", recompute_num_layers=2), ("full", "uniform", 2)),
    (BuildOptions(recompute="selective"), ("selective", None, None)),
    (BuildOptions(), (None, None, None)),
])
def test_recompute_settings_reach_the_transformer_config(options, expected):
    spec = dataclasses.replace(read_model_spec(TINY), num_layers=4)
    config = build_transformer_config(spec, ParallelLayout(), options)
    assert (config.recompute_granularity, config.recompute_method, config.recompute_num_layers) == expected
    if expected[0] == "selective":
        assert config.recompute_modules == ["core_attn"]  # Megatron's default: the local spec's scores


def test_recompute_layers_beyond_the_stage_are_refused():
    spec = dataclasses.replace(read_model_spec(TINY), num_layers=4)
    with pytest.raises(ValueError, match="recompute_num_layers 3: must be between 1 and the layers per pipeline"):
        build_transformer_config(spec, ParallelLayout(pp=2), BuildOptions(recompute="full", recompute_num_layers=3))


@pytest.mark.usefixtures("megatron_world")
@pytest.mark.parametrize("method,layers", [("block", 1), ("uniform", 2)])
def test_full_recompute_methods_give_the_same_loss_and_gradients(method, layers):
    from test_training import FP32, checkpoint_state, main_grads, random_samples, tiny_hf

    from spade.training import LossSettings, build_model, init_parallel, make_micro_batches
    from spade.training.train_step import forward_backward

    samples = random_samples([9, 4, 13, 7], seed=5, logprobs=True)
    batches = make_micro_batches(samples, 10_000, packed=False)
    results = {}
    for mode in ("none", "full"):
        init_parallel(ParallelLayout(), seed=1234)
        hf_model, spec = tiny_hf("qwen3")
        options = dataclasses.replace(FP32, recompute=mode, recompute_method=method, recompute_num_layers=layers)
        model = build_model(spec, ParallelLayout(), options=options, hf_state=checkpoint_state(hf_model, spec))
        assert model.config.recompute_method == (method if mode == "full" else None)
        first = model.unwrapped()[0].decoder.layers[0]
        calls = []
        handle = first.register_forward_hook(lambda *_: calls.append(1))
        summary = forward_backward(model.chunks, batches, LossSettings())
        handle.remove()
        results[mode] = (summary.loss, main_grads(model), len(calls))
    (loss, grads, calls), (loss_rc, grads_rc, calls_rc) = results["none"], results["full"]
    assert calls_rc == 2 * calls > 0  # layer 0 is recomputed under both methods
    assert loss_rc == pytest.approx(loss, abs=1e-6)
    for key, grad in grads.items():
        torch.testing.assert_close(grads_rc[key], grad, atol=1e-6, rtol=1e-5, msg=key)


class _FakeH200:
    total_memory = int(139 * GIB)


def _pretend_cuda_without_te(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: _FakeH200())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(BuildOptions, "resolved_use_te", lambda self: False)


def test_learner_refuses_a_local_spec_run_that_cannot_fit_before_reading_weights(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from spade.training import LossSettings, OptimizerSettings
    from spade.training.learner import Learner, LearnerOptions
    from spade.training.memory_plan import check_local_spec_step

    _pretend_cuda_without_te(monkeypatch)
    options = LearnerOptions(optimizer=OptimizerSettings(), loss=LossSettings(), micro_batch_tokens=8192,
                             dtype=torch.bfloat16, core_attention="unfused")
    ctx = SimpleNamespace(dp_size=1)
    # no weights in tmp_path: the refusal must come before anything is read
    with pytest.raises(MemoryPlanError, match=r"model\.recompute: selective.*run\.micro_batch_tokens \(now 1 x 8192"):
        Learner.build(tmp_path, dict(gpu_mfu.QWEN3_4B), ParallelLayout(), ctx, options)
    selective = BuildOptions(params_dtype=torch.bfloat16, recompute="selective")
    estimate = check_local_spec_step(QWEN3_4B, ParallelLayout(), selective, 4096)
    assert estimate is not None and estimate.total < 139 * GIB  # one 4,096-token row with selective fits
    monkeypatch.setattr(BuildOptions, "resolved_use_te", lambda self: True)  # TE keeps no scores: not checked
    assert check_local_spec_step(QWEN3_4B, ParallelLayout(), BuildOptions(recompute="none"), 8192) is None


def test_a_reference_model_on_the_device_adds_one_copy_of_the_parameters():
    dense, _ = parameter_count(QWEN3_4B)
    shape = MicroBatchShape(1, 16)
    without = estimate_step_memory(QWEN3_4B, ParallelLayout(), shape)
    with_ref = estimate_step_memory(QWEN3_4B, ParallelLayout(), shape, reference_model=True)
    assert with_ref.weights - without.weights == pytest.approx(dense * 2)  # bf16


class _FakeH100:
    total_memory = int(79.2 * GIB)


def test_an_sdpa_run_is_checked_too_without_scores(monkeypatch, tmp_path):
    """PyTorch's fused attention (the trainer's default without Transformer Engine) keeps no
    scores, but the weights, gradients, Adam state and activations must still fit: one unsharded
    Qwen3-4B step does on an H200 and does not on an 80 GB H100, and the refusal says why without
    blaming attention scores."""
    from types import SimpleNamespace

    from spade.training import LossSettings, OptimizerSettings
    from spade.training.learner import Learner, LearnerOptions
    from spade.training.memory_plan import check_local_spec_step

    _pretend_cuda_without_te(monkeypatch)
    sdpa = BuildOptions(params_dtype=torch.bfloat16, core_attention="sdpa")
    estimate = check_local_spec_step(QWEN3_4B, ParallelLayout(), sdpa, 8192)
    assert estimate is not None and estimate.attention_saved == 0 and not estimate.scores_materialised
    unfused = estimate_step_memory(QWEN3_4B, ParallelLayout(), MicroBatchShape(1, 8192))
    assert estimate.total < unfused.total  # no [heads, s, s] working set
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: _FakeH100())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    options = LearnerOptions(optimizer=OptimizerSettings(use_distributed_optimizer=False), loss=LossSettings(),
                             micro_batch_tokens=8192, dtype=torch.bfloat16, core_attention="sdpa")
    with pytest.raises(MemoryPlanError) as refused:
        Learner.build(tmp_path, dict(gpu_mfu.QWEN3_4B), ParallelLayout(), SimpleNamespace(dp_size=1), options)
    message = str(refused.value)
    assert "NVIDIA H100 80GB HBM3 (79.2 GiB)" in message and "more model-parallel ranks" in message
    assert "materialises" not in message and "Transformer Engine's fused attention" not in message
