"""Attention over a prompt prefix that every row of a batch shares, stored once.

When all prompts of an hf-engine batch start with the same tokens (the designer prompts of one
regeneration share ~1,400 of ~1,500), the engine computes that prefix once as a batch of one
(:class:`~.kv_cache.SharedPrefix`) and each row's cache holds only its own tokens. Every query then
attends to two key sets: the prefix, which comes before all of a row's tokens and is seen whole,
and the row's own tokens under a causal, padding-aware mask. One softmax spans both, so the result equals attention over ``[prefix][row]`` up to rounding. Each part is computed with its
log-sum-exp (on CPU by PyTorch's flash kernel, which never holds a whole score matrix) and the two
are merged by those weights. Reading the prefix once per
layer instead of once per row is what makes a decode step over 16 such rows cheap.

The function is registered with transformers as ``SHARED_PREFIX_ATTENTION`` and takes the prefix
through the forward's keyword arguments (``shared_prefix=``); a forward without one is plain SDPA,
so :func:`enable_shared_prefix_attention` changes nothing else the model computes.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from .kv_cache import SharedPrefix

SHARED_PREFIX_ATTENTION = "spade_shared_prefix"
# model types whose attention is softmax(QK^T * scale) V over rotary-embedded heads, nothing more
# (no sinks, soft-capping or biases): the ones the embedded model and the recipes use
PLAIN_ATTENTION_MODELS = frozenset({"llama", "qwen2", "qwen3", "qwen3_moe"})


def shared_prefix_attention(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                            dropout: float = 0.0, scaling: Optional[float] = None,
                            shared_prefix: Optional[SharedPrefix] = None, **kwargs: Any) -> tuple[Tensor, None]:
    """``query`` ``[batch, heads, q, head_dim]``; ``key``/``value`` the rows' own tokens
    ``[batch, kv_heads, kv, head_dim]``; ``attention_mask`` the additive ``[batch, 1, q, kv]`` mask
    over them (:func:`~.kv_cache.row_attention_bias`). Returns ``[batch, q, heads, head_dim]``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if shared_prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if attention_mask is None or attention_mask.dim() != 4 or attention_mask.dtype != query.dtype:
        raise ValueError("shared-prefix attention needs the rows' additive 4-D mask in the query's dtype")
    if kwargs.get("sliding_window"):
        raise ValueError("shared-prefix attention does not implement sliding-window layers")
    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    scale = scaling if scaling is not None else head_dim ** -0.5
    # the prefix: every row's queries against one copy of its keys (head h reads kv head h // group)
    flat = query.reshape(batch, kv_heads, group * q_len, head_dim).transpose(0, 1)
    flat = flat.reshape(1, kv_heads, batch * group * q_len, head_dim)
    prefix_out, prefix_lse = _attend(flat, shared_prefix.keys[module.layer_idx],
                                     shared_prefix.values[module.layer_idx], None, scale)
    prefix_out = prefix_out.view(kv_heads, batch, group * q_len, head_dim).transpose(0, 1)
    prefix_out = prefix_out.reshape(batch, heads, q_len, head_dim)
    prefix_lse = prefix_lse.view(kv_heads, batch, group * q_len).transpose(0, 1).reshape(batch, heads, q_len)
    # the rows' own tokens
    if q_len == 1:  # decoding: a kv head's query heads side by side, the mask broadcast over them
        row_out, row_lse = _attend(query.reshape(batch, kv_heads, group, head_dim), key, value, attention_mask, scale)
        row_out, row_lse = row_out.reshape(batch, heads, 1, head_dim), row_lse.reshape(batch, heads, 1)
    else:
        row_out, row_lse = _attend(query, key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1),
                                   attention_mask, scale)
    sees_a_row_token = (attention_mask > float("-inf")).any(dim=-1)  # [batch, 1, q]: padding queries see none
    # The merge runs in fp32 whatever the model's dtype: log-sum-exps of scores near 100 are 0.5
    # apart in bf16, enough to shift the weight between prefix and row by up to 28%.
    prefix_lse = prefix_lse.float()
    row_lse = row_lse.float().masked_fill(~sees_a_row_token, float("-inf"))
    total = torch.logaddexp(prefix_lse, row_lse)
    out = prefix_out.float() * (prefix_lse - total).exp().unsqueeze(-1)
    out = out + row_out.float().nan_to_num() * (row_lse - total).exp().unsqueeze(-1)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def _attend(query: Tensor, key: Tensor, value: Tensor, bias: Optional[Tensor], scale: float) -> tuple[Tensor, Tensor]:
    """Softmax attention and the fp32 log-sum-exp of each query's scores: ``[b, h, q, d]``,
    ``[b, h, q]`` (query and key heads equal). On CPU the flash kernel does it without
    materialising the scores; elsewhere an explicit softmax in fp32."""
    if query.device.type == "cpu":
        return _attend_flash_cpu(query, key, value, bias, scale)
    return _attend_explicit(query, key, value, bias, scale)


def _attend_flash_cpu(query: Tensor, key: Tensor, value: Tensor, bias: Optional[Tensor],
                      scale: float) -> tuple[Tensor, Tensor]:
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, False, attn_mask=bias, scale=scale)
    return out, lse.float()


def _attend_explicit(query: Tensor, key: Tensor, value: Tensor, bias: Optional[Tensor],
                     scale: float) -> tuple[Tensor, Tensor]:
    # fp32 scores as fused kernels keep them: a bf16 score near 100 is already up to 0.25 off
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    lse = torch.logsumexp(scores, dim=-1)
    weights = (scores - lse.unsqueeze(-1)).exp().nan_to_num()
    return torch.matmul(weights, value.float()), lse


def enable_shared_prefix_attention(model: Any) -> bool:
    """Route ``model``'s attention through :func:`shared_prefix_attention` (plain SDPA unless a
    forward passes ``shared_prefix=``). Only for SDPA models whose layers all use full attention;
    returns whether it did."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = model.config
    text_config = config.get_text_config(decoder=True)
    if config._attn_implementation not in ("sdpa", SHARED_PREFIX_ATTENTION):
        return False
    if text_config.model_type not in PLAIN_ATTENTION_MODELS:
        return False
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types is not None:
        if any(kind != "full_attention" for kind in layer_types):
            return False
    elif getattr(text_config, "sliding_window", None) is not None:
        return False
    AttentionInterface.register(SHARED_PREFIX_ATTENTION, shared_prefix_attention)
    AttentionMaskInterface.register(SHARED_PREFIX_ATTENTION, sdpa_mask)
    config._attn_implementation = SHARED_PREFIX_ATTENTION
    return True
