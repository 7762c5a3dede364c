"""CPU replacement for ``RotaryEmbedding.get_emb``
(``megatron.core.models.common.embeddings.rotary_pos_embedding``).

Upstream ``get_emb`` moves ``inv_freq`` to ``torch.cuda.current_device()`` the first time it sees
it on the CPU, which raises on a machine without CUDA. The replacement computes the same
``[seq, 1, 1, dim]`` angle table on whatever device ``inv_freq`` already lives on.
"""

from __future__ import annotations

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

from ._util import cuda_available, replace

NAME = "rotary"


def get_emb_on_own_device(self: RotaryEmbedding, max_seq_len: int, offset: int = 0) -> torch.Tensor:
    """Rotary angles for positions ``offset .. offset + max_seq_len`` as ``[s, 1, 1, dim]``."""
    freqs = self.get_freqs_non_repeated(max_seq_len, offset)  # [s, dim/2]
    if self.rotary_interleaved:
        emb = torch.repeat_interleave(freqs, 2, dim=-1)  # f0 f0 f1 f1 ...
    else:
        emb = torch.cat((freqs, freqs), dim=-1)  # f0 f1 ... f0 f1 ...
    return emb[:, None, None, :]


def apply() -> bool:
    if cuda_available():
        return False
    return replace(RotaryEmbedding, "get_emb", get_emb_on_own_device)
