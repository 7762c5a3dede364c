"""In-process rollout engine on transformers (CPU or one GPU): the embedded default and test engine.

Generation is the engine's own loop over the model's forward with a KV cache, not
``model.generate``, so that every request keeps its own sampling settings, stop tokens and random
stream, and the log-prob of each sampled token comes out of the same logits it was sampled from
(``spade.rollout.engine`` says which distribution).

Batching, continuous joins, shared prompt prefixes and the streaming hand-over are the scheduler's
(:mod:`.scheduler`); the token draw and its random stream are :mod:`.sampling`'s.

Weights. ``update_weights`` takes checkpoint-named tensors (``spade.models.loading.hf_weights``
yields them: one tensor per expert for MoE) and copies them in place into the transformers model;
per-expert tensors of a layer are collected until the layer is complete and then fused with
``spade.models.transformers_state.to_transformers_state``. The copy waits for the running batch
and runs before the next one, so every result is produced by exactly one weight version. A failed
update may leave the model partly updated; the version is only bumped on success.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Optional, Sequence, Union

import torch
from torch import Tensor

from ..engine import (
    EngineClosed,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    GenerationStats,
    RolloutEngine,
)
from ..settings import DEFAULT_PREFILL_CHUNK_TOKENS
from .scheduler import BatchScheduler, HFEngineStats, _Pending, _Sink

_PER_EXPERT = re.compile(r"^(.+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")

ModelSource = Union[str, Path, Any, tuple[Any, Any]]


class HFEngine(BatchScheduler, RolloutEngine):
    """transformers causal LM served through ``RolloutEngine``.

    ``model``: a local HF directory, a transformers model, or ``(model, tokenizer)``. A model object
    is moved to ``device``/``dtype`` in place. ``eos_token_ids``: ids that always end a completion
    (default: the generation config's and tokenizer's EOS; ``()`` for none).
    ``max_context_tokens``: prompt plus completion limit (default: the config's
    ``max_position_embeddings``). ``prefill_chunk_tokens``: padded prompt tokens per prefill forward
    (rows are computed in groups; 0: every row at once), see ``scheduler``'s docstring.
    ``return_routed_experts``: every result carries its routing (``.routing``), whatever the request.
    """

    def __init__(
        self,
        model: ModelSource,
        tokenizer: Any = None,
        *,
        device: Union[str, torch.device] = "cpu",
        dtype: Union[torch.dtype, str] = torch.float32,
        max_batch_size: int = 8,
        batch_wait_ms: float = 2.0,
        eos_token_ids: Optional[Sequence[int]] = None,
        max_context_tokens: Optional[int] = None,
        prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS,
        return_routed_experts: bool = False,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if prefill_chunk_tokens < 0:
            raise ValueError(f"prefill_chunk_tokens must be >= 0 (0: all rows at once), got {prefill_chunk_tokens}")
        if batch_wait_ms < 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {batch_wait_ms}")
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        self.device = torch.device(device)
        self.dtype = dtype
        if isinstance(model, tuple):
            model, tokenizer = model
        if isinstance(model, (str, Path)):
            model, tokenizer = _load_pretrained(Path(model), dtype, tokenizer)
        self.model = model.to(device=self.device, dtype=dtype).eval()
        from .prefix_attention import enable_shared_prefix_attention

        # a batch's shared prompt prefix is attended to once rather than copied into every row
        self.prefix_attention = enable_shared_prefix_attention(self.model)
        self.tokenizer = tokenizer
        self.eos_token_ids: frozenset[int] = frozenset(
            _default_eos_ids(self.model, tokenizer) if eos_token_ids is None else eos_token_ids
        )
        self.max_context_tokens = int(
            max_context_tokens or getattr(self.model.config, "max_position_embeddings", 1 << 30)
        )
        self.max_batch_size = max_batch_size
        self.prefill_chunk_tokens = prefill_chunk_tokens
        # every result carries its routed experts (loss.routing_replay: rollout), as if each request asked
        self.return_routed_experts = return_routed_experts
        if return_routed_experts:
            from .routing import is_moe

            if not is_moe(self.model):
                raise ValueError("return_routed_experts (loss.routing_replay: rollout) needs a mixture-of-experts "
                                 f"model; {type(self.model).__name__} has no router")
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.stats = HFEngineStats()
        self._weight_version = 0
        self._closed = False
        self._abort = threading.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self._seeds = random.SystemRandom()
        # per event loop; created on first use (see _attach)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._queue: deque[_Pending] = deque()
        self._wakeup: Optional[asyncio.Event] = None
        self._model_lock: Optional[asyncio.Lock] = None
        self._updates_waiting = 0  # weight updates waiting for the running batch to end
        self.continuous_batching = True  # False: requests that arrive mid-batch wait for the next one
        self._task: Optional[asyncio.Task] = None

    # ------------------------------------------------------------------ public API

    @property
    def weight_version(self) -> int:
        return self._weight_version

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return await self._submit(request, stream=False).future

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        pending = self._submit(request, stream=True)
        sink, future = pending.sink, pending.future
        future.add_done_callback(lambda _: sink.changed.set())
        sent = 0
        try:
            while not future.done():
                if len(sink.tokens) > sent:
                    new = len(sink.tokens)
                    yield GenerationChunk(tuple(sink.tokens[sent:new]), tuple(sink.logprobs[sent:new]),
                                          top_logprobs=tuple(sink.top_logprobs[sent:new]))
                    sent = new
                    continue
                sink.changed.clear()
                await sink.changed.wait()
            result = future.result()
            # the result holds every token, whether or not its hand-over has run yet
            yield GenerationChunk(result.token_ids[sent:], result.logprobs[sent:],
                                  result.finish_reason, result.weight_version,
                                  result.top_logprobs[sent:])
        finally:
            if not future.done():
                future.cancel()  # the worker ends the row at its next step

    def _submit(self, request: GenerationRequest, *, stream: bool) -> _Pending:
        self._check_open()
        loop = self._attach()
        seed = request.sampling.seed
        if seed is None:
            seed = self._seeds.getrandbits(63)
        pending = _Pending(request, loop.create_future(), seed, _Sink(loop) if stream else None)
        self._queue.append(pending)
        self._wakeup.set()
        return pending

    async def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        self._check_open()
        self._attach()
        self._updates_waiting += 1  # the running batch takes no more requests: it ends, then the copy
        try:
            async with self._model_lock:
                self._copy_weights(named_tensors)
                self._weight_version = int(version)
        finally:
            self._updates_waiting -= 1

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._abort.set()
        loop, task = self._loop, self._task
        if task is not None and not task.done() and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wakeup.set)  # _serve aborts the queue and shuts down
        else:
            self._executor.shutdown(wait=False)

    def generation_stats(self) -> GenerationStats:
        stats = self.stats
        return GenerationStats(generated_tokens=stats.generated_tokens, busy_s=stats.busy_s)

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed("the engine is closed")

    # ------------------------------------------------------------------ weights

    @torch.no_grad()
    def _copy_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        targets = self.model.state_dict()  # detached views of the live parameters
        fused_names = {n for n in targets if n != "lm_head.weight"}
        experts: dict[str, dict[str, Tensor]] = {}
        for name, tensor in named_tensors:
            match = _PER_EXPERT.match(name)
            if match and f"{match[1]}.gate_up_proj" in targets:
                group = experts.setdefault(match[1], {})
                group[name] = tensor
                if len(group) == 3 * targets[f"{match[1]}.gate_up_proj"].shape[0]:
                    from spade.models.transformers_state import to_transformers_state

                    fused = to_transformers_state(group, fused_names, self._model_spec())
                    for fused_name, value in fused.items():
                        _copy_into(targets, fused_name, value)
                    del experts[match[1]]
            else:
                _copy_into(targets, name, tensor)
        if experts:
            missing = {prefix: 3 * targets[f"{prefix}.gate_up_proj"].shape[0] - len(group)
                       for prefix, group in experts.items()}
            raise ValueError(f"incomplete expert tensors (prefix: missing count): {missing}")

    def _model_spec(self):
        from spade.models import read_model_spec

        return read_model_spec(self.model.config)


def _copy_into(targets: dict[str, Tensor], name: str, value: Tensor) -> None:
    if name not in targets:
        raise KeyError(f"update_weights: {name!r} is not a tensor of this model")
    target = targets[name]
    if tuple(target.shape) != tuple(value.shape):
        raise ValueError(f"update_weights: {name} has shape {tuple(value.shape)}, "
                         f"the model expects {tuple(target.shape)}")
    target.copy_(value)


def _load_pretrained(directory: Path, dtype: torch.dtype, tokenizer: Any) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
    if tokenizer is None:
        try:
            tokenizer = AutoTokenizer.from_pretrained(directory)
        except (OSError, ValueError):
            tokenizer = None
    return model, tokenizer


def _default_eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    value = getattr(config, "eos_token_id", None) if config is not None else None
    if isinstance(value, int):
        ids.add(value)
    elif value:
        ids.update(int(v) for v in value)
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
