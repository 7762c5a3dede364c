"""KV caches for the hf engine's decode loop: buffers that grow in chunks instead of every step.

transformers' ``DynamicLayer`` concatenates each step's keys and values onto the cache, so every
decode step copies the whole cache of every layer into fresh memory (for 16 designer rows over a
1,500-token prompt: about 1 GB a step on SmolLM2-135M, page faults included). ``GrowingLayer``
keeps them in a buffer with room for ``chunk`` more tokens, writes each step in place and hands
the attention a view of the filled part; only a full buffer is copied into a larger one.

``SharedPrefix`` holds the keys and values of a prompt prefix that every row of a batch shares,
once (batch 1): :mod:`.prefix_attention` attends to it beside each row's own cache, so the rows'
caches never hold a copy of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

GROWTH_CHUNK = 256  # tokens of room a buffer gains when it fills up


class GrowingLayer(DynamicLayer):
    """One layer's keys and values, ``[batch, kv_heads, length, head_dim]`` views of buffers that
    have room for more tokens."""

    def __init__(self, chunk: int = GROWTH_CHUNK) -> None:
        super().__init__()
        self.chunk = chunk
        self.length = 0
        self._key_buffer: Optional[Tensor] = None
        self._value_buffer: Optional[Tensor] = None

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if self._key_buffer is None or end > self._key_buffer.shape[-2]:
            self._grow(key_states, value_states, end + self.chunk)
        self._key_buffer[:, :, self.length:end].copy_(key_states)
        self._value_buffer[:, :, self.length:end].copy_(value_states)
        self.length = end
        self._refresh_views()
        return self.keys, self.values

    def _grow(self, key_states: Tensor, value_states: Tensor, capacity: int) -> None:
        batch, heads = key_states.shape[:2]
        keys = key_states.new_empty(batch, heads, capacity, key_states.shape[-1])
        values = value_states.new_empty(batch, heads, capacity, value_states.shape[-1])
        if self.length:
            keys[:, :, :self.length].copy_(self._key_buffer[:, :, :self.length])
            values[:, :, :self.length].copy_(self._value_buffer[:, :, :self.length])
        self._key_buffer, self._value_buffer = keys, values

    def _refresh_views(self) -> None:
        self.keys = self._key_buffer[:, :, :self.length]
        self.values = self._value_buffer[:, :, :self.length]

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: Tensor) -> None:
        if self.length:
            self._key_buffer = self._key_buffer.index_select(0, indices)
            self._value_buffer = self._value_buffer.index_select(0, indices)
            self._refresh_views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.length:
            self._key_buffer = self._key_buffer.repeat_interleave(repeats, dim=0)
            self._value_buffer = self._value_buffer.repeat_interleave(repeats, dim=0)
            self._refresh_views()

    def reorder_cache(self, beam_idx: Tensor) -> None:
        self.batch_select_indices(beam_idx)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove and self.length:
            self.length = max(0, self.length + tokens_to_remove)
            self._refresh_views()

    def reset(self) -> None:
        self.length = 0
        self._key_buffer = self._value_buffer = None
        super().reset()


def decode_cache(config: Any) -> Cache:
    """A cache of growing layers for a model whose layers all use full attention; transformers'
    own ``DynamicCache`` (which knows sliding and other layer kinds) for any other model."""
    text_config = config.get_text_config(decoder=True)
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types is not None and any(kind != "full_attention" for kind in layer_types):
        return DynamicCache(config=config)
    return Cache(layers=[GrowingLayer() for _ in range(text_config.num_hidden_layers)])


@dataclass(frozen=True)
class SharedPrefix:
    """The keys and values of the prompt prefix all rows of a batch share, per layer
    ``[1, kv_heads, prefix_length, head_dim]``."""

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]

    @classmethod
    def from_cache(cls, cache: Cache) -> "SharedPrefix":
        layers = cache.layers
        if any(layer.keys is None or layer.keys.shape[0] != 1 for layer in layers):
            raise ValueError("a shared prefix is computed as a batch of one")
        return cls(tuple(layer.keys.contiguous() for layer in layers),
                   tuple(layer.values.contiguous() for layer in layers))

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[-2])


def row_attention_mask(row_mask: Tensor, query_length: int) -> Tensor:
    """The boolean ``[batch, 1, query_length, kv_length]`` mask of the rows' own tokens: a query
    sees the real (unpadded) tokens up to itself. ``row_mask`` is ``[batch, kv_length]`` (1 for a
    real token), its last ``query_length`` columns the queries."""
    kv_length = row_mask.shape[1]
    offset = kv_length - query_length
    causal = torch.ones(query_length, kv_length, dtype=torch.bool, device=row_mask.device).tril(diagonal=offset)
    return (row_mask.bool()[:, None, None, :] & causal[None, None]).contiguous()
