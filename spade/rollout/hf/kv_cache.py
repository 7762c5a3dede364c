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
    have room for more tokens. The view starts at ``start``: columns cut from the left
    (:meth:`drop_leading`) are skipped, not copied. Rows can be added (:meth:`merge_rows`) and
    columns put in front of every row (:meth:`prepend`); both copy into a new buffer."""

    def __init__(self, chunk: int = GROWTH_CHUNK) -> None:
        super().__init__()
        self.chunk = chunk
        self.start = 0
        self.end = 0
        self._key_buffer: Optional[Tensor] = None
        self._value_buffer: Optional[Tensor] = None

    @property
    def length(self) -> int:
        return self.end - self.start

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        added = key_states.shape[-2]
        if self._key_buffer is None or self.end + added > self._key_buffer.shape[-2]:
            self._regrow(key_states, value_states, self.length + added + self.chunk)
        self._key_buffer[:, :, self.end:self.end + added].copy_(key_states)
        self._value_buffer[:, :, self.end:self.end + added].copy_(value_states)
        self.end += added
        self._refresh_views()
        return self.keys, self.values

    def _regrow(self, key_states: Tensor, value_states: Tensor, capacity: int) -> None:
        """New buffers of ``capacity`` columns holding the current columns from column 0."""
        batch, heads = key_states.shape[:2]
        keys = key_states.new_empty(batch, heads, capacity, key_states.shape[-1])
        values = value_states.new_empty(batch, heads, capacity, value_states.shape[-1])
        if self.length:
            keys[:, :, :self.length].copy_(self.keys)
            values[:, :, :self.length].copy_(self.values)
        self._key_buffer, self._value_buffer = keys, values
        self.start, self.end = 0, self.length

    def _refresh_views(self) -> None:
        self.keys = self._key_buffer[:, :, self.start:self.end]
        self.values = self._value_buffer[:, :, self.start:self.end]

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: Tensor) -> None:
        if self._key_buffer is not None:
            self._key_buffer = self._key_buffer.index_select(0, indices)
            self._value_buffer = self._value_buffer.index_select(0, indices)
            self._refresh_views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._key_buffer is not None:
            self._key_buffer = self._key_buffer.repeat_interleave(repeats, dim=0)
            self._value_buffer = self._value_buffer.repeat_interleave(repeats, dim=0)
            self._refresh_views()

    def reorder_cache(self, beam_idx: Tensor) -> None:
        self.batch_select_indices(beam_idx)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove and self.length:
            self.end = max(self.start, self.end + tokens_to_remove)
            self._refresh_views()

    def drop_leading(self, columns: int) -> None:
        """Forget the first ``columns`` columns of every row (padding no row reads any more)."""
        if not 0 <= columns <= self.length:
            raise ValueError(f"cannot drop {columns} of {self.length} columns")
        self.start += columns
        if self._key_buffer is not None:
            self._refresh_views()

    def prepend(self, keys: Tensor, values: Tensor) -> None:
        """Put ``keys``/``values`` ``[batch, kv_heads, n, head_dim]`` before every row's columns."""
        added = keys.shape[-2]
        if self._key_buffer is None:
            self.lazy_initialization(keys, values)
            self._key_buffer, self._value_buffer = keys.new_empty(0), values.new_empty(0)
            self.keys, self.values = keys[:, :, :0], values[:, :, :0]
        new_keys = keys.new_empty(keys.shape[0], keys.shape[1], added + self.length + self.chunk, keys.shape[-1])
        new_values = values.new_empty(new_keys.shape[:3] + values.shape[-1:])
        new_keys[:, :, :added].copy_(keys)
        new_values[:, :, :added].copy_(values)
        new_keys[:, :, added:added + self.length].copy_(self.keys)
        new_values[:, :, added:added + self.length].copy_(self.values)
        self._key_buffer, self._value_buffer = new_keys, new_values
        self.start, self.end = 0, added + self.length
        self._refresh_views()

    def merge_rows(self, other: "GrowingLayer") -> None:
        """Append ``other``'s rows after this layer's; the shorter side is left-padded with zero
        keys and values (the callers' masks hide them) so both end at the same column."""
        if other._key_buffer is None:
            return
        if self._key_buffer is None or self.keys.shape[0] == 0:
            self._key_buffer, self._value_buffer = other._key_buffer, other._value_buffer
            self.start, self.end = other.start, other.end
            self.dtype, self.device, self.is_initialized = other.dtype, other.device, True
            self._refresh_views()
            return
        width = max(self.length, other.length)
        mine, theirs = self.keys.shape[0], other.keys.shape[0]
        shape = (mine + theirs, self.keys.shape[1], width + self.chunk)
        new_keys = self.keys.new_empty(shape + self.keys.shape[-1:])
        new_values = self.values.new_empty(shape + self.values.shape[-1:])
        for buffer, top, bottom in ((new_keys, self.keys, other.keys), (new_values, self.values, other.values)):
            buffer[:mine, :, :width - self.length].zero_()
            buffer[:mine, :, width - self.length:width].copy_(top)
            buffer[mine:, :, :width - other.length].zero_()
            buffer[mine:, :, width - other.length:width].copy_(bottom)
        self._key_buffer, self._value_buffer = new_keys, new_values
        self.start, self.end = 0, width
        self._refresh_views()

    def reset(self) -> None:
        self.start = self.end = 0
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


def row_attention_bias(row_mask: Tensor, query_length: int, dtype: torch.dtype) -> Tensor:
    """The additive ``[batch, 1, query_length, kv_length]`` mask (0 or -inf) of the rows' own
    tokens: a query sees the real (unpadded) tokens up to itself. ``row_mask`` is
    ``[batch, kv_length]`` (1 for a real token), its last ``query_length`` columns the queries."""
    kv_length = row_mask.shape[1]
    offset = kv_length - query_length
    causal = torch.ones(query_length, kv_length, dtype=torch.bool, device=row_mask.device).tril(diagonal=offset)
    visible = row_mask.bool()[:, None, None, :] & causal[None, None]
    return torch.zeros(visible.shape, dtype=dtype, device=row_mask.device).masked_fill_(~visible, float("-inf"))
