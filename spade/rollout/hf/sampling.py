"""How the hf engine picks a row's next token from its log-probs.

Randomness. Each request owns a ``torch.Generator`` seeded from ``SamplingParams.seed`` and draws
exactly one exponential variable per vocabulary entry per step; the token is
``argmax(p / noise)`` over the truncated distribution ``p`` (an exact sample of ``p``). Drawing
only for the top-k / top-p candidates would be cheaper but would change every seed's stream (the
smoke run's admitted environments among them). The stream
therefore depends only on the request, and the same seed gives the same tokens whoever shares the
batch (left padding changes logits only at rounding level).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from ..engine import SamplingParams, TopLogprobs


def penalize(logits: Tensor, generated: Sequence[int], sampling: SamplingParams) -> Tensor:
    """One row's ``logits`` with the frequency, presence and repetition penalties of the tokens
    ``generated`` so far (``SamplingParams``' docstring; SGLang's penalisers)."""
    if not generated or not sampling.penalised:
        return logits
    counts = torch.bincount(torch.tensor(generated, device=logits.device), minlength=logits.numel())
    counts = counts[:logits.numel()].to(logits.dtype)
    seen = counts > 0
    logits = logits - sampling.frequency_penalty * counts - sampling.presence_penalty * seen.to(logits.dtype)
    if sampling.repetition_penalty != 1:
        scaled = torch.where(logits < 0, logits * sampling.repetition_penalty, logits / sampling.repetition_penalty)
        logits = torch.where(seen, scaled, logits)
    return logits


def choose_token(logp: Tensor, sampling: SamplingParams, generator: torch.Generator) -> int:
    """Greedy argmax, or an exact sample of the top-k / top-p / min-p truncated distribution."""
    if sampling.greedy:
        return int(torch.argmax(logp))
    vocab = logp.numel()
    top_k = min(sampling.top_k or vocab, vocab)
    if top_k == vocab and sampling.top_p >= 1.0 and sampling.min_p <= 0:
        weights = logp.exp()
    else:
        if top_k < vocab:
            values, ids = torch.topk(logp, top_k)
        else:
            values, ids = torch.sort(logp, descending=True)
        if sampling.top_p < 1.0:
            probs = torch.softmax(values, dim=0)
            before = torch.cumsum(probs, dim=0) - probs  # mass of strictly better candidates
            kept = before < sampling.top_p  # the best candidate always stays
            values, ids = values[kept], ids[kept]
        if sampling.min_p > 0:  # after top-k / top-p, relative to the best candidate (SGLang's order)
            kept = values >= values[0] + math.log(sampling.min_p)
            values, ids = values[kept], ids[kept]
        weights = torch.zeros_like(logp)
        weights[ids] = torch.softmax(values, dim=0)
    noise = torch.empty_like(logp).exponential_(generator=generator)
    return int(torch.argmax(weights / noise))


def top_alternatives(logp: Tensor, count: int) -> TopLogprobs:
    """The ``count`` most likely tokens of ``logp`` as (id, log-prob), log-prob descending and ties
    by the smaller id (``torch.topk`` leaves the order of equal values unspecified): every token
    at least as likely as the ``count``-th is sorted stably by value, then cut to ``count``.
    Tokens a grammar masked out (log-prob -inf) are never alternatives, so a constrained step can
    have fewer than ``count``."""
    count = min(count, logp.numel())
    threshold = torch.topk(logp, count).values[-1]
    candidates = torch.nonzero((logp >= threshold) & torch.isfinite(logp)).flatten()  # ascending ids
    order = torch.sort(logp[candidates], descending=True, stable=True).indices[:count]
    ids = candidates[order]
    return tuple(zip(ids.tolist(), logp[ids].tolist()))
