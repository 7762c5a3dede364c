"""Core attention for Megatron's local layer spec through PyTorch's fused ``scaled_dot_product_attention``.

Megatron-core's ``DotProductAttention`` (the local spec's core attention) materialises the scores
``[batch * heads, s, s]`` in the activation dtype, then a softmax of them in fp32, and keeps that
softmax for the backward pass in every layer: for SmolLM2-135M (9 heads, 30 layers) one 2,800-token
row keeps 30 * 9 * 2800^2 * 4 bytes = 8.5 GB. ``SDPADotProductAttention`` keeps Megatron's
constructor (sizes per partition, softmax scale, state dict) and replaces only the forward with
``torch.nn.functional.scaled_dot_product_attention``: on CPU its flash kernel (fp32 and bf16) works
in blocks, keeps only the output and one log-sum-exp per query row, and recomputes the blocks in
the backward pass; on CUDA it picks flash or memory-efficient attention.

Same mathematics as the unfused path (softmax of ``q k^T * scale`` under the causal mask, times
``v``), accumulated in a different order: outputs agree within fp32 rounding (checked in
``tests/models/test_sdpa_attention.py`` against the unfused module and Hugging Face's logits).

Supported as upstream's local attention is used here: causal self-attention, no sliding window,
the vanilla softmax, no packed sequences (THD needs Transformer Engine), no attention bias. Anything
else raises rather than silently computing something different.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

CORE_ATTENTION_CHOICES = ("sdpa", "unfused")


def _dot_product_attention_class():
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    return DotProductAttention


def sdpa_attention_class():
    """The module class (built lazily: Megatron is imported only when a model is built)."""
    global _SDPA_CLASS
    if _SDPA_CLASS is None:
        _SDPA_CLASS = _make_class(_dot_product_attention_class())
    return _SDPA_CLASS


_SDPA_CLASS = None


def _make_class(base):
    from megatron.core.transformer.enums import AttnMaskType

    class SDPADotProductAttention(base):
        """``DotProductAttention`` whose forward is PyTorch's fused SDPA (module docstring)."""

        def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str, *args, **kwargs):
            super().__init__(config, layer_number, attn_mask_type, attention_type, *args, **kwargs)
            if config.window_size is not None:
                raise NotImplementedError("model core attention 'sdpa': sliding-window attention is not "
                                          "supported; use core attention 'unfused'")
            if self.softmax_offset is not None:
                raise NotImplementedError(f"model core attention 'sdpa': softmax_type {config.softmax_type!r} "
                                          "is not supported; use core attention 'unfused'")
            if config.apply_query_key_layer_scaling:
                raise NotImplementedError("model core attention 'sdpa': apply_query_key_layer_scaling is not "
                                          "supported; use core attention 'unfused'")

        def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                    attn_mask_type=None, attention_bias: Optional[Tensor] = None, packed_seq_params=None):
            if packed_seq_params is not None:
                raise NotImplementedError("packed sequences need Transformer Engine's attention")
            if attention_bias is not None:
                raise NotImplementedError("attention bias is not supported by the local core attention")
            # [s, b, heads, d] -> [b, heads, s, d]; grouped kv heads repeated as Megatron does
            groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
            if groups > 1:
                key = key.repeat_interleave(groups, dim=2)
                value = value.repeat_interleave(groups, dim=2)
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
            mask = None
            causal = False
            if attention_mask is not None:  # Megatron's masks are True where hidden
                mask = ~attention_mask.to(torch.bool)
            elif mask_type == AttnMaskType.causal:
                if q.size(2) != k.size(2):
                    raise NotImplementedError("model core attention 'sdpa': causal attention with "
                                              f"{q.size(2)} queries and {k.size(2)} keys")
                causal = True
            elif mask_type != AttnMaskType.no_mask:
                raise NotImplementedError(f"model core attention 'sdpa': mask type {mask_type} without a mask")
            dropout = self.attention_dropout.p if self.training else 0.0
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                                     is_causal=causal, scale=self.softmax_scale)
            # [b, heads, s, d] -> [s, b, heads * d]
            return context.permute(2, 0, 1, 3).reshape(context.size(2), context.size(0),
                                                        self.hidden_size_per_partition)

    return SDPADotProductAttention


def use_sdpa_core_attention(layer_spec):
    """``layer_spec`` (a local-spec ``ModuleSpec`` of a transformer layer) with its core attention
    replaced by ``SDPADotProductAttention``; the spec is modified in place and returned."""
    attention = layer_spec.submodules.self_attention.submodules
    if getattr(attention.core_attention, "__name__", "") != "DotProductAttention":
        raise ValueError(f"core attention 'sdpa' replaces Megatron's DotProductAttention, found "
                         f"{attention.core_attention!r}")
    attention.core_attention = sdpa_attention_class()
    return layer_spec
