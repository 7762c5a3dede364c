"""The agent policy for the episode runner, backed by a rollout engine and token-exact.

The runner (``spade.envs.runner``) speaks messages; training needs the exact token sequence the
engine saw and produced. ``EnginePolicy`` keeps a :class:`~spade.rollout.conversation.Conversation`
beside the runner's message list: each call appends only the messages the runner added since the
last call (as template deltas), generates, appends the generated ids verbatim and returns their
text. A reply cut off by its token limit, or a context / turn budget that is spent, stops the
episode (return 0, SPEC section 4); the tokens generated so far stay in the sample. The runner's
history is never re-rendered, so a thinking model sees its earlier turns' reasoning (the template
keywords, ``enable_thinking`` among them, come from the shared ``ChatFormat``; a tool episode
adds ``tools`` to them).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import Any

from ...envs.runner import Message, StopEpisode
from ...rollout.conversation import BudgetExceeded, ChatFormat, Conversation
from ...rollout.engine import GenerationRequest, RolloutEngine, SamplingParams
from ...agent.reasoning import prompt_opens_reasoning
from .carried_plays import CarryOver


class EnginePolicy:
    """One episode's policy. Create a new one per episode (it owns that episode's tokens)."""

    def __init__(self, engine: RolloutEngine, tokenizer: Any, sampling: SamplingParams, *,
                 max_context_tokens: int, chat_format: ChatFormat | None = None,
                 stop: asyncio.Event | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.max_context_tokens = max_context_tokens
        self.chat_format = chat_format
        self.conversation: Conversation | None = None
        self.weight_versions: list[int] = []
        self.affinity = uuid.uuid4().hex  # every turn of the episode on one server (prefix cache)
        self._consumed = 0  # runner messages already in the conversation
        self.prompt_opened_reasoning = False
        # partial rollouts: once ``stop`` is set, a call cancels its request and raises CarryOver with
        # the conversation holding the prompt of the reply that was due (see carried_plays)
        self.stop = stop
        self._restored = False

    def restore(self, conversation: Conversation) -> None:
        """Continue a carried play: ``conversation`` awaits the reply to the runner's last message."""
        self.conversation, self._restored = conversation, True

    async def __call__(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> str:
        """The next reply. ``tools`` (tool episodes, OpenAI format) go into the chat template's
        ``tools=`` argument, the way the model family expects them (Qwen3: a system block)."""
        new = [m.to_dict() for m in messages[self._consumed:]]
        try:
            if self._restored:  # the carried conversation already holds these messages
                self._restored = False
            elif self.conversation is None:
                chat_format = self.chat_format
                if tools:
                    base = dict(chat_format.template_kwargs) if chat_format is not None else {}
                    chat_format = ChatFormat(self.tokenizer, {**base, "tools": tools})
                self.conversation = Conversation(self.tokenizer, new, max_context_tokens=self.max_context_tokens,
                                                 chat_format=chat_format)
            else:
                self.conversation.append_messages(new)
        except BudgetExceeded as exceeded:
            raise StopEpisode(f"{exceeded.reason} budget spent") from None
        self._consumed = len(messages) + 1  # the runner appends our reply next
        conversation = self.conversation
        # whether the template's generation prompt left <think> open (Qwen3-Thinking-2507): the
        # reply then starts inside the reasoning (read by spade.envs.tool_use.replies)
        tail = self.tokenizer.decode(conversation.token_ids[-8:])
        self.prompt_opened_reasoning = prompt_opens_reasoning(tail)
        seed = None if self.sampling.seed is None else self.sampling.seed + conversation.turns
        sampling = replace(self.sampling, max_new_tokens=conversation.max_new_tokens(self.sampling.max_new_tokens),
                           seed=seed)
        request = GenerationRequest(tuple(conversation.token_ids), sampling, affinity=self.affinity)
        result = await (self.engine.generate(request) if self.stop is None else self._generate_unless_stopped(request))
        self.weight_versions.append(result.weight_version)
        text = conversation.append_generated(result.token_ids, result.logprobs, result.finish_reason,
                                             result.weight_version, routed_experts=result.routed_experts)
        if result.finish_reason != "stop":
            raise StopEpisode(f"the reply ended without end-of-turn ({result.finish_reason})", response=text)
        return text

    async def _generate_unless_stopped(self, request: GenerationRequest) -> Any:
        assert self.stop is not None
        if self.stop.is_set():
            raise CarryOver()
        generation = asyncio.ensure_future(self.engine.generate(request))
        stopped = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({generation, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not generation.done():
                generation.cancel()  # the engine drops the request
        if generation.cancelled() or not generation.done():
            raise CarryOver()
        return generation.result()

    def mask_last_turn(self) -> None:
        """Drop the last reply's tokens from the loss (a malformed tool call, when so configured)."""
        if self.conversation is not None:
            self.conversation.mask_last_completion()
