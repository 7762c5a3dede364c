"""A rollout engine whose reply to each request is decided by a test (``reply_ids``): the model
side of tests that run spade serve's real HTTP server, template and protocol with replies a
random tiny model would not give (a tool call, a game move)."""

from __future__ import annotations

from spade.rollout.engine import GenerationChunk, GenerationResult, RolloutEngine


class ScriptedEngine(RolloutEngine):
    """Subclasses give ``reply_ids(prompt)``: the token ids (ending with EOS) to answer the decoded
    prompt with; every prompt is kept in ``prompts``."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.prompts: list[str] = []

    def reply_ids(self, prompt: str) -> list[int]:
        raise NotImplementedError

    def text_ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]

    @property
    def weight_version(self) -> int:
        return 0

    def _ids(self, request) -> list[int]:
        prompt = self.tokenizer.decode(list(request.prompt_ids))
        self.prompts.append(prompt)
        return self.reply_ids(prompt)

    async def generate(self, request):
        ids = self._ids(request)
        return GenerationResult(ids, [-0.5] * len(ids), "stop", 0)

    async def generate_stream(self, request):
        ids = self._ids(request)
        for k, token in enumerate(ids):
            last = k == len(ids) - 1
            yield GenerationChunk((token,), (-0.5,), "stop" if last else None, 0 if last else None)

    async def update_weights(self, named_tensors, version: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass
