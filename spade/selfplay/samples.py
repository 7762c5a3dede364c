"""Training samples of the self-play step, and their JSON form (for the delay buffer's store).

Agent samples: one per no-hint play that generated anything, the conversation's token ids with
the loss on the agent's own tokens and the play's scalar advantage (the z-score of its return
among the plays of the same environment in the same step, SPEC 1.3).

Designer samples: one per admitted environment, the designer call's prompt and whole response
(loss on the response tokens), kept as plain lists until the delay buffer releases them ``k``
steps later. Their rollout log-probs are stored exactly as generated, never recomputed (the
trainer's truncated importance sampling corrects the staleness, see ``delay_buffer``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..rollout.conversation import Conversation
from ..training.batching import TrainSample


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from ``parts`` (same in every process and Python run)."""
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF


def sample_fields(conversation: Conversation) -> dict[str, Any]:
    """The JSON-serialisable sequence of a conversation: ``token_ids``, target-aligned
    ``loss_mask`` and ``rollout_logprobs`` (None when a turn came without log-probs) and ``weight_version`` (the
    oldest engine weight version that generated any of its tokens; None when unknown)."""
    fields = conversation.train_fields()
    return {
        "token_ids": [int(t) for t in fields["token_ids"]],
        "loss_mask": [int(m) for m in fields["loss_mask"]],
        "rollout_logprobs": None if fields["rollout_logprobs"] is None
        else [float(x) for x in fields["rollout_logprobs"]],
        "weight_version": fields["weight_version"],
    }


def train_sample(fields: dict[str, Any], advantage: float) -> TrainSample | None:
    """A TrainSample with one advantage for the whole sequence; None when nothing can be learned
    from it (fewer than two tokens or no loss token)."""
    if len(fields["token_ids"]) < 2 or not any(fields["loss_mask"]):
        return None
    return TrainSample(token_ids=fields["token_ids"], loss_mask=fields["loss_mask"], advantages=float(advantage),
                       rollout_logprobs=fields["rollout_logprobs"], weight_version=fields.get("weight_version"))
