"""Two policies that play as the released trainer did where ``selfplay.plays`` asks for it.

- :class:`ReleasedHintPolicy` (``hint_arm_budgets: released``, games): the released hinted arm
  (``_play_game_with_hint_async``, ``core/orchestrator.py:1861-1905``) sends the conversation as
  messages with ``max_tokens = actor_max_tokens`` every turn, checks no context budget and no
  end-of-sequence: a reply cut by its token limit is parsed and played like any other. Only the
  turn budget (and the environment) ends it. Each turn renders the messages afresh, as the
  released request did (hinted plays are never trained, so no token history is kept), and a conversation longer than the engine's own context fails in the engine, as the
  released request would have failed on the server.
- :class:`ScopedMaskPolicy` (``tool_mask_scope: tool_call_block``, tool use): the runner asks the
  policy to mask every reply it reads as a format error; this one masks only a reply holding a
  ``<tool_call>`` block, as the released check ``"<tool_call>" in raw_action`` did
  (``core/orchestrator.py:924-931``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...envs.runner import Message, StopEpisode
from ...rollout.conversation import ChatFormat
from ...rollout.engine import RolloutEngine, SamplingParams
from .policy import EnginePolicy

# The released hinted arm has no context budget; this stands for "none" in the token bookkeeping.
UNBOUNDED_CONTEXT = 1 << 40
TOOL_CALL_OPEN = "<tool_call>"


class ReleasedHintPolicy(EnginePolicy):
    """The released hinted arm: no context budget, a cut-off reply is played, not an ending."""

    _turns: int = 0

    async def __call__(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> str:
        # the released arm sends the messages, rendered afresh each turn (input_ids=None): a cut-off
        # reply leaves no open completion behind, and no earlier token is kept (never trained)
        self.conversation, self._consumed = None, 0
        base = self.sampling
        if base.seed is not None:  # a new seed each turn, as EnginePolicy derives it from its turn count
            self.sampling = replace(base, seed=base.seed + self._turns)
        try:
            return await super().__call__(messages, tools)
        except StopEpisode as stop:
            if stop.response is None:  # the turn budget (the only budget left) or a carried play
                raise
            return stop.response
        finally:
            self.sampling, self._turns = base, self._turns + 1


class ScopedMaskPolicy(EnginePolicy):
    """Masks a malformed reply only when it holds a ``<tool_call>`` block."""

    last_reply: str = ""

    async def __call__(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> str:
        self.last_reply = ""
        try:
            self.last_reply = await super().__call__(messages, tools)
        except StopEpisode as stop:
            self.last_reply = stop.response or ""
            raise
        return self.last_reply

    def mask_last_turn(self) -> None:
        if TOOL_CALL_OPEN in self.last_reply:
            super().mask_last_turn()


def released_hint_policy(engine: RolloutEngine, tokenizer: Any, sampling: SamplingParams, *,
                         chat_format: ChatFormat | None) -> ReleasedHintPolicy:
    return ReleasedHintPolicy(engine, tokenizer, sampling, max_context_tokens=UNBOUNDED_CONTEXT,
                              chat_format=chat_format)


def scoped_mask_policy(engine: RolloutEngine, tokenizer: Any, sampling: SamplingParams, *,
                       max_context_tokens: int, chat_format: ChatFormat | None) -> ScopedMaskPolicy:
    return ScopedMaskPolicy(engine, tokenizer, sampling, max_context_tokens=max_context_tokens,
                            chat_format=chat_format)
