"""The hf engine's batching: requests queued on the event loop, decoded together on one worker thread.

Batching. ``generate`` puts the request on a queue and awaits a future. One asyncio task per engine
collects queued requests (up to ``max_batch_size``, waiting at most ``batch_wait_ms`` for more
after the first) and runs the batch on a single worker thread, so the event loop stays free.
Batches are continuous: a request that arrives while a batch decodes joins it at the next step if
there is room (its prompt is computed apart and its cache merged in), and each row's result is
handed over at the end of the step in which it finished, so an episode's next turn can join while
the others are still generating. A weight update that is waiting stops joins: the batch ends, the
copy runs, and the next batch starts with the new weights. Inside a batch the prompts are
left-padded, with an attention mask and explicit position ids (each row counts from 0 at its first
real token); rows that finish are dropped from the KV cache, and columns that only they used are
cut from the left. The cache grows in chunks rather than by a copy per step (:mod:`.kv_cache`).
When every prompt of a batch starts with the same ``MIN_SHARED_PREFIX`` or more tokens, that prefix
is computed once; the rest of each prompt follows it, left-padded (``[prefix][pad][rest]``, the
mask hiding the pad, positions continuing after the prefix). On SDPA models of plain attention
(Llama, Qwen2/3, Qwen3-MoE) the prefix's keys and values stay a batch of one that every row attends
to beside its own cache (:mod:`.prefix_attention`); other models get a copy of its cache per row.
This is what the designer's batch of one regeneration looks like (the same instructions and memory
block, a different document at the end): it saves most of that batch's prompt computation and, with
the prefix attended to once, most of each decode step's reading of the cache. A request that joins
such a batch shares as much of its prefix as its prompt starts with: the part it does not share is
moved into every row's own cache first, unless that would put more than ``prefill_chunk_tokens``
prefix tokens into the running rows' caches (the part moved times those rows): such a request waits
until enough rows have left. (A hint request that shared nothing with a regeneration's 16 designer rows copied their
2,300-token prefix into each, 1.2 GB on SmolLM2-135M, and made every later decode step read 16 copies.)

Prefill in row chunks. A batch's prompts (and a group of joiners) are computed in groups of rows of
at most ``prefill_chunk_tokens`` padded tokens each, whose caches are then put together row by row:
the attention and MLP activations of one forward scale with its tokens, and all 16 designer prompts
of a regeneration at once (~2,000 tokens each) took 3 GB above the cache on SmolLM2-135M. Each row
is computed by the same operations on the same inputs as in one pass (positions, mask and padding
width are those of the whole batch); only the number of rows in a matrix product changes.

Streaming. ``generate_stream`` queues the request like ``generate`` with a sink attached: after
each decode step the worker thread hands the row's new token and its log-prob to the event loop
(``loop.call_soon_threadsafe``), where the caller's iterator picks them up. The sink is the only
difference: the row is batched, sampled and cut exactly as a non-streaming request, so a stream
yields the tokens and log-probs ``generate`` would return. When the caller stops iterating (a
client went away), its future is cancelled; the worker sees that at the next step, ends the row
with ``"abort"`` and drops it from the batch and the KV cache, so the slot is free and the batch
goes on without it (or ends, if it was the last row).

``BatchScheduler`` holds this loop; ``HFEngine`` (``engine.py``) is built on it and owns the
model, the public calls and the weights. The token of each row is drawn by :mod:`.sampling`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch
from torch import Tensor

from ..engine import FinishReason, GenerationRequest, GenerationResult, TopLogprobs
from .sampling import choose_token, penalize, top_alternatives

if TYPE_CHECKING:  # the cache modules import transformers, which this module loads only when used
    from .grammar import GrammarCompilerCache, GrammarState
    from ...rl.routing_record import RoutedExperts
    from .kv_cache import SharedPrefix

# A batch whose prompts all begin with at least this many equal tokens computes them once (the
# designer prompts of one regeneration share their instructions and memory block).
MIN_SHARED_PREFIX = 16


@dataclass
class HFEngineStats:
    """Counters for tests and metrics (updated by the worker thread)."""

    batches: int = 0
    forward_calls: int = 0
    sequences: int = 0
    generated_tokens: int = 0
    busy_s: float = 0.0  # wall time spent running batches: generation only
    batch_sizes: list[int] = field(default_factory=list)
    running: int = 0  # rows decoding right now (0: idle); a row that ends leaves at once
    aborted: int = 0  # rows ended with "abort" (engine closed, or the caller gave up)
    shared_prefix_tokens: int = 0  # prompt tokens not recomputed because a batch shared them
    join_sizes: list[int] = field(default_factory=list)  # requests that joined a running batch, per join


class _Sink:
    """Where the worker thread sends a streaming request's tokens: they are appended on the
    event loop, and ``changed`` wakes the iterator."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.top_logprobs: list[TopLogprobs] = []
        self.changed = asyncio.Event()

    def _append(self, token: int, logprob: float, top: Optional[TopLogprobs]) -> None:
        self.tokens.append(token)
        self.logprobs.append(logprob)
        if top is not None:
            self.top_logprobs.append(top)
        self.changed.set()

    def send(self, token: int, logprob: float, top: Optional[TopLogprobs] = None) -> None:
        """Called from the worker thread."""
        try:
            self.loop.call_soon_threadsafe(self._append, token, logprob, top)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


@dataclass
class _Pending:
    request: GenerationRequest
    future: asyncio.Future
    seed: int
    sink: Optional[_Sink] = None


@dataclass
class _Row:
    """One request's state inside a running batch."""

    pending: _Pending
    generator: torch.Generator
    limit: int  # tokens this row may still generate in total
    stop_ids: frozenset[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[TopLogprobs] = field(default_factory=list)  # only when the request asks
    grammar: Optional["GrammarState"] = None  # a constrained request's matcher (.grammar)
    finish: Optional[FinishReason] = None


@dataclass
class _Decoding:
    """A running batch: its rows and their cache (``[rows, columns]``, left-padded so that every
    row ends at the last column), ``mask`` over those columns, each row's last position, and the
    shared prefix the rows attend to apart (``prefix_ids`` its tokens). ``members``: every request
    the batch took, joiners included (a failure is reported to each that is still waiting)."""

    rows: list[_Row]
    members: list[_Pending]
    version: int
    queue: deque  # where the requests of the event loop this batch serves wait
    cache: Any = None
    mask: Optional[Tensor] = None
    positions: Optional[Tensor] = None
    prefix: Optional["SharedPrefix"] = None
    prefix_ids: tuple[int, ...] = ()
    joinable: bool = False  # the cache can take rows mid-batch (growing layers)
    finished: list[_Row] = field(default_factory=list)  # rows whose results are still to be handed over


def _merge_masks(top: Tensor, bottom: Tensor) -> Tensor:
    """Stack two row masks that end at the same column, left-padding the narrower one."""
    width = max(top.shape[1], bottom.shape[1])
    return torch.cat([torch.nn.functional.pad(top, (width - top.shape[1], 0)),
                      torch.nn.functional.pad(bottom, (width - bottom.shape[1], 0))], dim=0)


def _settle(future: asyncio.Future, result: GenerationResult) -> None:
    if not future.done():
        future.set_result(result)


def _fail_soon(future: asyncio.Future, exc: BaseException) -> None:
    """From the worker thread: fail one caller's future on its event loop."""
    def fail() -> None:
        if not future.done():
            future.set_exception(exc)

    try:
        future.get_loop().call_soon_threadsafe(fail)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


class BatchScheduler:
    """The batching loop of ``HFEngine`` (module docstring): the event-loop task that forms
    batches and the worker-thread decode of each. The engine sets these attributes."""

    model: Any
    device: torch.device
    dtype: torch.dtype
    stats: HFEngineStats
    max_batch_size: int
    batch_wait_s: float
    eos_token_ids: frozenset[int]
    max_context_tokens: int
    prefix_attention: bool  # a shared prefix is attended to apart (False: copied into every row)
    prefill_chunk_tokens: int  # padded tokens per prefill forward (rows x width); 0: all rows at once
    continuous_batching: bool  # False: requests that arrive mid-batch wait for the next one
    _weight_version: int
    _closed: bool
    _abort: threading.Event
    _executor: ThreadPoolExecutor
    _loop: Optional[asyncio.AbstractEventLoop]
    _queue: "deque[_Pending]"
    _wakeup: Optional[asyncio.Event]
    _model_lock: Optional[asyncio.Lock]
    _updates_waiting: int
    _task: Optional[asyncio.Task]

    # ------------------------------------------------------------------ batching loop

    def _attach(self) -> asyncio.AbstractEventLoop:
        """Start the batching task on the running loop (again if an earlier loop has ended)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._task is not None and not self._task.done() and not self._loop.is_closed():
                raise RuntimeError("HFEngine is already serving another running event loop")
            self._loop = loop
            self._queue = deque()
            self._wakeup = asyncio.Event()
            self._model_lock = asyncio.Lock()
            self._task = loop.create_task(self._serve(), name="hf-engine-batcher")
        return loop

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                while not self._queue and not self._closed:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                if self._closed:
                    break
                await self._wait_for_more(loop)
                batch = self._take_batch()
                if not batch:
                    continue
                async with self._model_lock:
                    members = list(batch)  # the worker adds the requests that join the batch
                    try:
                        await loop.run_in_executor(self._executor, self._run_batch, members)
                    except Exception as error:  # noqa: BLE001 - handed to every caller still waiting
                        for item in members:
                            if not item.future.done():
                                item.future.set_exception(error)
        finally:
            if self._closed:
                while self._queue:
                    item = self._queue.popleft()
                    if not item.future.done():
                        item.future.set_result(_empty_result("abort", self._weight_version))
                self._executor.shutdown(wait=False)

    async def _wait_for_more(self, loop: asyncio.AbstractEventLoop) -> None:
        deadline = loop.time() + self.batch_wait_s
        while len(self._queue) < self.max_batch_size and not self._closed:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except asyncio.TimeoutError:
                return

    def _take_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        while self._queue and len(batch) < self.max_batch_size:
            item = self._queue.popleft()
            if not item.future.done():  # skip callers that gave up while queued
                batch.append(item)
        return batch

    # ------------------------------------------------------------------ inference (worker thread)

    @torch.inference_mode()
    def _run_batch(self, members: list[_Pending]) -> None:
        """Decode ``members`` until every row has finished; requests queued meanwhile join at a
        decode step while there is room (``members`` grows by them). Each row's result is handed
        to its caller at the end of the step in which it finished, after the counters."""
        started = time.perf_counter()
        batch = _Decoding(rows=[], members=members, version=self._weight_version, queue=self._queue)
        self.stats.batches += 1
        self.stats.sequences += len(members)
        try:
            batch.rows = self._live_rows(batch, members)
            self.stats.batch_sizes.append(len(batch.rows))
            if batch.rows:
                self.stats.running = len(batch.rows)
                self._decode(batch)
        finally:
            self.stats.running = 0
            self.stats.busy_s += time.perf_counter() - started
            self._hand_over(batch)

    def _live_rows(self, batch: "_Decoding", items: list[_Pending]) -> list[_Row]:
        """Rows for ``items``; a request with no room for a token is finished at once."""
        rows = []
        for item in items:
            try:
                row = self._new_row(item)
            except Exception as exc:  # noqa: BLE001 - a grammar that does not compile: this caller's error only
                _fail_soon(item.future, exc)
                continue
            if row.limit <= 0:
                row.finish = "length"
                batch.finished.append(row)
            else:
                rows.append(row)
        return rows

    def _hand_over(self, batch: "_Decoding") -> None:
        """Hand the finished rows' results to their callers on the event loop (worker thread)."""
        for row in batch.finished:
            result = GenerationResult(row.tokens, row.logprobs, row.finish or "abort", batch.version,
                                      routed_experts=self._routed_experts(row),
                                      top_logprobs=tuple(row.top_logprobs))
            future = row.pending.future
            try:
                future.get_loop().call_soon_threadsafe(_settle, future, result)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass
        batch.finished.clear()

    def _routed_experts(self, row: _Row) -> Optional["RoutedExperts"]:
        """The row's routing when its request asked for it (``.routing``: one more prefill with the
        weights that generated it, before the hand-over)."""
        asked = row.pending.request.sampling.return_routed_experts or getattr(self, "return_routed_experts", False)
        if not asked or row.finish is None:
            return None
        from .routing import capture_routed_experts

        return capture_routed_experts(self.model, (*row.pending.request.prompt_ids, *row.tokens))

    def _new_row(self, item: _Pending) -> _Row:
        sampling = item.request.sampling
        generator = torch.Generator(device=self.device)
        generator.manual_seed(item.seed)
        room = self.max_context_tokens - len(item.request.prompt_ids)
        grammar = None
        if sampling.constraint is not None:
            grammar = self._grammars().start(sampling.constraint)
        return _Row(
            pending=item,
            generator=generator,
            limit=min(sampling.max_new_tokens, room),
            stop_ids=frozenset(sampling.stop_token_ids) | (frozenset() if sampling.ignore_eos else self.eos_token_ids),
            grammar=grammar,
        )

    def _grammars(self) -> "GrammarCompilerCache":
        """The engine's grammar compiler (built on the first constrained request)."""
        cache = getattr(self, "_grammar_cache", None)
        if cache is None:
            from .grammar import GrammarCompilerCache

            cache = self._grammar_cache = GrammarCompilerCache(
                self.tokenizer, int(self.model.config.vocab_size), sorted(self.eos_token_ids))
        return cache

    def _forward(self, input_ids: Tensor, mask: Tensor, positions: Tensor, cache: Any,
                 prefix: Optional["SharedPrefix"] = None) -> Tensor:
        """Logits of each row's last position. ``mask`` is ``[batch, cached + new]`` over what the
        rows' cache holds; with a ``prefix`` that is only the rows' own tokens, and every row also
        attends to the whole prefix (:mod:`.prefix_attention`)."""
        self.stats.forward_calls += 1
        extra: dict[str, Any] = {}
        if prefix is not None:
            from .kv_cache import row_attention_bias

            mask = row_attention_bias(mask, input_ids.shape[1], self.dtype)
            extra["shared_prefix"] = prefix
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
            **extra,
        )
        return out.logits[:, -1, :]

    def _decode(self, batch: "_Decoding") -> None:
        logits = self._prefill(batch)
        while True:
            next_ids = self._sample(batch.rows, logits)
            next_ids = self._drop_finished(batch, next_ids)
            joining = self._take_joiners(batch)
            if joining:
                next_ids += self._join(batch, joining)
            if not batch.rows:
                return
            self.stats.running = len(batch.rows)
            self._hand_over(batch)
            batch.mask = torch.cat([batch.mask, batch.mask.new_ones(len(batch.rows), 1)], dim=1)
            batch.positions = batch.positions + 1
            step_ids = torch.tensor(next_ids, device=self.device).unsqueeze(1)
            logits = self._forward(step_ids, batch.mask, batch.positions, batch.cache, batch.prefix)

    def _prefill(self, batch: "_Decoding") -> Tensor:
        """The rows' prompts into a new cache (their common prefix once); the logits of each
        row's last prompt token."""
        from .kv_cache import GrowingLayer, SharedPrefix, decode_cache

        prompts = [row.pending.request.prompt_ids for row in batch.rows]
        batch.cache = decode_cache(self.model.config)
        batch.joinable = all(isinstance(layer, GrowingLayer) for layer in batch.cache.layers)
        shared = shared_prefix_length(prompts) if len(prompts) > 1 else 0
        if shared < MIN_SHARED_PREFIX:
            shared = 0
        copied = 0
        if shared:  # the common prefix once
            ids = torch.tensor([prompts[0][:shared]], device=self.device)
            ones = torch.ones(1, shared, dtype=torch.long, device=self.device)
            positions = torch.arange(shared, device=self.device).unsqueeze(0)
            if self.prefix_attention:  # kept apart, attended to by every row
                prefix_cache = decode_cache(self.model.config)
                self._forward(ids, ones, positions, prefix_cache)
                batch.prefix = SharedPrefix.from_cache(prefix_cache)
                batch.prefix_ids = tuple(prompts[0][:shared])
            else:  # its cache copied to every row
                self._forward(ids, ones, positions, batch.cache)
                batch.cache.batch_repeat_interleave(len(prompts))
                copied = shared
            self.stats.shared_prefix_tokens += shared * (len(prompts) - 1)
        ids, rest_mask, positions = self._left_padded([prompt[shared:] for prompt in prompts], shared)
        batch.mask = torch.cat([rest_mask.new_ones(len(prompts), copied), rest_mask], dim=1)
        if copied:  # every row's cache already holds its copy of the prefix: one pass
            logits = self._forward(ids, batch.mask, positions, batch.cache, batch.prefix)
        else:
            batch.cache, logits = self._prefill_rows(ids, batch.mask, positions, batch.prefix)
        batch.positions = positions[:, -1:]
        return logits

    def _prefill_rows(self, ids: Tensor, mask: Tensor, positions: Tensor,
                      prefix: Optional["SharedPrefix"]) -> tuple[Any, Tensor]:
        """A new cache holding ``ids``' rows, and each row's last logits, computed in groups of rows
        of at most ``prefill_chunk_tokens`` padded tokens (module docstring) where the cache's layers
        can be put together row by row; in one pass otherwise."""
        from .kv_cache import GrowingLayer, decode_cache

        rows, width = ids.shape
        per_chunk = rows if self.prefill_chunk_tokens <= 0 else max(1, self.prefill_chunk_tokens // width)
        cache = decode_cache(self.model.config)
        if per_chunk >= rows or not all(isinstance(layer, GrowingLayer) for layer in cache.layers):
            return cache, self._forward(ids, mask, positions, cache, prefix)
        logits = []
        for start in range(0, rows, per_chunk):
            part = slice(start, start + per_chunk)
            part_cache = cache if start == 0 else decode_cache(self.model.config)
            logits.append(self._forward(ids[part], mask[part], positions[part], part_cache, prefix))
            if start:
                for layer, added in zip(cache.layers, part_cache.layers):
                    layer.merge_rows(added)
        return cache, torch.cat(logits, dim=0)

    def _left_padded(self, parts: list[Sequence[int]], offset: int) -> tuple[Tensor, Tensor, Tensor]:
        """Token ids, mask and positions of ``parts`` left-padded to one width; positions count
        from ``offset`` at each part's first token."""
        width = max(len(part) for part in parts)
        ids = torch.zeros(len(parts), width, dtype=torch.long, device=self.device)
        mask = torch.zeros(len(parts), width, dtype=torch.long, device=self.device)
        for i, part in enumerate(parts):
            ids[i, width - len(part):] = torch.tensor(part, device=self.device)
            mask[i, width - len(part):] = 1
        return ids, mask, offset + (mask.cumsum(dim=1) - 1).clamp(min=0)

    def _drop_finished(self, batch: "_Decoding", next_ids: list[int]) -> list[int]:
        """Take the rows that finished out of the batch and its cache (their results wait for the
        hand-over at the end of the step); columns that only they used are cut from the left."""
        keep = [i for i, row in enumerate(batch.rows) if row.finish is None]
        batch.finished += [row for row in batch.rows if row.finish is not None]
        if len(keep) == len(batch.rows):
            return next_ids
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        batch.cache.batch_select_indices(index)
        batch.rows = [batch.rows[i] for i in keep]
        batch.mask, batch.positions = batch.mask[index], batch.positions[index]
        if keep and batch.joinable:
            used = batch.mask.any(dim=0)
            lead = int(used.int().argmax()) if not bool(used[0]) else 0
            if lead:
                for layer in batch.cache.layers:
                    layer.drop_leading(lead)
                batch.mask = batch.mask[:, lead:]
        return [next_ids[i] for i in keep]

    def _take_joiners(self, batch: "_Decoding") -> list[_Pending]:
        """Queued requests that join this batch now: while there is room, unless a weight update
        waits for the batch to end or the engine is closing."""
        if not (self.continuous_batching and batch.joinable) or self._updates_waiting or self._abort.is_set():
            return []
        joining: list[_Pending] = []
        kept = len(batch.prefix_ids)  # what the batch and its joiners still share of the prefix
        while len(batch.rows) + len(joining) < self.max_batch_size:
            try:
                item = batch.queue[0]  # the event loop only appends meanwhile
            except IndexError:
                break
            if item.future.done():  # skip callers that gave up while queued
                batch.queue.popleft()
                continue
            shares = min(kept, self._prefix_shared_with(batch, item.request.prompt_ids))
            if self._prefix_move_too_large(batch, shares):
                break  # it starts the next batch
            kept = shares
            joining.append(batch.queue.popleft())
        return joining

    @staticmethod
    def _prefix_shared_with(batch: "_Decoding", prompt: Sequence[int]) -> int:
        """How much of the batch's shared prefix ``prompt`` starts with (0 below ``MIN_SHARED_PREFIX``)."""
        if not batch.prefix_ids:
            return 0
        shares = shared_prefix_length([batch.prefix_ids + (-1,), prompt])
        return shares if shares >= MIN_SHARED_PREFIX else 0

    def _prefix_move_too_large(self, batch: "_Decoding", shares: int) -> bool:
        """Whether cutting the shared prefix back to ``shares`` tokens would put more than
        ``prefill_chunk_tokens`` prefix tokens into the running rows' own caches (module docstring)."""
        moved = len(batch.prefix_ids) - shares
        return self.prefill_chunk_tokens > 0 and moved * len(batch.rows) > self.prefill_chunk_tokens

    def _join(self, batch: "_Decoding", items: list[_Pending]) -> list[int]:
        """Prefill the joining requests (after the batch's shared prefix, cut back to what they
        share with it), sample their first tokens and add the rows still going to the batch;
        returns those rows' first tokens."""
        batch.members.extend(items)
        self.stats.sequences += len(items)
        rows = self._live_rows(batch, items)
        self.stats.join_sizes.append(len(rows))
        if not rows:
            return []
        prompts = [row.pending.request.prompt_ids for row in rows]
        if batch.prefix is not None:
            kept = min(self._prefix_shared_with(batch, prompt) for prompt in prompts)
            if kept < len(batch.prefix_ids):
                self._shorten_prefix(batch, kept)
        offset = len(batch.prefix_ids)
        self.stats.shared_prefix_tokens += offset * len(rows)
        ids, mask, positions = self._left_padded([prompt[offset:] for prompt in prompts], offset)
        cache, logits = self._prefill_rows(ids, mask, positions, batch.prefix)
        first = self._sample(rows, logits)
        keep = [i for i, row in enumerate(rows) if row.finish is None]
        batch.finished += [row for row in rows if row.finish is not None]
        if not keep:
            return []
        if len(keep) < len(rows):
            index = torch.tensor(keep, dtype=torch.long, device=self.device)
            cache.batch_select_indices(index)
            mask, positions = mask[index], positions[index]
        if batch.rows:
            for layer, joined in zip(batch.cache.layers, cache.layers):
                layer.merge_rows(joined)
            batch.mask = _merge_masks(batch.mask, mask)
            batch.positions = torch.cat([batch.positions, positions[:, -1:]], dim=0)
        else:  # every earlier row has finished: the joiners' cache is the batch's
            batch.cache, batch.mask, batch.positions = cache, mask, positions[:, -1:]
        batch.rows += [rows[i] for i in keep]
        return [first[i] for i in keep]

    def _shorten_prefix(self, batch: "_Decoding", keep: int) -> None:
        """Keep only the first ``keep`` tokens of the shared prefix apart (none: 0); the rest is
        put in front of every row's own cache."""
        from .kv_cache import SharedPrefix

        prefix = batch.prefix
        assert prefix is not None
        count = len(batch.rows)
        for layer, keys, values in zip(batch.cache.layers, prefix.keys, prefix.values):
            layer.prepend(keys[:, :, keep:].expand(count, -1, -1, -1), values[:, :, keep:].expand(count, -1, -1, -1))
        batch.mask = torch.cat([batch.mask.new_ones(count, prefix.length - keep), batch.mask], dim=1)
        if keep:
            batch.prefix = SharedPrefix(tuple(k[:, :, :keep].contiguous() for k in prefix.keys),
                                        tuple(v[:, :, :keep].contiguous() for v in prefix.values))
        else:
            batch.prefix = None
        batch.prefix_ids = batch.prefix_ids[:keep]

    def _sample(self, rows: list[_Row], logits: Tensor) -> list[int]:
        """Pick each row's next token, record it with its log-prob, and mark finished rows."""
        temperatures = torch.tensor(
            [row.pending.request.sampling.logprob_temperature for row in rows],
            dtype=torch.float32, device=logits.device,
        )
        logits = logits.float()
        for i, row in enumerate(rows):
            logits[i] = penalize(logits[i], row.tokens, row.pending.request.sampling)
            if row.grammar is not None:  # constrained: only the grammar's tokens (engine docstring)
                logits[i] = row.grammar.mask(logits[i])
        logp = torch.log_softmax(logits / temperatures.unsqueeze(1), dim=-1)
        aborting = self._abort.is_set()
        chosen: list[int] = []
        for row, row_logp in zip(rows, logp):
            sampling = row.pending.request.sampling
            token = choose_token(row_logp, sampling, row.generator)
            chosen.append(token)
            row.tokens.append(token)
            row.logprobs.append(float(row_logp[token]))
            top = top_alternatives(row_logp, sampling.top_logprobs) if sampling.top_logprobs else None
            if top is not None:
                row.top_logprobs.append(top)
            self.stats.generated_tokens += 1
            if row.pending.sink is not None:
                row.pending.sink.send(token, row.logprobs[-1], top)
            if row.grammar is not None and row.grammar.accept(token):
                row.finish = "stop"  # the grammar is complete (it accepted an end token)
            elif token in row.stop_ids:
                row.finish = "stop"
            elif len(row.tokens) >= row.limit:
                row.finish = "length"
            elif aborting or row.pending.future.done():  # engine closed / caller gave up
                row.finish = "abort"
                self.stats.aborted += 1
        return chosen


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """The number of leading tokens every prompt shares, kept below the shortest prompt's length
    (each row needs a token of its own to produce its first logits)."""
    shortest = min(len(p) for p in prompts)
    first = prompts[0]
    length = 0
    while length < shortest - 1 and all(p[length] == first[length] for p in prompts):
        length += 1
    return length


def _empty_result(reason: FinishReason, version: int) -> GenerationResult:
    return GenerationResult((), (), reason, version)
