"""GRPO policy loss: token-level clipped policy gradient with asymmetric clipping, truncated
importance sampling against the rollout engine's log-probs and an optional low-variance KL term.

Only ``logprobs`` (the current policy, recomputed by the trainer with gradients) is
differentiated. ``old_logprobs``, ``advantages``, ``rollout_logprobs`` and ``ref_logprobs`` are
constants of the update and are detached here.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import Tensor

Aggregation = Literal["token_mean", "seq_mean_token_mean", "sample_mean"]
AGGREGATIONS: tuple[str, ...] = ("token_mean", "seq_mean_token_mean", "sample_mean")
KL_CLAMP = 10.0


@dataclasses.dataclass(frozen=True)
class LossStats:
    """The loss statistics that one ``policy_loss`` call (:class:`LossMetrics`) and a whole train
    step (``spade.training.train_step.LossSummary``) report, computed without gradients over
    masked tokens.

    A token counts as *masked* (trained on) where ``loss_mask`` is non-zero. Every mean below is
    a plain mean over those tokens; with no masked token at all, every value is 0.0.

    - ``loss``: the value returned as the loss.
    - ``pg_loss``: the policy-gradient part of the loss (no KL), aggregated like the loss.
    - ``clip_frac_low``: share of masked tokens with ``A < 0`` and ``ratio < 1 - eps_low``
      (the clipped branch is selected, so the token gives no policy gradient).
    - ``clip_frac_high``: share of masked tokens with ``A > 0`` and ``ratio > 1 + eps_high``.
    - ``ratio_mean``: mean of ``exp(logprobs - old_logprobs)``.
    - ``tis_weight_mean``: mean truncated importance weight (1.0 without rollout log-probs).
    - ``tis_clip_frac``: share of masked tokens whose raw weight exceeds ``tis_cap``.
    - ``kl_mean``: mean of the clamped low-variance KL estimate (0.0 without ref log-probs; it
      is reported whenever ``ref_logprobs`` is given, even with ``kl_coef == 0``).
    - ``rollout_logprob_abs_diff``: mean of ``|old_logprobs - rollout_logprobs|`` (slime's
      ``train_rollout_logprob_abs_diff``); 0.0 without rollout log-probs.
    - ``rollout_kl``: the k3 estimate of KL(behaviour || training) from the tokens the behaviour
      policy drew, mean of ``exp(d) - d - 1`` with ``d = old_logprobs - rollout_logprobs`` (verl's
      ``rollout_corr/k3_kl``); 0.0 without rollout log-probs. Both are ~0 when the engine and the
      trainer hold the same weights and compute the same distribution.
    """

    loss: float
    pg_loss: float
    clip_frac_low: float
    clip_frac_high: float
    ratio_mean: float
    tis_weight_mean: float
    tis_clip_frac: float
    kl_mean: float
    rollout_logprob_abs_diff: float
    rollout_kl: float

    @property
    def clip_frac(self) -> float:
        """Share of masked tokens on either clipped branch."""
        return self.clip_frac_low + self.clip_frac_high

    def to_dict(self) -> dict[str, float]:
        out = dataclasses.asdict(self)
        out["clip_frac"] = self.clip_frac
        return out


# The statistics that are means over masked tokens (all but the two losses): a train step weights
# each micro-batch's value by its masked tokens.
TOKEN_MEANS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(LossStats) if f.name not in ("loss", "pg_loss"))


@dataclasses.dataclass(frozen=True)
class LossMetrics(LossStats):
    """Diagnostics of one ``policy_loss`` call (:class:`LossStats`) and its number of masked
    tokens, ``num_tokens``."""

    num_tokens: float


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    rollout_logprobs: Tensor | None = None,
    tis_cap: float = 2.0,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    aggregation: Aggregation = "token_mean",
    sample_weights: Tensor | None = None,
    sample_counts: Tensor | None = None,
) -> tuple[Tensor, LossMetrics]:
    """Clipped GRPO loss over ``[B, T]`` token log-probs; returns ``(loss, metrics)``.

    Per token, with ``r = exp(logprobs - old_logprobs)`` and the advantage ``A`` (``[B]`` is
    broadcast over the sequence, ``[B, T]`` is used as is)::

        pg = -min(r * A, clamp(r, 1 - eps_low, 1 + eps_high) * A)
        pg = pg * min(exp(old_logprobs - rollout_logprobs), tis_cap)   # if rollout_logprobs
        pg = pg + kl_coef * clamp(exp(d) - d - 1, -10, 10)             # if kl_coef > 0,
                                                                       # d = ref - logprobs

    ``token_mean`` averages ``pg`` over all masked tokens of the batch; ``seq_mean_token_mean``
    averages each sequence's token mean over the sequences that have at least one masked token;
    ``sample_mean`` sums each sequence's token mean and divides by every sequence of the batch,
    a sequence without masked tokens adding 0 to the sum and 1 to the count (the released code's
    reducer: slime's sum of sample means over the step's samples, see docs/fidelity.md).
    ``sample_weights`` and ``sample_counts`` (``[B]``, ``sample_mean`` only; ``TrainSample.loss_weight``
    and ``count_weight``) make it ``sum_i w_i * mean_i / max(sum_i c_i, 1)``: with the weights of an
    episode's turn samples the episode is one token mean over all its turns, counted once.
    The loss is computed in at least fp32.
    """
    _validate(
        logprobs, old_logprobs, advantages, loss_mask, rollout_logprobs, ref_logprobs,
        eps_low=eps_low, eps_high=eps_high, tis_cap=tis_cap, kl_coef=kl_coef,
        aggregation=aggregation, sample_weights=sample_weights, sample_counts=sample_counts,
    )
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    logp = logprobs.to(dtype)
    old = old_logprobs.detach().to(dtype)
    adv = advantages.detach().to(dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)
    mask = loss_mask.detach().to(dtype)

    ratio = torch.exp(logp - old)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg = -torch.minimum(ratio * adv, clipped_ratio * adv)

    if rollout_logprobs is not None:
        behaviour_gap = old - rollout_logprobs.detach().to(dtype)
        raw_weight = torch.exp(behaviour_gap)
        tis_weight = torch.clamp(raw_weight, max=tis_cap)
        pg = pg * tis_weight
    else:
        behaviour_gap = raw_weight = tis_weight = None

    kl = None
    if ref_logprobs is not None:
        d = ref_logprobs.detach().to(dtype) - logp
        kl = torch.clamp(torch.exp(d) - d - 1.0, -KL_CLAMP, KL_CLAMP)
    total = pg + kl_coef * kl if (kl is not None and kl_coef > 0) else pg

    weights = None if sample_weights is None else sample_weights.detach().to(dtype)
    counts = None if sample_counts is None else sample_counts.detach().to(dtype)
    loss = _aggregate(total, mask, aggregation, weights, counts)

    with torch.no_grad():
        n = mask.sum()
        denom = n.clamp(min=1.0)

        def masked_mean(x: Tensor) -> float:  # where, not a product: inf * 0 off the mask is nan
            return float(torch.where(mask > 0, x, x.new_zeros(())).sum() / denom)

        clip_low = ((adv < 0) & (ratio < 1.0 - eps_low)).to(dtype)
        clip_high = ((adv > 0) & (ratio > 1.0 + eps_high)).to(dtype)
        metrics = LossMetrics(
            clip_frac_low=masked_mean(clip_low),
            clip_frac_high=masked_mean(clip_high),
            ratio_mean=masked_mean(ratio),
            tis_weight_mean=masked_mean(tis_weight) if tis_weight is not None else float(n > 0),
            tis_clip_frac=masked_mean((raw_weight > tis_cap).to(dtype)) if raw_weight is not None else 0.0,
            kl_mean=masked_mean(kl) if kl is not None else 0.0,
            pg_loss=float(_aggregate(pg, mask, aggregation, weights, counts)),
            loss=float(loss),
            num_tokens=float(n),
            rollout_logprob_abs_diff=masked_mean(behaviour_gap.abs()) if behaviour_gap is not None else 0.0,
            rollout_kl=masked_mean(raw_weight - behaviour_gap - 1.0) if behaviour_gap is not None else 0.0,
        )
    return loss, metrics


def _aggregate(values: Tensor, mask: Tensor, aggregation: str, weights: Tensor | None = None,
               counts: Tensor | None = None) -> Tensor:
    masked = values * mask
    if aggregation == "token_mean":
        return masked.sum() / mask.sum().clamp(min=1.0)
    tokens_per_seq = mask.sum(dim=-1)
    seq_means = masked.sum(dim=-1) / tokens_per_seq.clamp(min=1.0)
    if aggregation == "sample_mean":  # every sequence counts, with or without loss tokens
        if weights is not None:
            seq_means = seq_means * weights
        count = counts.sum() if counts is not None else values.new_tensor(float(values.shape[0]))
        return seq_means.sum() / count.clamp(min=1.0)
    has_tokens = (tokens_per_seq > 0).to(values.dtype)
    return (seq_means * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)


def _validate(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    rollout_logprobs: Tensor | None,
    ref_logprobs: Tensor | None,
    *,
    eps_low: float,
    eps_high: float,
    tis_cap: float,
    kl_coef: float,
    aggregation: str,
    sample_weights: Tensor | None,
    sample_counts: Tensor | None,
) -> None:
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation={aggregation!r} is not supported; allowed values: {', '.join(AGGREGATIONS)}")
    for name, tensor in (("sample_weights", sample_weights), ("sample_counts", sample_counts)):
        if tensor is None:
            continue
        if aggregation != "sample_mean":
            raise ValueError(f"{name} is for aggregation sample_mean, got {aggregation!r}")
        if tensor.shape != logprobs.shape[:1]:
            raise ValueError(f"{name} must be [B] = {tuple(logprobs.shape[:1])}, got {tuple(tensor.shape)}")
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    for name, tensor in (("old_logprobs", old_logprobs), ("loss_mask", loss_mask),
                         ("rollout_logprobs", rollout_logprobs), ("ref_logprobs", ref_logprobs)):
        if tensor is not None and tensor.shape != shape:
            raise ValueError(f"{name} must have the shape of logprobs {tuple(shape)}, got {tuple(tensor.shape)}")
    if advantages.shape not in (shape, shape[:1]):
        raise ValueError(
            f"advantages must be [B] = {tuple(shape[:1])} or [B, T] = {tuple(shape)}, got {tuple(advantages.shape)}"
        )
    if not (0.0 <= eps_low < 1.0):
        raise ValueError(f"eps_low must be in [0, 1), got {eps_low}")
    if eps_high < 0.0:
        raise ValueError(f"eps_high must be >= 0, got {eps_high}")
    if not tis_cap > 0.0:
        raise ValueError(f"tis_cap must be > 0, got {tis_cap}")
    if kl_coef < 0.0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0.0 and ref_logprobs is None:
        raise ValueError(f"kl_coef={kl_coef} > 0 requires ref_logprobs")
