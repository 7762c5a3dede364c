"""Core attention "sdpa" of the local layer spec (issue 25): PyTorch's fused attention instead of
Megatron's unfused ``DotProductAttention``.

* Same model, same weights: the logits agree with the unfused path and with transformers' own
  logits within fp32 rounding, and so do the gradients of every parameter, for a grouped-query
  model with per-head norms (Qwen3) and a tied Llama.
* The point of it: autograd keeps no ``[b * heads, s, s]`` tensor (the unfused path keeps the fp32
  softmax of every layer).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import support.hf_fixtures as hx
from megatron_fixtures import megatron_world  # noqa: F401
from spade.models import ParallelLayout, RankCoords, read_model_spec
from spade.models.builder import BuildOptions, build_gpt_model


def _model(hf_dir: Path, core_attention: str):
    import megatron_patches
    from spade.models.loading import load_hf_state
    from spade.training.hf_directory import read_hf_tensors

    spec = read_model_spec(Path(hf_dir))
    layout = ParallelLayout()
    with megatron_patches.cpu_device_mode():
        model = build_gpt_model(spec, layout, BuildOptions(params_dtype=torch.float32,
                                                           core_attention=core_attention))
    load_hf_state(model, read_hf_tensors(hf_dir, spec), spec, layout, RankCoords.current())
    return model


def _loss_and_grads(model, ids: torch.Tensor):
    import megatron_patches

    positions = torch.arange(ids.shape[1]).expand_as(ids)
    model.zero_grad(set_to_none=True)
    with megatron_patches.cpu_device_mode():
        logits = model(ids, positions, None)  # [B, T, V]
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None]).sum()
    logp.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module", params=["qwen3", "llama-tied"])
def hf_dir(request, tmp_path_factory, megatron_world):  # noqa: F811
    return hx.save_tiny_hf(request.param, tmp_path_factory.mktemp(request.param))


def test_sdpa_matches_the_unfused_path_and_transformers(hf_dir):
    ids = torch.randint(0, hx.VOCAB, (2, 40), generator=torch.Generator().manual_seed(3))
    fused_logits, fused_grads = _loss_and_grads(_model(hf_dir, "sdpa"), ids)
    plain_logits, plain_grads = _loss_and_grads(_model(hf_dir, "unfused"), ids)
    with torch.no_grad():
        hf_logits = hx.load_hf(hf_dir)(ids).logits.float()
    vocab = hf_logits.shape[-1]
    torch.testing.assert_close(fused_logits[..., :vocab], plain_logits[..., :vocab], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused_logits[..., :vocab], hf_logits, rtol=1e-4, atol=1e-4)
    assert fused_grads.keys() == plain_grads.keys() and len(fused_grads) > 0
    for name, grad in fused_grads.items():
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def _largest_saved(model, ids: torch.Tensor) -> int:
    import megatron_patches

    largest = 0

    def pack(tensor):
        nonlocal largest
        largest = max(largest, tensor.numel())
        return tensor

    positions = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), megatron_patches.cpu_device_mode():
        model(ids, positions, None)
    return largest


def test_sdpa_keeps_no_attention_scores(hf_dir):
    rows, seq = 1, 120
    ids = torch.randint(0, hx.VOCAB, (rows, seq), generator=torch.Generator().manual_seed(4))
    heads = read_model_spec(Path(hf_dir)).num_attention_heads
    scores = rows * heads * seq * seq
    assert _largest_saved(_model(hf_dir, "unfused"), ids) >= scores  # what the unfused path keeps
    assert _largest_saved(_model(hf_dir, "sdpa"), ids) < scores


def test_unknown_core_attention_names_the_choices(hf_dir):
    with pytest.raises(ValueError, match="core_attention.*sdpa, unfused"):
        _model(hf_dir, "flash")
