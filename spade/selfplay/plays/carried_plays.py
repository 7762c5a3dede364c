"""Unfinished plays carried across steps (partial rollouts, :mod:`.partial_rollout_settings`).

A carried play is stopped at a turn boundary: its episode record holds the runner's messages up to
the user message the policy was about to answer and the completed turns (their actions replay the
environment from its reset seed), and its conversation snapshot holds the exact token state at that
point (ids, target loss mask, per-token behaviour log-probs and weight versions, the turn count that
the sampling seed continues from). A reply the engine was writing when the step stopped is dropped
(its request is cancelled) and sampled again, with the same seed, when the play continues.

A :class:`CarriedGroup` is one environment's no-hint group of one step that had unfinished plays: its
finished plays wait with it, so the group trains whole in the step where its last play ends.
Everything here is JSON-serialisable for the orchestrator's checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...envs.runner import EndReason, EpisodeResult, Message, Turn
from ...rl.routing_record import RoutedExperts
from ...rollout.conversation import ChatFormat, Conversation
from ..sources.designer_source import EnvSpec
from .play_record import Play, play_from_json, play_to_json, turn_from_json, turn_to_json


class CarryOver(Exception):
    """Raised by a policy whose step has stopped: the play is carried to the next step."""


# -- the conversation's token state --------------------------------------------------------------

_LIST_FIELDS = ("_tokens", "_mask", "_logprobs", "_versions", "weight_versions")


def conversation_state(conversation: Conversation) -> dict[str, Any]:
    """The conversation's exact token state (not its tokenizer / chat format, which the run has)."""
    state: dict[str, Any] = {name: list(getattr(conversation, name)) for name in _LIST_FIELDS}
    state.update(messages=[dict(m) for m in conversation.messages], prompt_ids=list(conversation.prompt_ids),
                 all_logprobs_known=conversation._all_logprobs_known, turns=conversation.turns,
                 end_reason=conversation.end_reason, awaiting_reply=conversation._awaiting_reply,
                 last_generated=list(conversation._last_generated), last_start=conversation._last_start,
                 max_context_tokens=conversation.max_context_tokens, max_turns=conversation.max_turns,
                 min_response_tokens=conversation.min_response_tokens,
                 routed_experts=None if conversation.routed_experts is None else conversation.routed_experts.to_json())
    return state


def restore_conversation(state: dict[str, Any], tokenizer: Any, chat_format: ChatFormat) -> Conversation:
    """A conversation in exactly the token state ``state`` recorded."""
    conversation = Conversation.__new__(Conversation)
    conversation.format, conversation.tokenizer = chat_format, tokenizer
    for name in _LIST_FIELDS:
        setattr(conversation, name, list(state[name]))
    conversation.messages = [dict(m) for m in state["messages"]]
    conversation.prompt_ids = tuple(state["prompt_ids"])
    conversation._all_logprobs_known = bool(state["all_logprobs_known"])
    conversation.turns = int(state["turns"])
    conversation.end_reason = state["end_reason"]
    conversation._awaiting_reply = bool(state["awaiting_reply"])
    conversation._last_generated = tuple(state["last_generated"])
    conversation._last_start = int(state["last_start"])
    conversation.max_context_tokens = int(state["max_context_tokens"])
    conversation.max_turns = state["max_turns"]
    conversation.min_response_tokens = int(state["min_response_tokens"])
    routed = state.get("routed_experts")
    conversation.routed_experts = None if routed is None else RoutedExperts.from_json(routed)
    return conversation


# -- plays ---------------------------------------------------------------------------------------

@dataclass
class CarriedPlay:
    """One unfinished no-hint play: where it stands, and the seeds it started with."""

    index: int
    env_seed: int
    messages: list[Message] = field(default_factory=list)  # empty: the play had not started
    turns: list[Turn] = field(default_factory=list)
    conversation: dict[str, Any] | None = None  # conversation_state(); None before the first request

    def episode(self) -> EpisodeResult:
        """A fresh episode record to continue into (the runner replays ``turns`` first)."""
        return EpisodeResult(self.env_seed, list(self.messages), list(self.turns), EndReason.TURN_BUDGET)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "env_seed": self.env_seed, "messages": [m.to_dict() for m in self.messages],
                "turns": [turn_to_json(t) for t in self.turns], "conversation": self.conversation}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CarriedPlay":
        return cls(int(data["index"]), int(data["env_seed"]),
                   [Message(m["role"], m["content"]) for m in data["messages"]],
                   [turn_from_json(t) for t in data["turns"]], data.get("conversation"))


@dataclass
class CarriedGroup:
    """One environment's no-hint group begun at ``origin_step`` that had unfinished plays when its
    step ended; ``carries`` counts the step ends it has been carried over."""

    env: EnvSpec
    origin_step: int
    carries: int
    finished: list[Play] = field(default_factory=list)
    unfinished: list[CarriedPlay] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.finished) + len(self.unfinished)

    def to_json(self) -> dict[str, Any]:
        return {"env": self.env.to_json(), "origin_step": self.origin_step, "carries": self.carries,
                "finished": [play_to_json(p) for p in self.finished],
                "unfinished": [p.to_json() for p in self.unfinished]}

    @classmethod
    def from_json(cls, data: dict[str, Any], logprob_temperature: float) -> "CarriedGroup":
        return cls(EnvSpec.from_json(data["env"]), int(data["origin_step"]), int(data["carries"]),
                   [play_from_json(p, logprob_temperature) for p in data["finished"]],
                   [CarriedPlay.from_json(p) for p in data["unfinished"]])
