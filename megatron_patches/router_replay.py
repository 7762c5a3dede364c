"""Rollout routing replay (R3) on megatron-core 0.16.1's own replay hook, per token.

megatron-core 0.16.1 has routing replay: with ``moe_enable_routing_replay`` every ``TopKRouter``
gets a ``RouterReplay`` (``moe/router_replay.py``) and ``topk_routing_with_score_function`` asks
it for the top-k. Its ``REPLAY_FORWARD`` action takes the target experts of *every* token and
gathers the router's scores at them, so the probabilities (and their gradients into the gate
weights) are the trainer's own, renormalised by the router's score function over the replayed
experts; that is the published method (R3; Megatron-LM's router replay). Two things spade needs
that it does not give:

* tokens without a record (prompts an engine did not report, padding, samples from another
  engine) must route by the trainer's own top-k, so a target row of ``-1`` means "own choice";
* the share of token-layer decisions where the trainer's own top-k set equals the rollout's
  (``train/router_agreement``), measured in the same pass.

``TokenReplay`` is a ``RouterReplay`` that does both; ``attach`` puts one on every router of a
model (the attribute ``topk_routing_with_score_function`` already reads), without the global
instance list (the policy and the reference model each keep their own). Nothing upstream is
replaced, so this module is not in ``PATCHES``.

Targets per micro-batch: ``set_targets(model, routed)`` with the micro-batch's ``[B, S, L, K]``
(or packed ``[1, T, L, K]``) ids hands each router its decoder layer's ``[S * B, K]`` rows in the
router's own order (sequence-major), the local sequence chunk under sequence parallelism. The
target stays until the next micro-batch's, so a full-recompute backward (which runs the router
again right after its forward when there is one pipeline stage) replays the same experts; with
several pipeline stages micro-batches interleave, so replay with recompute is refused there
(``check_supported``).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.router_replay import RouterReplay

NAME = "router_replay"


class TokenReplay(RouterReplay):
    """One router's replay: rows of ``target`` with ids route there, ``-1`` rows by the trainer."""

    def __init__(self, replay: bool = True) -> None:  # not RouterReplay.__init__: no global list
        self.target_topk_idx: Optional[torch.Tensor] = None
        self.recorded_topk_idx = None
        self.router_replay_action = None
        self.replay_backward_list: list[torch.Tensor] = []
        self.replay = replay  # False: measure agreement only, route by the trainer's own top-k
        self.counted = True
        self.agree = 0
        self.total = 0

    def set_target_indices(self, topk_indices: Optional[torch.Tensor]) -> None:
        self.target_topk_idx = topk_indices
        self.counted = topk_indices is None

    def get_replay_topk(self, scores: torch.Tensor, topk: int, num_groups: Optional[int] = None,
                        group_topk: Optional[int] = None,
                        default_compute_topk: Callable = None) -> tuple[torch.Tensor, torch.Tensor]:
        own_values, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        target = self.target_topk_idx
        if target is None:
            return own_values, own
        target = target.to(device=scores.device, dtype=own.dtype)
        if target.shape != own.shape:
            raise ValueError(f"routing replay: the target has shape {tuple(target.shape)}, the router "
                             f"chose {tuple(own.shape)} (tokens x top-k)")
        recorded = target[:, 0] >= 0
        if not self.counted:  # the micro-batch's first pass; a recompute does not count again
            with torch.no_grad():
                same = (own.sort(dim=1).values == target.sort(dim=1).values).all(dim=1)
                self.agree += int((same & recorded).sum())
                self.total += int(recorded.sum())
            self.counted = True
        if not self.replay:
            return own_values, own
        chosen = torch.where(recorded.unsqueeze(1), target, own)
        return scores.gather(1, chosen), chosen


def routers(model: torch.nn.Module) -> list[TopKRouter]:
    return [m for m in model.modules() if isinstance(m, TopKRouter)]


def attach(model_chunks: Sequence[torch.nn.Module], *, replay: bool = True) -> list[TokenReplay]:
    """A ``TokenReplay`` on every top-k router of the chunks (idempotent); returns them."""
    out = []
    for chunk in model_chunks:
        for router in routers(chunk):
            if router.config.moe_router_fusion:
                raise ValueError("routing replay needs the unfused router (moe_router_fusion is on)")
            if not isinstance(router.router_replay, TokenReplay):
                router.router_replay = TokenReplay(replay)
            out.append(router.router_replay)
    return out


def attached(model: torch.nn.Module) -> list[tuple[int, TokenReplay]]:
    """``(decoder layer index from 0, replay)`` of every router of ``model`` that has one."""
    return [(router.layer_number - 1, router.router_replay) for router in routers(model)
            if isinstance(router.router_replay, TokenReplay)]


def set_targets(model: torch.nn.Module, routed: Optional[torch.Tensor]) -> None:
    """Hand each replaying router of ``model`` its layer's rows of ``routed`` (``[B, S, L, K]``,
    ``-1`` = no record; None: no record at all)."""
    replays = attached(model)
    if not replays:
        return
    if routed is None:
        for _, replay in replays:
            replay.set_target_indices(None)
        return
    from megatron.core import parallel_state as ps

    config = routers(model)[0].config
    tp = ps.get_tensor_model_parallel_world_size()
    by_sequence = routed.transpose(0, 1)  # [S, B, L, K]: the router's token order is sequence-major
    if config.sequence_parallel and tp > 1:
        chunk = by_sequence.shape[0] // tp
        rank = ps.get_tensor_model_parallel_rank()
        by_sequence = by_sequence[rank * chunk:(rank + 1) * chunk]
    for layer, replay in replays:
        if layer >= by_sequence.shape[2]:
            raise ValueError(f"routing replay: the record has {by_sequence.shape[2]} layers, the model's "
                             f"router {layer + 1} has none")
        replay.set_target_indices(by_sequence[:, :, layer].reshape(-1, by_sequence.shape[-1]).long())


def agreement_counts(model_chunks: Sequence[torch.nn.Module], *, reset: bool = True) -> tuple[int, int]:
    """``(decisions equal to the record, recorded decisions)`` on this rank since the last reset."""
    agree = total = 0
    for chunk in model_chunks:
        for _, replay in attached(chunk):
            agree, total = agree + replay.agree, total + replay.total
            if reset:
                replay.agree = replay.total = 0
    return agree, total


def check_supported(*, pipeline_stages: int, recompute: str) -> None:
    if pipeline_stages > 1 and recompute != "none":
        raise ValueError("loss.routing_replay: rollout with activation recompute needs one pipeline stage "
                         f"(got pp={pipeline_stages}, recompute={recompute!r}): interleaved micro-batches "
                         "would recompute a router with another micro-batch's experts")
