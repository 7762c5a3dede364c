"""The rollout-engine interface: token ids in; token ids, log-probs and a finish reason out.

Everything above the engine (episode runner, designer calls, weight-sync bridge) talks to a
``RolloutEngine`` and nothing else, so the in-process transformers engine (``hf``) and the SGLang
servers (``sglang``) are interchangeable (ARCHITECTURE principle 2).

Which distribution the log-probs come from
------------------------------------------
``GenerationResult.logprobs[i]`` is ``log_softmax(logits / T)[token_ids[i]]`` where ``logits`` are
the model's full-vocabulary logits at that position under the weights of ``weight_version`` and
``T`` is ``SamplingParams.temperature``. The log-softmax is taken over the whole vocabulary, *before*
top-k / top-p truncation, so a sampled token's log-prob does not depend on the truncation
settings. With ``temperature == 0`` (greedy) the log-probs are taken at ``T = 1``
(``SamplingParams.logprob_temperature``).

This is what SGLang returns by default, read in the source of the pinned release (``sglang==0.5.23``,
``srt/layers/sampler.py``, ``Sampler.forward``): on the standard sampling path it divides the
logits by the request temperatures in place, takes ``softmax`` into ``probs``, samples with the
top-k / top-p / min-p filters applied to *copies* (``_sample_from_probs``: flashinfer's
``top_k_top_p_sampling_from_probs`` / ``top_k_renorm_prob`` / ``top_p_renorm_prob`` return new
tensors; the torch fallback ``top_k_top_p_min_p_sampling_from_probs_torch`` filters a sorted copy),
and returns ``log(probs)``: tempered, untruncated. A greedy batch (``is_all_greedy``; SGLang maps a
temperature below 1e-6 to ``top_k = 1, T = 1``) returns ``log_softmax(logits)``. With the
environment variable ``SGLANG_RETURN_ORIGINAL_LOGPROB`` set ("1"/"true") it would return
``log_softmax(logits)`` at ``T = 1`` instead; spade's launcher sets it to "0" for every server and
``engine.sglang.server_env`` refuses it (``spade.rollout.sglang.settings``). (An older SGLang,
``sampler.py`` at commit 584f55d, returned the log of the top-p-renormalised probabilities: not
this contract, one more reason the release is pinned.) The hf
engine computes the same quantity directly (``hf/scheduler.py``: ``log_softmax(logits / T)`` over the
whole vocabulary, before its own truncation).

The trainer takes its log-probs of a sample (old, new and reference) at the same ``T``: each
trajectory carries ``logprob_temperature`` (``spade.rl.samples``), the train sample its
``temperature``, and ``spade.rl.logprobs.token_logprobs(hidden, weight, targets, temperature=T)``
(``T`` per sequence or per token) computes ``log_softmax(logits / T)``, which makes the
truncated-importance-sampling ratio ``exp(logp_train - logp_rollout)`` compare like with like.
There is no separate trainer temperature that could disagree with the sampler.

Tokens are *sampled* from that same tempered distribution after top-k then top-p truncation and
renormalisation (the order SGLang uses).

Top log-probs
-------------
``SamplingParams.top_logprobs = k`` asks for each generated token's ``k`` most likely tokens with
their log-probs, from the same ``log_softmax(logits / T)`` the sampled token's log-prob comes from
(SGLang: ``top_logprobs_num``, returned as ``meta_info.output_top_logprobs``). Ties are broken by
the smaller token id, so the hf engine's alternatives are deterministic.

Constraints
-----------
``SamplingParams.constraint`` restricts a completion to a grammar (JSON, a JSON schema, an EBNF
grammar, a structural tag): at each step only tokens the grammar accepts can be sampled, and the
completion ends when the grammar is complete. As in SGLang (its grammar backends fill a vocabulary
mask that ``Sampler`` applies to the logits before the softmax), the mask is applied to the logits,
so a constrained completion's log-probs and top log-probs are those of the masked distribution.
Serving uses it (``spade serve``: ``response_format``, ``tool_choice``); rollouts never do.

Statistics
----------
``generation_stats`` reports an engine's running totals as a ``GenerationStats``: tokens generated,
the wall time spent generating (no waits for callers or sandboxes: the clock to set beside a
serving benchmark) and, for an engine over servers, the requests re-sent after a failure. A step's
figures are the differences of two readings (``spade.run.step_metrics``).

Streaming
---------
``generate_stream`` yields the same completion as ``generate`` in pieces (``GenerationChunk``) as
the engine produces them: the concatenated ``token_ids`` / ``logprobs`` of all chunks equal the
``GenerationResult``'s, and only the last chunk carries ``finish_reason`` and ``weight_version``.
Closing the iterator early (``aclose()``, or cancelling the task that iterates) stops the
request's generation. The base class yields the whole completion as one chunk, so an engine that
cannot stream still satisfies the interface.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterable, Literal, Optional

from torch import Tensor

from ..rl.routing_record import RoutedExperts

FinishReason = Literal["stop", "length", "abort"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort")
MAX_TOP_LOGPROBS = 20  # OpenAI's top_logprobs bound; vLLM's default max_logprobs

TopLogprobs = tuple[tuple[int, float], ...]  # one token's alternatives: (token id, log-prob)
CONSTRAINT_KINDS = ("json_schema", "regex", "ebnf", "structural_tag")  # SGLang's sampling_params fields


@dataclass(frozen=True)
class Constraint:
    """A grammar the completion must follow (constrained decoding; module docstring, "Constraints").

    ``kind`` is one of ``CONSTRAINT_KINDS``: ``json_schema`` (``spec``: the schema as a JSON
    string), ``regex`` (``spec``: a regular expression the whole completion matches), ``ebnf`` (``spec``: an EBNF grammar, root rule ``root``) or ``structural_tag``
    (``spec``: xgrammar's structural-tag JSON): the fields SGLang takes in ``sampling_params``."""

    kind: str
    spec: str

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise ValueError(f"constraint kind must be one of {CONSTRAINT_KINDS}, got {self.kind!r}")
        if not self.spec:
            raise ValueError(f"a {self.kind} constraint needs its spec")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    ``temperature == 0`` means greedy. ``top_p == 1`` and ``top_k is None`` switch truncation off.
    ``stop_token_ids`` end the completion (the stop token is included in the output); engines also
    stop at the model's own end-of-sequence ids. ``seed`` makes the completion reproducible: the
    same seed, prompt and weights give the same tokens whatever else is in the batch (up to
    floating-point ties). ``None`` draws a fresh seed. ``ignore_eos`` keeps generating past the
    model's end-of-sequence ids (``stop_token_ids`` still stop): fixed-length throughput benchmarks.
    ``return_routed_experts`` (MoE models): the result also carries every MoE layer's top-k experts
    for each token the model ran on (``GenerationResult.routed_experts``), for routing replay.
    ``top_logprobs`` (0..``MAX_TOP_LOGPROBS``): the result also carries, for each generated token,
    the ``top_logprobs`` most likely tokens of the same distribution the log-probs come from
    (module docstring), as ``(token id, log-prob)`` pairs sorted by log-prob descending, ties by
    token id ascending. Rollouts leave it at 0 (no cost). ``constraint`` (serving only): a grammar
    the completion must follow (``Constraint``); None for free text.

    Penalties and ``min_p`` (serving only; SGLang 0.5.23's definitions, ``srt/sampling/penaltylib``
    and ``srt/layers/sampler.py``): with ``c[t]`` the number of times token ``t`` was generated so
    far in this completion (the prompt does not count), the logits become
    ``l[t] - frequency_penalty * c[t] - presence_penalty * (c[t] > 0)`` (OpenAI's formula), then,
    for ``c[t] > 0``, ``l[t] / repetition_penalty`` where ``l[t] > 0`` and
    ``l[t] * repetition_penalty`` elsewhere; the temperature divides them after that, and the
    log-probs are those of the penalised distribution (SGLang applies penalties to the logits
    before its sampler). ``min_p`` keeps, after top-k and top-p, the candidates whose probability
    is at least ``min_p`` times the most likely one's (a truncation like top-p: log-probs are not
    affected; ``min_p = 1`` keeps only the most likely token).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: Optional[int] = None
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    seed: Optional[int] = None
    ignore_eos: bool = False
    return_routed_experts: bool = False
    top_logprobs: int = 0
    constraint: Optional["Constraint"] = None
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None (off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0 < self.repetition_penalty <= 2:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")

    @property
    def penalised(self) -> bool:
        """Whether any penalty changes the logits."""
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        """The ``T`` of ``log_softmax(logits / T)`` for the returned log-probs."""
        return 1.0 if self.greedy else float(self.temperature)


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt (token ids) to complete. Requests with the same ``affinity`` key (e.g. the turns
    of one episode) go to the same server while it is healthy, so a multi-server engine finds
    their shared prefix in that server's cache; engines with one model instance ignore it."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    affinity: Optional[str] = None

    def __post_init__(self) -> None:
        # map(int) runs at C speed: a long episode sends its whole, growing prompt every turn.
        object.__setattr__(self, "prompt_ids", tuple(map(int, self.prompt_ids)))
        if not self.prompt_ids:
            raise ValueError("prompt_ids must not be empty")


def _normalise_tokens(record: "GenerationResult | GenerationChunk") -> None:
    """A frozen record's ``token_ids`` and ``logprobs`` as tuples of int and float, one log-prob per
    id; ``top_logprobs`` empty or one tuple of (id, log-prob) pairs per id."""
    object.__setattr__(record, "token_ids", tuple(int(t) for t in record.token_ids))
    object.__setattr__(record, "logprobs", tuple(float(x) for x in record.logprobs))
    if len(record.token_ids) != len(record.logprobs):
        raise ValueError(f"{len(record.token_ids)} token ids but {len(record.logprobs)} log-probs")
    if record.top_logprobs:
        object.__setattr__(record, "top_logprobs", tuple(
            tuple((int(t), float(x)) for t, x in alternatives) for alternatives in record.top_logprobs))
        if len(record.top_logprobs) != len(record.token_ids):
            raise ValueError(f"{len(record.token_ids)} token ids but top log-probs for "
                             f"{len(record.top_logprobs)}")
    else:
        object.__setattr__(record, "top_logprobs", ())


def _check_finish_reason(reason: str) -> None:
    if reason not in FINISH_REASONS:
        raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {reason!r}")


@dataclass(frozen=True)
class GenerationResult:
    """The completion: generated ids (stop token included), one log-prob per id, why it ended
    ("stop": a stop/EOS token, "length": max_new_tokens or the context limit, "abort": the engine
    was closed), and the weight version that produced every token of it. ``routed_experts``
    (asked for with ``SamplingParams.return_routed_experts``): the routing of every token of
    prompt + completion but the last, ``spade.rl.routing_record``'s alignment. ``top_logprobs``
    (asked for with ``SamplingParams.top_logprobs``): each token's alternatives; empty otherwise."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    weight_version: int
    routed_experts: Optional[RoutedExperts] = None
    top_logprobs: tuple[TopLogprobs, ...] = ()

    def __post_init__(self) -> None:
        _normalise_tokens(self)
        _check_finish_reason(self.finish_reason)


@dataclass(frozen=True)
class GenerationChunk:
    """A piece of a streamed completion: the ids generated since the previous chunk (possibly
    none) with one log-prob each. The last chunk of a stream, and only it, has ``finish_reason``
    and ``weight_version`` set (the same values ``GenerationResult`` would carry);
    ``top_logprobs`` as in ``GenerationResult``, for this chunk's ids."""

    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    finish_reason: Optional[FinishReason] = None
    weight_version: Optional[int] = None
    top_logprobs: tuple[TopLogprobs, ...] = ()

    def __post_init__(self) -> None:
        _normalise_tokens(self)
        if self.finish_reason is not None:
            _check_finish_reason(self.finish_reason)
        if (self.finish_reason is None) != (self.weight_version is None):
            raise ValueError("finish_reason and weight_version come together, on the last chunk only")

    @property
    def last(self) -> bool:
        return self.finish_reason is not None

    @classmethod
    def of_result(cls, result: GenerationResult) -> "GenerationChunk":
        """The whole completion as one (last) chunk."""
        return cls(result.token_ids, result.logprobs, result.finish_reason, result.weight_version,
                   result.top_logprobs)


def join_chunks(chunks: Iterable[GenerationChunk]) -> GenerationResult:
    """The ``GenerationResult`` a complete stream of chunks adds up to."""
    ids: list[int] = []
    logprobs: list[float] = []
    top: list[TopLogprobs] = []
    last: Optional[GenerationChunk] = None
    for chunk in chunks:
        if last is not None:
            raise ValueError("a chunk came after the last chunk of the stream")
        ids.extend(chunk.token_ids)
        logprobs.extend(chunk.logprobs)
        top.extend(chunk.top_logprobs or [()] * len(chunk.token_ids))
        if chunk.last:
            last = chunk
    if last is None:
        raise ValueError("the stream ended without a last chunk (finish_reason)")
    return GenerationResult(tuple(ids), tuple(logprobs), last.finish_reason, last.weight_version,
                            top_logprobs=tuple(top) if any(top) else ())


@dataclass(frozen=True)
class GenerationStats:
    """An engine's running totals since it started: ``generated_tokens``, ``busy_s`` (wall time
    during which it was generating) and ``retries`` (requests re-sent after a server failure; None
    for an engine without servers to fail)."""

    generated_tokens: int = 0
    busy_s: float = 0.0
    retries: Optional[int] = None


class EngineClosed(RuntimeError):
    """``generate`` or ``update_weights`` was called after ``close()``."""


class RolloutEngine(abc.ABC):
    """Async generation service. Concurrent ``generate`` calls are batched by the engine."""

    @property
    @abc.abstractmethod
    def weight_version(self) -> int:
        """The version of the weights new requests are served with (0 before any update)."""

    @abc.abstractmethod
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Complete one prompt. Each result is produced entirely by one weight version."""

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Complete one prompt, yielding tokens as they are generated (module docstring,
        "Streaming"). This default waits for ``generate`` and yields its result as one chunk."""
        yield GenerationChunk.of_result(await self.generate(request))

    @abc.abstractmethod
    async def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Load HF checkpoint-named tensors (any subset of the model) and set ``weight_version``.

        Takes effect between batches: in-flight completions finish on the old weights.
        """

    def generation_stats(self) -> Optional[GenerationStats]:
        """The engine's running totals (module docstring, "Statistics"); None from an engine that
        keeps none (a scripted test double). Both built-in engines keep them."""
        return None

    async def release_memory(self) -> None:
        """Free accelerator memory (KV cache, weights) while the trainer runs; no-op by default."""

    async def resume_memory(self) -> None:
        """Undo ``release_memory``; no-op by default."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop serving: queued and in-flight requests finish with ``finish_reason="abort"``
        (keeping what was generated); later calls raise ``EngineClosed``. Idempotent."""
