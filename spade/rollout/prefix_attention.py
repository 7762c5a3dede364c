"""Attention over a prompt prefix that every row of a batch shares, stored once.

When all prompts of an hf-engine batch start with the same tokens (the designer prompts of one
regeneration share ~1,400 of ~1,500), the engine computes that prefix once as a batch of one
(:class:`~.kv_cache.SharedPrefix`) and each row's cache holds only its own tokens. Every query then
attends to two key sets: the prefix, which comes before all of a row's tokens and is seen whole,
and the row's own tokens under a causal, padding-aware mask. One softmax spans both: the scores of
the two parts are exponentiated against their joint maximum and normalised by their joint sum, so
the result equals attention over ``[prefix][row]`` up to rounding. Reading the prefix once per
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
    ``[batch, kv_heads, kv, head_dim]``; ``attention_mask`` boolean ``[batch, 1, q, kv]`` over
    them (:func:`~.kv_cache.row_attention_mask`). Returns ``[batch, q, heads, head_dim]``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if shared_prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if attention_mask is None or attention_mask.dtype != torch.bool or attention_mask.dim() != 4:
        raise ValueError("shared-prefix attention needs the rows' boolean 4-D mask")
    if kwargs.get("sliding_window"):
        raise ValueError("shared-prefix attention does not implement sliding-window layers")
    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    scale = scaling if scaling is not None else head_dim ** -0.5
    prefix_keys = shared_prefix.keys[module.layer_idx][0]  # [kv_heads, P, D]
    prefix_values = shared_prefix.values[module.layer_idx][0]
    # head h reads kv head h // group: rows of one kv head are (batch, group member, query)
    q_rows = query.reshape(batch, kv_heads, group * q_len, head_dim)
    # the prefix part as one matmul per kv head over every row's queries
    q_flat = q_rows.transpose(0, 1).reshape(kv_heads, batch * group * q_len, head_dim)
    prefix_scores = torch.matmul(q_flat, prefix_keys.transpose(-1, -2)).mul_(scale)  # [kvh, B*g*q, P]
    row_scores = torch.matmul(q_rows, key.transpose(-1, -2)).mul_(scale)  # [B, kvh, g*q, kv]
    mask = attention_mask.unsqueeze(2).expand(batch, 1, group, q_len, key.shape[2]).reshape(batch, 1, group * q_len, -1)
    row_scores.masked_fill_(~mask, float("-inf"))
    prefix_max = prefix_scores.amax(dim=-1)  # finite: every query sees the whole prefix
    prefix_max = prefix_max.view(kv_heads, batch, group * q_len).transpose(0, 1)  # [B, kvh, g*q]
    joint_max = torch.maximum(prefix_max, row_scores.amax(dim=-1))
    prefix_weights = prefix_scores.sub_(joint_max.transpose(0, 1).reshape(kv_heads, -1, 1)).exp_()
    row_weights = row_scores.sub_(joint_max.unsqueeze(-1)).exp_()
    prefix_out = torch.matmul(prefix_weights, prefix_values)  # [kvh, B*g*q, D]
    prefix_sum = prefix_weights.sum(dim=-1)
    out = torch.matmul(row_weights, value)  # [B, kvh, g*q, D]
    out.add_(prefix_out.view(kv_heads, batch, group * q_len, head_dim).transpose(0, 1))
    total = row_weights.sum(dim=-1).add_(prefix_sum.view(kv_heads, batch, group * q_len).transpose(0, 1))
    out.div_(total.unsqueeze(-1))
    out = out.view(batch, heads, q_len, head_dim)
    return out.transpose(1, 2).contiguous(), None


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
