"""Trajectories of the self-play step, built from token-exact conversations.

Agent trajectories: one per no-hint play that generated anything, the conversation's token ids
with the loss on the agent's own tokens; the step gives each the z-score of its return among the
plays of the same environment in the same step (SPEC 1.3). By default a multi-turn play is one
sample: with a thinking model every turn's ``<think>`` reasoning stays in it as generated, though
the chat template would drop earlier turns' reasoning on re-rendering, so the sample is exactly the
sequence the engine conditioned on (see ``spade.rollout.conversation``). The released 8B form, one
sample per turn with the play's advantage, is ``selfplay.plays.sample_form: per_turn``
(``spade.selfplay.plays.turn_samples``).

Designer trajectories: one per admitted environment, the designer call's prompt and whole
response (loss on the response tokens), held in their JSON form until the delay buffer releases
them ``k`` steps later. Their rollout log-probs are stored exactly as generated, never recomputed
(the trainer's truncated importance sampling corrects the staleness, see ``delay_buffer``).

Every trajectory carries the temperature its log-probs are taken at (the role's sampling
temperature, 1 for greedy): the trainer computes its own log-probs of the sample at that
temperature. A pending designer trajectory checkpointed by a version without the field gets its
role's configured temperature when it is read back (:func:`role_logprob_temperature`).
"""

from __future__ import annotations

from typing import Any

from ..rl.samples import Role, Trajectory
from ..rollout.conversation import Conversation
from ..rollout.engine import SamplingParams


def trajectory_of(conversation: Conversation, *, logprob_temperature: float) -> Trajectory:
    """The conversation's sequence: token ids, target-aligned loss mask, rollout log-probs (None
    when a turn came without them), the temperature they are taken at (``SamplingParams.
    logprob_temperature`` of the calls that wrote it) and the oldest engine weight version that
    generated any of its tokens (None when unknown), with the per-token versions when they differ
    (a play finished under newer weights), and the engine's routing when it was recorded (routing
    replay). Role, environment and scores are added by the step."""
    fields = conversation.train_fields()
    versions = fields["token_weight_versions"]
    mixed = len({v for v in versions if v is not None}) > 1  # else weight_version says it all
    return Trajectory(token_ids=fields["token_ids"], loss_mask=fields["loss_mask"],
                      rollout_logprobs=fields["rollout_logprobs"], weight_version=fields["weight_version"],
                      logprob_temperature=logprob_temperature,
                      token_weight_versions=tuple(versions) if mixed else None,
                      routed_experts=fields["routed_experts"])


def role_logprob_temperature(settings: Any, role: Role) -> float:
    """The log-prob temperature of ``role``'s samples under ``settings`` (a ``SelfPlaySettings``):
    its sampling temperature, 1 when that is 0 (greedy)."""
    sampling = settings.sampling.agent if Role(role) is Role.AGENT else settings.sampling.designer
    temperature = sampling.temperature
    return SamplingParams(temperature=temperature).logprob_temperature
