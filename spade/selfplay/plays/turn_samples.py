"""The per-turn form of an agent episode (``selfplay.plays.sample_form: per_turn``).

The released 8B thinking runs (``--spade-actor-enable-thinking``) play a game episode as a series of
separate prompts: at every turn the messages so far are rendered afresh with the chat template,
which drops the reasoning of earlier assistant turns (Qwen3's template keeps only the answer of a
turn before the latest user message), and the reply is generated from that rendering. Each turn is
then its own training sample, that prompt plus that reply, the loss on the reply only, and every
turn sample of the episode gets the episode's advantage.

:class:`PerTurnPolicy` plays that way: one fresh :class:`~spade.rollout.conversation.Conversation`
per turn from the runner's whole message list, so each turn's prompt is the template's rendering
of the conversation so far and its completion is appended token for token as generated. The turn
conversations it keeps become the play's trajectories (:func:`play_trajectories`). The default
``sequence`` form keeps one token-exact sequence per episode (:class:`EnginePolicy`).

Budgets are the released per-turn loop's: a turn whose prompt leaves ``RESERVED_REPLY_TOKENS`` or
fewer tokens of ``max_context_tokens`` ends the episode, and a reply may take at most what is left
beyond that reserve (``core/orchestrator.py:626-642``: ``min_generation_tokens = 64``); a reply cut
by its token limit ends the episode too and stays a sample (the released code: a turn without
end-of-sequence is kept and the episode truncated).

An episode's turn samples stay one episode for the loss and the batch (:func:`episode_weights`,
:func:`episodes`): the released code keeps them in one slime group, whose reducer makes the episode
one token mean over all its turns, and cuts and fills the batch before fanning episodes out into
turns (``slime/trajectory_converter.py:100-116``, ``slime/spade_rollout.py:836-906``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence, TypeVar

from ...envs.runner import Message, StopEpisode
from ...rl.samples import Trajectory
from ...rollout.conversation import Conversation
from .policy import EnginePolicy
from ..trajectories import trajectory_of

T = TypeVar("T", bound=Trajectory)


RESERVED_REPLY_TOKENS = 64  # the released per-turn loop's min_generation_tokens


class PerTurnPolicy(EnginePolicy):
    """Renders the messages afresh every turn; keeps each turn's prompt + completion."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # each turn's conversation is measured against the context less the reserve: it ends when
        # no more than the reserve is left, and a reply gets at most what lies beyond it
        self.max_context_tokens -= RESERVED_REPLY_TOKENS
        self.turn_conversations: list[Conversation] = []

    async def __call__(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> str:
        if tools:
            raise ValueError("selfplay.plays.sample_form per_turn is for games; tool episodes stay one sequence")
        self.conversation, self._consumed = None, 0  # the whole message list is this turn's prompt
        base = self.sampling
        if base.seed is not None:  # a new seed each turn, as EnginePolicy derives it from its turn count
            self.sampling = replace(base, seed=base.seed + len(self.turn_conversations))
        try:
            return await super().__call__(messages, tools)
        finally:
            self.sampling = base
            if self.conversation is not None and self.conversation.turns:
                self.turn_conversations.append(self.conversation)

    def mask_last_turn(self) -> None:
        if self.turn_conversations:
            self.turn_conversations[-1].mask_last_completion()


def play_trajectories(policy: EnginePolicy, *, logprob_temperature: float) -> tuple[Trajectory, ...]:
    """A play's training sequences: one per turn for :class:`PerTurnPolicy`, else the episode's one
    sequence (none when nothing was generated)."""
    if isinstance(policy, PerTurnPolicy):
        return tuple(trajectory_of(c, logprob_temperature=logprob_temperature) for c in policy.turn_conversations)
    if policy.conversation is None:
        return ()
    return (trajectory_of(policy.conversation, logprob_temperature=logprob_temperature),)


def episode_weights(turns: Sequence[Trajectory]) -> list[Trajectory]:
    """The turn samples of one episode weighted as the released group reducer reads them: turn
    ``t`` with ``n_t`` of the episode's ``N`` loss tokens gets ``loss_weight = n_t / N``, so the
    weighted sum of the turns' token means is the episode's token mean; the first turn sample
    carries the episode's count (``count_weight`` 1, the others 0). One sample keeps 1 and 1."""
    if len(turns) < 2:
        return list(turns)
    tokens = [sum(t.loss_mask) for t in turns]
    total = sum(tokens)
    return [t.replace(loss_weight=n / total if total else 0.0, count_weight=int(i == 0))
            for i, (t, n) in enumerate(zip(turns, tokens))]


def episodes(samples: Sequence[T]) -> list[list[T]]:
    """``samples`` in episodes: each begins at a sample that counts (``count_weight`` > 0) and
    holds the turn samples after it that do not (:func:`episode_weights`). Samples that each count
    (one sequence per episode, designer samples) are one episode each."""
    out: list[list[T]] = []
    for sample in samples:
        if sample.count_weight > 0 or not out:
            out.append([sample])
        else:
            out[-1].append(sample)
    return out
