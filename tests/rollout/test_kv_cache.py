"""spade.rollout.hf.kv_cache and prefix_attention against transformers' own cache and SDPA.

References: ``torch.cat`` of every update (what transformers' DynamicLayer holds), SDPA over the
concatenated ``[prefix][row]`` keys with the kv heads repeated, and the transformers model's logits
of whole sequences computed without any cache. Tiny random models of test_rollout_engine.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, Qwen3ForCausalLM

from spade.rollout.hf import prefix_attention
from spade.rollout.hf.kv_cache import GrowingLayer, SharedPrefix, decode_cache, row_attention_bias
from spade.rollout.hf.prefix_attention import SHARED_PREFIX_ATTENTION, enable_shared_prefix_attention, \
    shared_prefix_attention
from support.models import qwen3_config
from test_rollout_engine import VOCAB, tiny_model


def kv(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, length, 8, generator=g), torch.randn(batch, 2, length, 8, generator=g)


def test_growing_layer_holds_what_concatenation_holds_across_buffer_growth():
    layer = GrowingLayer(chunk=5)
    keys, values = [], []
    for step, length in enumerate([7, 1, 1, 4, 1, 9, 1]):  # the buffer fills and grows three times
        k, v = kv(3, length, step)
        got_k, got_v = layer.update(k, v)
        keys.append(k)
        values.append(v)
        assert torch.equal(got_k, torch.cat(keys, dim=2)) and torch.equal(got_v, torch.cat(values, dim=2))
    assert layer.get_seq_length() == 24
    assert layer._key_buffer.shape[2] < 24 + 2 * 5  # grown by chunks, not per step


def test_growing_layer_row_selection_repeat_and_crop():
    layer = GrowingLayer()
    k, v = kv(3, 6, 0)
    layer.update(k, v)
    layer.batch_select_indices(torch.tensor([2, 0]))
    assert torch.equal(layer.keys, k[[2, 0]]) and torch.equal(layer.values, v[[2, 0]])
    k2, v2 = kv(2, 1, 1)
    got_k, _ = layer.update(k2, v2)  # rows keep writing after a selection
    assert torch.equal(got_k, torch.cat([k[[2, 0]], k2], dim=2))
    layer.crop(-3)
    assert layer.get_seq_length() == 4 and torch.equal(layer.keys, k[[2, 0]][:, :, :4])
    with pytest.raises(ValueError, match="negative"):
        layer.crop(2)
    one = GrowingLayer()
    k1, v1 = kv(1, 4, 3)
    one.update(k1, v1)
    one.batch_repeat_interleave(3)
    assert torch.equal(one.keys, k1.repeat(3, 1, 1, 1)) and one.keys.shape[2] == 4


def test_decode_cache_uses_transformers_cache_for_sliding_layers():
    full = qwen3_config(VOCAB, max_position_embeddings=128)
    assert all(isinstance(layer, GrowingLayer) for layer in decode_cache(full).layers)
    sliding = qwen3_config(VOCAB, max_position_embeddings=128, use_sliding_window=True, sliding_window=8,
                           max_window_layers=1)
    assert isinstance(decode_cache(sliding), DynamicCache)


@pytest.mark.parametrize("name", ["qwen3", "llama-tied"])
def test_growing_cache_decodes_the_logits_of_the_whole_sequence(name):
    model = tiny_model(name)
    tokens = torch.tensor([[5, 17, 42, 99, 3, 150, 7, 11, 12, 190, 2, 64]])
    with torch.inference_mode():
        reference = model(input_ids=tokens).logits
        cache = decode_cache(model.config)
        for layer in cache.layers:
            layer.chunk = 3  # grow several times in 12 tokens
        out = [model(input_ids=tokens[:, :5], past_key_values=cache, use_cache=True).logits]
        for i in range(5, tokens.shape[1]):
            out.append(model(input_ids=tokens[:, i:i + 1], past_key_values=cache, use_cache=True).logits)
    assert torch.allclose(torch.cat(out, dim=1), reference, atol=1e-5)


def test_row_attention_bias_is_causal_over_real_tokens():
    rows = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    bias = row_attention_bias(rows, query_length=2, dtype=torch.float32)
    assert bias.shape == (2, 1, 2, 4) and bias.dtype == torch.float32
    seen = (bias == 0).tolist()
    assert seen[0][0] == [[False, True, True, False], [False, True, True, True]]
    assert seen[1][0] == [[True, True, True, False], [True, True, True, True]]
    assert set(bias.unique().tolist()) == {0.0, float("-inf")}


class _Layer:
    layer_idx = 0


@pytest.mark.parametrize("kernel", ["cpu", "explicit"])
@pytest.mark.parametrize("q_len", [1, 4])
def test_shared_prefix_attention_equals_sdpa_over_prefix_and_row(q_len, kernel, monkeypatch):
    """4 query heads over 2 kv heads, three rows with different left padding; CPU's flash kernel
    and the explicit softmax used on other devices."""
    if kernel == "explicit":
        monkeypatch.setattr(prefix_attention, "_attend", prefix_attention._attend_explicit)
    g = torch.Generator().manual_seed(7)
    batch, heads, kv_heads, dim, prefix_len, row_len = 3, 4, 2, 8, 6, 5
    query = torch.randn(batch, heads, q_len, dim, generator=g)
    prefix_k, prefix_v = torch.randn(1, kv_heads, prefix_len, dim, generator=g), torch.randn(1, kv_heads, prefix_len, dim, generator=g)
    row_k, row_v = torch.randn(batch, kv_heads, row_len, dim, generator=g), torch.randn(batch, kv_heads, row_len, dim, generator=g)
    row_mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]])
    if q_len > 1:  # a padded query position sees only the prefix
        row_mask[2, -2:] = torch.tensor([0, 1])
    bias = row_attention_bias(row_mask, q_len, torch.float32)
    mask = bias == 0
    out, _ = shared_prefix_attention(_Layer(), query, row_k, row_v, bias, scaling=0.3,
                                     shared_prefix=SharedPrefix((prefix_k,), (prefix_v,)))
    keys = torch.cat([prefix_k.expand(batch, -1, -1, -1), row_k], dim=2).repeat_interleave(heads // kv_heads, dim=1)
    values = torch.cat([prefix_v.expand(batch, -1, -1, -1), row_v], dim=2).repeat_interleave(heads // kv_heads, dim=1)
    full_mask = torch.cat([torch.ones(batch, 1, q_len, prefix_len, dtype=torch.bool), mask], dim=3)
    expected = torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=full_mask, scale=0.3)
    assert out.shape == (batch, q_len, heads, dim)
    assert torch.allclose(out, expected.transpose(1, 2), atol=1e-5)
    assert torch.isfinite(out).all()


def test_shared_prefix_attention_is_enabled_only_where_it_is_exact():
    model = tiny_model("qwen3")
    reference = tiny_model("qwen3")
    assert enable_shared_prefix_attention(model)
    assert model.config._attn_implementation == SHARED_PREFIX_ATTENTION
    tokens = torch.tensor([[5, 17, 42, 99], [0, 0, 3, 150]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    with torch.inference_mode():  # without a prefix it is plain SDPA
        assert torch.equal(model(input_ids=tokens, attention_mask=mask).logits,
                           reference(input_ids=tokens, attention_mask=mask).logits)
    eager = tiny_model("qwen3")
    eager.config._attn_implementation = "eager"
    assert not enable_shared_prefix_attention(eager)
    sliding = Qwen3ForCausalLM(qwen3_config(VOCAB, max_position_embeddings=128, use_sliding_window=True,
                                            sliding_window=8, max_window_layers=1))
    assert not enable_shared_prefix_attention(sliding)
    assert sliding.config._attn_implementation == "sdpa"
