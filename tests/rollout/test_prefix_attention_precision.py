"""Shared-prefix attention in bf16 against exact attention over ``[prefix][row]`` in fp64.

The two halves (prefix, row) are merged by their log-sum-exps. With scores around 100 a bf16
log-sum-exp is off by up to a quarter (bf16 keeps 8 significant bits: values in [64, 128) are
0.5 apart), which moves the weight between prefix and row by up to exp(0.25) - 1 = 28%. The inputs
below are built so that this happens, and the test checks both sides of that:

* the premise: merging the exact halves (fp64) with their log-sum-exps rounded to bf16 lands
  further from the exact attention than the tolerance, so a merge in bf16 cannot pass;
* the code: spade's output is within the tolerance.

Tolerance, from bf16's unit roundoff u = 2**-8. Each half is a convex combination of the values,
computed in fp32 and (CPU flash kernel) rounded to bf16 once: at most u * max|v| off. A merge in
fp32 is a convex combination of the halves, so it keeps that bound up to fp32 error (~1e-5 here),
and the final cast to bf16 adds at most u * max|v|. Total <= 2u * max|v|; the test allows 3u * max|v|.
"""

from __future__ import annotations

import math

import pytest
import torch

from spade.rollout.hf import prefix_attention
from spade.rollout.hf.kv_cache import SharedPrefix, row_attention_bias
from spade.rollout.hf.prefix_attention import shared_prefix_attention

U_BF16 = 2.0 ** -8
BATCH, HEADS, KV_HEADS, DIM, PREFIX_LEN, ROW_LEN = 3, 4, 2, 16, 12, 10


class _Layer:
    layer_idx = 0


def _inputs(q_len: int) -> dict[str, torch.Tensor]:
    """bf16 tensors whose scores (scale 1) spread around ~100: queries and keys share a large
    component along one axis. Prefix values sit near +2 and row values near -2, so any error in
    the weight between the halves shows in the output at full size."""
    g = torch.Generator().manual_seed(11)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    axis = torch.zeros(DIM, dtype=torch.float64)
    axis[0] = 10.0
    query = randn(BATCH, HEADS, q_len, DIM) * 1.5 + axis
    prefix_k = randn(1, KV_HEADS, PREFIX_LEN, DIM) * 1.5 + axis
    row_k = randn(BATCH, KV_HEADS, ROW_LEN, DIM) * 1.5 + axis
    prefix_v = randn(1, KV_HEADS, PREFIX_LEN, DIM) * 0.5 + 2.0
    row_v = randn(BATCH, KV_HEADS, ROW_LEN, DIM) * 0.5 - 2.0
    row_mask = torch.ones(BATCH, ROW_LEN, dtype=torch.long)
    row_mask[1, :3] = 0  # left padding
    row_mask[2, :6] = 0
    tensors = dict(query=query, prefix_k=prefix_k, prefix_v=prefix_v, row_k=row_k, row_v=row_v)
    out = {name: t.to(torch.bfloat16) for name, t in tensors.items()}
    out["row_mask"] = row_mask
    return out


def _exact_halves(x: dict[str, torch.Tensor], q_len: int):
    """fp64 attention of each half over the bf16 inputs: outputs ``[b, h, q, d]`` and
    log-sum-exps ``[b, h, q]``, the row half masked causally over real tokens."""
    group = HEADS // KV_HEADS
    q = x["query"].double()
    halves = []
    for keys, values, mask in (
            (x["prefix_k"].expand(BATCH, -1, -1, -1), x["prefix_v"].expand(BATCH, -1, -1, -1), None),
            (x["row_k"], x["row_v"], row_attention_bias(x["row_mask"], q_len, torch.float64))):
        k = keys.double().repeat_interleave(group, dim=1)
        v = values.double().repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-1, -2)
        if mask is not None:
            scores = scores + mask
        lse = torch.logsumexp(scores, dim=-1)
        halves.append((((scores - lse.unsqueeze(-1)).exp() @ v).nan_to_num(), lse))  # 0 where all masked
    return halves


def _merge(halves, lse_round=lambda t: t) -> torch.Tensor:
    (p_out, p_lse), (r_out, r_lse) = halves
    p_lse, r_lse = lse_round(p_lse), lse_round(r_lse)
    total = torch.logaddexp(p_lse, r_lse)
    return p_out * (p_lse - total).exp().unsqueeze(-1) + r_out * (r_lse - total).exp().unsqueeze(-1)


def _exact_full_attention(x: dict[str, torch.Tensor], q_len: int) -> torch.Tensor:
    """One softmax over the concatenated ``[prefix][row]`` keys, fp64: ``[b, h, q, d]``."""
    group = HEADS // KV_HEADS
    keys = torch.cat([x["prefix_k"].expand(BATCH, -1, -1, -1), x["row_k"]], dim=2).double()
    values = torch.cat([x["prefix_v"].expand(BATCH, -1, -1, -1), x["row_v"]], dim=2).double()
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    bias = torch.cat([torch.zeros(BATCH, 1, q_len, PREFIX_LEN, dtype=torch.float64),
                      row_attention_bias(x["row_mask"], q_len, torch.float64)], dim=3)
    scores = x["query"].double() @ keys.transpose(-1, -2) + bias
    return torch.softmax(scores, dim=-1) @ values


def _tolerance(x: dict[str, torch.Tensor]) -> float:
    return 3 * U_BF16 * max(x["prefix_v"].abs().max().item(), x["row_v"].abs().max().item())


@pytest.mark.parametrize("q_len", [1, 5])
def test_the_inputs_make_a_bf16_log_sum_exp_merge_miss(q_len):
    x = _inputs(q_len)
    halves = _exact_halves(x, q_len)
    exact = _exact_full_attention(x, q_len)
    assert torch.allclose(_merge(halves), exact, atol=1e-10)  # the split itself is exact
    for _, lse in halves:
        seen = lse[lse.isfinite()]  # a padding query sees no row token
        assert 64 <= seen.min().item() and seen.max().item() < 256, "scores meant to sit where bf16 steps are >= 0.5"
    bf16_lse = _merge(halves, lambda t: t.to(torch.bfloat16).double())
    assert (bf16_lse - exact).abs().max().item() > 2 * _tolerance(x)


@pytest.mark.parametrize("kernel", ["cpu", "explicit"])
@pytest.mark.parametrize("q_len", [1, 5])
def test_bf16_shared_prefix_attention_is_within_bf16_rounding_of_exact(q_len, kernel, monkeypatch):
    """Both kernels: CPU's flash kernel and the explicit softmax used on GPUs."""
    if kernel == "explicit":
        monkeypatch.setattr(prefix_attention, "_attend", prefix_attention._attend_explicit)
    x = _inputs(q_len)
    out, _ = shared_prefix_attention(_Layer(), x["query"], x["row_k"], x["row_v"],
                                     row_attention_bias(x["row_mask"], q_len, torch.bfloat16), scaling=1.0,
                                     shared_prefix=SharedPrefix((x["prefix_k"],), (x["prefix_v"],)))
    assert out.dtype == torch.bfloat16 and out.shape == (BATCH, q_len, HEADS, DIM)
    exact = _exact_full_attention(x, q_len).transpose(1, 2)
    error = (out.double() - exact).abs().max().item()
    assert error <= _tolerance(x), f"max error {error:.4f} > {_tolerance(x):.4f} (3 bf16 roundings of max|v|)"
    assert math.isfinite(error)
