"""The chat-model interface: what a benchmark may ask of the model under test.

``runner.ChatModel`` is the implementation (a chat front end over a ``RolloutEngine``). A benchmark
that samples itself calls ``complete``; one whose own harness talks to the model over HTTP (tau2,
ACEBench) serves ``engine`` and ``tokenizer`` with the model's stop tokens, context length and
chat-template keywords. Records carry ``engine.weight_version``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol, Sequence

from ..rollout.engine import RolloutEngine
from .types import SamplingSettings


@dataclass(frozen=True)
class Completion:
    """One sampled reply: its text, why it ended, its token counts and the weights it came from."""

    text: str
    finish_reason: str
    tokens: int
    prompt_tokens: int
    weight_version: int
    reasoning_open: bool = False  # the prompt left <think> open: the reply starts inside reasoning


class ChatModelLike(Protocol):
    """The model under test as the benchmarks see it."""

    engine: RolloutEngine
    tokenizer: Any
    concurrency: int  # generations in flight at once
    max_context_tokens: Optional[int]  # prompt plus completion; None: the engine's
    stop_token_ids: tuple[int, ...]
    template_kwargs: dict[str, Any]  # the chat template's keywords (e.g. enable_thinking)

    async def complete(self, messages: Sequence[Mapping[str, Any]], sampling: SamplingSettings, seed: int,
                       tools: Optional[list] = None) -> Completion: ...
