"""Shared pieces of the evaluation tests: a byte-level chat tokenizer and a scripted engine."""

from __future__ import annotations

import asyncio
from typing import Callable, Iterable

from spade.rollout.engine import GenerationRequest, GenerationResult, RolloutEngine


class ByteTokenizer:
    """Chat template = the messages' contents joined; token ids = UTF-8 bytes."""

    eos_token_id = None

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kwargs):
        text = "".join(f"<{m['role']}>{m.get('content') or ''}" for m in messages)
        if kwargs.get("tools"):
            text = f"<tools>{len(kwargs['tools'])}" + text
        return text + ("<assistant>" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(text.encode())}

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode(errors="replace")


class ScriptedEngine(RolloutEngine):
    """Answers each prompt with ``reply(prompt_text, seed)``; counts calls."""

    def __init__(self, reply: Callable[[str, int], str]):
        self.reply = reply
        self.calls = 0
        self.seeds: list[int] = []

    @property
    def weight_version(self) -> int:
        return 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.calls += 1
        self.seeds.append(request.sampling.seed)
        await asyncio.sleep(0)
        text = self.reply(bytes(request.prompt_ids).decode(), request.sampling.seed)
        ids = tuple(text.encode())[: request.sampling.max_new_tokens]
        return GenerationResult(ids, tuple(0.0 for _ in ids), "stop", 0)

    async def update_weights(self, named_tensors: Iterable, version: int) -> None:
        pass

    def close(self) -> None:
        pass
