"""The OpenAI-compatible application: a model (tokenizer, chat template) over a ``RolloutEngine``.

``ModelService`` answers ``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``
(``responses``: the Responses API translated to and from the chat endpoint), ``/v1/models`` and
``/health`` (``handle`` is the HTTP handler). A chat request is rendered with the model's own chat
template (``apply_chat_template(..., tools=...)``), tokenised, and sent to the engine as token ids,
``n`` requests at once (the engine batches them); the generated ids are decoded, cut at the first
``stop`` string, split into reasoning and answer for a thinking model (``reasoning``: the
server's ``reasoning_parser``, SGLang's rules; ``reasoning_start`` decides per request whether the
reply starts inside the reasoning), and, when the request had tools, the answer is parsed for the
model's native tool calls. ``thinking`` (auto | on | off, as ``model.thinking``) is the
``enable_thinking`` every prompt gets, and ``template_kwargs`` further chat-template keywords (an
evaluation passes its model's), unless the request's ``chat_template_kwargs`` set them.

Sampling: ``temperature``, ``top_p``, ``top_k`` (extra field), ``seed`` (choice ``j`` of prompt
``i`` gets ``seed + i * n + j``, so every choice differs and the whole response is reproducible),
``max_tokens`` (clamped to the context left after the prompt; default: all of it, or the
server's ``default_max_tokens``), ``stop`` strings (not included in the text; a stop string that is
one token is also an engine stop id; a reply with longer ones, or with ``stop_regex``, is read from
the engine's stream even when not streamed, so generation stops at the first one), ``stop_regex``
(the reply ends at the end of the first match, ``streaming.StopMatcher``), the penalties and
``min_p`` (``SamplingParams``), ``regex`` / ``ebnf`` grammars (``constraints``), ``stop_token_ids`` and
``ignore_eos`` (extra fields), ``logprobs`` of the sampled tokens and their most likely
alternatives (chat ``top_logprobs``, completions ``logprobs: N``, at most 20; from the engine's
``SamplingParams.top_logprobs``, the sampled token's own distribution).

Streaming (``stream: true``) runs every choice through ``RolloutEngine.generate_stream`` and sends
text as the engine produces tokens (``streaming.ChoiceText``: incremental decoding that never
splits a character, stop strings matched across deltas, which also stops the generation there).
Chat sends the role chunk at once, then ``reasoning_content`` deltas while a thinking model reasons
(``reasoning.ReasoningStream``), content deltas, ``tool_calls`` deltas when the request has
tools (``streaming.ToolCallStream``: a call is sent whole once the text decides its block, by the
rules of the non-streamed parse), each choice's
finish chunk, the usage chunk if ``stream_options.include_usage``, and ``data: [DONE]``. Choices
of one request stream concurrently (their chunks interleave, each with its ``index``). A client
that goes away closes the event iterator, which cancels the choices' tasks and so their engine
streams: generation stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterable, Mapping, Optional, Sequence

from spade.rollout.conversation import thinking_template_kwargs
from spade.rollout.engine import Constraint, GenerationRequest, GenerationResult, RolloutEngine, SamplingParams

from ..agent import reasoning
from . import constraints, protocol, responses
from .http import Request, Response, StreamResponse, json_bytes
from .protocol import APIError, ChatRequest, CompletionRequest, Sampling
from .streaming import ChatChoiceStream, ChoiceText, Delta, TokenLogprob

log = logging.getLogger(__name__)

SEED_MODULUS = 1 << 63


@dataclass(frozen=True)
class Generated:
    """One choice after decoding: its text, why it ended, the ids the engine produced (all of
    them, for usage) and the (token text, log-prob) of each token kept in ``text``, with its
    alternatives ((text, log-prob), most likely first) when top log-probs were asked for."""

    text: str
    finish_reason: str
    completion_tokens: int
    logprobs: tuple[tuple[str, float], ...] = ()
    top_logprobs: tuple[tuple[tuple[str, float], ...], ...] = ()


@dataclass(frozen=True)
class _Prepared:
    prompt_ids: list[int]
    requests: list[GenerationRequest]
    text_stops: bool = False  # the reply can end at text the engine does not see (_run)


class ModelService:
    """One served model. ``eos_token_ids`` end every completion (the engine stops there too)."""

    def __init__(self, engine: RolloutEngine, tokenizer: Any, name: str, *,
                 max_context_tokens: int, eos_token_ids: Iterable[int] = (),
                 vocab_size: Optional[int] = None, default_max_tokens: Optional[int] = None,
                 aliases: Sequence[str] = (), reasoning_parser: str = "auto",
                 thinking: str = "auto", template_kwargs: Optional[Mapping[str, Any]] = None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.name = name
        self.names = (name, *[a for a in aliases if a and a != name])
        self.max_context_tokens = int(max_context_tokens)
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.vocab_size = vocab_size or len(tokenizer)
        self.default_max_tokens = default_max_tokens
        self.created = int(time.time())
        template = getattr(tokenizer, "chat_template", None)
        # ValueError naming the option for an unknown parser, thinking value, or a thinking switch
        # the template lacks
        self.reasoning_parser = reasoning.resolve_parser(reasoning_parser, template)
        hidden = {reasoning.OPEN, reasoning.CLOSE} & set(getattr(tokenizer, "all_special_tokens", ()))
        if self.reasoning_parser != "none" and hidden:
            log.warning("the tokenizer marks %s as special tokens, which decoding drops: the reasoning "
                        "parser %s cannot see them", " and ".join(sorted(hidden)), self.reasoning_parser)
        self.template_defaults = {**thinking_template_kwargs(template, thinking, key="--thinking"),
                                  **(template_kwargs or {})}

    # ------------------------------------------------------------------ HTTP entry

    async def handle(self, request: Request) -> Response | StreamResponse:
        routes = {
            "/health": ("GET", self._health),
            "/v1/models": ("GET", self._models),
            "/v1/chat/completions": ("POST", self._chat),
            "/v1/completions": ("POST", self._completions),
            "/v1/responses": ("POST", self._responses),
        }
        path = request.path.rstrip("/") or "/"
        try:
            if path.startswith("/v1/models/"):
                if request.method != "GET":
                    raise APIError(f"{request.method} is not allowed on {path}", status=405)
                return self._model(path[len("/v1/models/"):])
            if path not in routes:
                raise APIError(f"no route {path}", status=404, kind="not_found_error")
            method, handler = routes[path]
            if request.method != method:
                raise APIError(f"{request.method} is not allowed on {path}; use {method}", status=405)
            if method == "GET":
                return handler()
            try:
                body = request.json()
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise APIError(f"the request body is not valid JSON: {exc}") from None
            return await handler(body)
        except APIError as exc:
            return Response.json(exc.body(), exc.status)

    def _health(self) -> Response:
        return Response.json({"status": "ok", "model": self.name,
                              "weight_version": self.engine.weight_version})

    def _model_card(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "spade",
                "max_model_len": self.max_context_tokens}

    def _models(self) -> Response:
        return Response.json({"object": "list", "data": [self._model_card(self.name)]})

    def _model(self, name: str) -> Response:
        if name not in self.names:
            raise APIError(f"The model `{name}` does not exist.", "model", 404, "not_found_error",
                           "model_not_found")
        return Response.json(self._model_card(name))

    def _check_model(self, model: Optional[str]) -> None:
        if model is not None and model not in self.names:
            raise APIError(f"The model `{model}` does not exist; this server serves "
                           f"{', '.join(self.names)}.", "model", 404, "not_found_error",
                           "model_not_found")

    # ------------------------------------------------------------------ prompts

    def chat_prompt(self, request: ChatRequest) -> str:
        """The chat template's rendering of the request (messages, tools, generation prompt), with
        the server's thinking setting unless the request's ``chat_template_kwargs`` set it."""
        kwargs = {**self.template_defaults, **request.template_kwargs}
        text = self._render(request.messages, request.tools, kwargs)
        if request.tools:
            bare = self._render(request.messages, None, kwargs)
            if bare == text:
                raise APIError("tools were given but this model's chat template does not render "
                               "tools", "tools")
        return text

    def _render(self, messages: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]],
                kwargs: dict[str, Any]) -> str:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise APIError("this model has no chat template; use /v1/completions", "messages")
        try:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=True, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a template's raise_exception, or a type error in it
            raise APIError(f"the chat template rejected the messages: {exc}", "messages") from None

    def reasoning_start(self, request: ChatRequest, prompt: str) -> Optional[bool]:
        """``None`` when the reply is not to be separated (parser ``none``, or the request's
        ``separate_reasoning`` false); otherwise whether it starts inside the reasoning."""
        if self.reasoning_parser == "none" or not request.separate_reasoning:
            return None
        return reasoning.starts_inside(self.reasoning_parser, prompt)

    def chat_constraint(self, request: ChatRequest, inside: Optional[bool]) -> Optional[Constraint]:
        """The grammar ``response_format`` / ``tool_choice`` ask for (``constraints``), or None."""
        constraint = (constraints.response_format_constraint(request.response_format)
                      or constraints.grammar_constraint(request.grammar)
                      or constraints.tool_choice_constraint(request.tool_choice, request.tools,
                                                            request.parallel_tool_calls))
        if constraint is not None and inside:
            field = ("response_format" if request.response_format else
                     request.grammar[0] if request.grammar else "tool_choice")
            raise APIError("a constrained reply cannot start inside the model's reasoning; turn "
                           "thinking off (chat_template_kwargs: {\"enable_thinking\": false})", field)
        return constraint

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:  # same ids as the conversation code (spade.rollout.conversation)
            return backend.encode(text, add_special_tokens=add_special_tokens).ids
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ------------------------------------------------------------------ generation

    def _prepare(self, prompt_ids: list[int], sampling: Sampling, first_index: int, param: str,
                 constraint: Optional[Constraint] = None) -> _Prepared:
        room = self.max_context_tokens - len(prompt_ids)
        if room < 1:
            raise APIError(f"the prompt is {len(prompt_ids)} tokens; this model's context is "
                           f"{self.max_context_tokens} tokens", param)
        wanted = sampling.max_tokens or self.default_max_tokens or room
        stop_ids = set(sampling.stop_token_ids)
        text_stops = bool(sampling.stop_regex)
        for stop in sampling.stop:
            ids = self.encode(stop, add_special_tokens=False)
            if len(ids) == 1:
                stop_ids.add(ids[0])
            else:
                text_stops = True
        requests = []
        for j in range(sampling.n):
            seed = None if sampling.seed is None else (sampling.seed + first_index + j) % SEED_MODULUS
            try:
                params = SamplingParams(
                    temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                    max_new_tokens=min(wanted, room), stop_token_ids=tuple(sorted(stop_ids)),
                    seed=seed, ignore_eos=sampling.ignore_eos,
                    top_logprobs=sampling.top_logprobs if sampling.logprobs else 0,
                    constraint=constraint, min_p=sampling.min_p,
                    frequency_penalty=sampling.frequency_penalty, presence_penalty=sampling.presence_penalty,
                    repetition_penalty=sampling.repetition_penalty)
            except ValueError as exc:
                raise APIError(str(exc)) from None
            requests.append(GenerationRequest(tuple(prompt_ids), params))
        return _Prepared(prompt_ids, requests, text_stops)

    async def _run(self, prepared: _Prepared, sampling: Sampling) -> list[Generated]:
        if prepared.text_stops:  # a stop string of several tokens, a stop_regex: read as a stream,
            # which stops the generation at the first one
            return list(await asyncio.gather(*(self._collect(r, sampling) for r in prepared.requests)))
        results = await asyncio.gather(*(self.engine.generate(r) for r in prepared.requests))
        return [self._finish(result, request.sampling, sampling)
                for result, request in zip(results, prepared.requests)]

    async def _collect(self, request: GenerationRequest, sampling: Sampling) -> Generated:
        """One choice read from the engine's stream (as a streamed response reads it), so that the
        generation stops at the first stop string or ``stop_regex`` match."""
        steps: list[Delta] = []
        generated = 0
        async with contextlib.aclosing(self._choice_steps(request, sampling)) as choice:
            async for step, _, generated in choice:
                steps.append(step)
        kept = [t for step in steps for t in step.logprobs]
        tops = tuple(t.top for t in kept)
        return Generated("".join(step.text for step in steps), steps[-1].finish_reason or "stop", generated,
                         tuple((t.token, t.logprob) for t in kept), tops if any(tops) else ())

    def _finish(self, result: GenerationResult, params: SamplingParams, sampling: Sampling) -> Generated:
        if result.finish_reason == "abort":
            raise APIError("the engine stopped before the completion was done", None, 503,
                           "server_error", "engine_closed")
        ids = list(result.token_ids)
        logprobs = list(result.logprobs)
        tops = list(result.top_logprobs) or [()] * len(ids)
        finish = result.finish_reason
        stops = self.eos_token_ids | set(params.stop_token_ids)
        if finish == "stop" and ids and ids[-1] in stops:
            ids, logprobs = ids[:-1], logprobs[:-1]
        text = self.decode(ids)
        cuts = [text.find(s) for s in sampling.stop if s in text]
        if cuts:
            text, finish = text[:min(cuts)], "stop"
        kept: list[tuple[str, float]] = []
        kept_tops: list[tuple[tuple[str, float], ...]] = []
        if sampling.logprobs:
            length = 0
            for token, logprob, top in zip(ids, logprobs, tops):
                piece = self.decode([token])
                if length + len(piece) > len(text) and cuts:
                    break
                kept.append((piece, logprob))
                kept_tops.append(tuple((self.decode([t]), lp) for t, lp in top))
                length += len(piece)
        return Generated(text, finish, len(result.token_ids), tuple(kept),
                         tuple(kept_tops) if any(kept_tops) else ())

    # ------------------------------------------------------------------ chat

    async def _chat(self, body: Any) -> Response | StreamResponse:
        request = protocol.parse_chat_request(body)
        self._check_model(request.model)
        constraints.check_tool_parameters(request.tools)
        prompt = self.chat_prompt(request)
        inside = self.reasoning_start(request, prompt)
        constraint = self.chat_constraint(request, inside)
        prompt_ids = self.encode(prompt, add_special_tokens=False)
        prepared = self._prepare(prompt_ids, request.sampling, 0, "messages", constraint)
        if request.stream:
            return StreamResponse(self._chat_events(request, prepared, inside))
        choices = await self._run(prepared, request.sampling)
        return Response.json({
            "id": protocol.new_id("chatcmpl"), "object": "chat.completion",
            "created": int(time.time()), "model": self.name, "system_fingerprint": None,
            "choices": [protocol.chat_choice(
                i, c.text, c.finish_reason, parse_tools=request.parse_tools, tools=request.tools,
                logprobs=_chat_logprobs(c, request),
                reasoning=None if inside is None else reasoning.split(c.text, inside=inside))
                for i, c in enumerate(choices)],
            "usage": protocol.usage(len(prompt_ids), sum(c.completion_tokens for c in choices)),
        })

    async def _chat_events(self, request: ChatRequest, prepared: _Prepared,
                           inside: Optional[bool]) -> AsyncIterator[bytes]:
        head = {"id": protocol.new_id("chatcmpl"), "object": "chat.completion.chunk",
                "created": int(time.time()), "model": self.name, "system_fingerprint": None}
        logprobs_on = request.sampling.logprobs

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            body = {**head, "choices": choices, **extra}
            if request.include_usage and "usage" not in extra:
                body["usage"] = None
            return _event(body)

        def delta(index: int, value: dict[str, Any], finish: Optional[str] = None,
                  logprobs: Optional[list[TokenLogprob]] = None) -> dict[str, Any]:
            return {"index": index, "delta": value, "finish_reason": finish,
                    "logprobs": {"content": _chat_logprob_entries(logprobs)} if logprobs_on and logprobs else None}

        n = request.sampling.n
        parts = [ChatChoiceStream(inside=inside, parse_tools=request.parse_tools, tools=request.tools,
                                  new_call_id=_call_id) for _ in range(n)]
        unsent: list[list[TokenLogprob]] = [[] for _ in range(n)]

        def events(i: int, step: Delta, final: bool) -> list[bytes]:
            unsent[i] += step.logprobs
            out: list[tuple[dict[str, Any], Optional[str]]] = []
            found = parts[i].push(step.text, final=final)
            if found.reasoning:
                out.append(({"reasoning_content": found.reasoning}, None))
            if found.content:
                out.append(({"content": found.content}, None))
            if found.calls:
                out.append(({"tool_calls": found.calls}, None))
            finish = protocol.chat_finish_reason(final and parts[i].called, step.finish_reason)
            if final:
                out.append(({}, finish))
            sent = []
            for value, reason in out:
                sent.append(chunk([delta(i, value, reason, unsent[i])]))
                unsent[i] = []
            return sent

        def usage(completion_tokens: int) -> bytes:
            return chunk([], usage=protocol.usage(len(prepared.prompt_ids), completion_tokens))

        for i in range(n):  # every choice's first chunk carries the role, one choice per chunk
            yield chunk([delta(i, {"role": "assistant", "content": ""})])
        async with contextlib.aclosing(self._step_events(
                [prepared], request.sampling, events, usage if request.include_usage else None)) as rest:
            async for event in rest:
                yield event

    async def _responses(self, body: Any) -> Response | StreamResponse:
        """The Responses API, translated to and from this chat endpoint (``responses``)."""
        return await responses.create(body, self._chat, self.name)

    # ------------------------------------------------------------------ completions

    async def _completions(self, body: Any) -> Response | StreamResponse:
        request = protocol.parse_completion_request(body)
        self._check_model(request.model)
        constraint = (constraints.response_format_constraint(request.response_format)
                      or constraints.grammar_constraint(request.grammar))
        n = request.sampling.n
        prepared, prompt_texts = [], []
        for i, prompt in enumerate(request.prompts):
            if isinstance(prompt, str):
                ids = self.encode(prompt, add_special_tokens=True)
                if not ids:
                    raise APIError(f"prompt {i} encodes to no tokens", "prompt")
                prompt_texts.append(prompt)
            else:
                bad = [t for t in prompt if not 0 <= t < self.vocab_size]
                if bad:
                    raise APIError(f"prompt token id {bad[0]} is outside the vocabulary "
                                   f"(0..{self.vocab_size - 1})", "prompt")
                ids = list(prompt)
                prompt_texts.append(self.decode(ids) if request.echo else "")
            prepared.append(self._prepare(ids, request.sampling, i * n, "prompt", constraint))
        prompt_tokens = sum(len(p.prompt_ids) for p in prepared)

        async def run_all() -> list[Generated]:
            per_prompt = await asyncio.gather(*(self._run(p, request.sampling) for p in prepared))
            return [c for choices in per_prompt for c in choices]

        if request.stream:
            return StreamResponse(self._completion_events(request, prepared, prompt_texts, prompt_tokens))
        choices = await run_all()
        return Response.json({
            "id": protocol.new_id("cmpl"), "object": "text_completion",
            "created": int(time.time()), "model": self.name, "system_fingerprint": None,
            "choices": [protocol.completion_choice(
                k, (prompt_texts[k // n] if request.echo else "") + c.text, c.finish_reason,
                _completion_logprobs(c, request.sampling, len(prompt_texts[k // n]) if request.echo else 0))
                for k, c in enumerate(choices)],
            "usage": protocol.usage(prompt_tokens, sum(c.completion_tokens for c in choices)),
        })

    async def _completion_events(self, request: CompletionRequest, prepared: list[_Prepared],
                                 prompt_texts: list[str], prompt_tokens: int) -> AsyncIterator[bytes]:
        head = {"id": protocol.new_id("cmpl"), "object": "text_completion",
                "created": int(time.time()), "model": self.name, "system_fingerprint": None}
        n = request.sampling.n
        echo = [prompt_texts[k // n] if request.echo else "" for k in range(n * len(prepared))]
        offsets = [len(text) for text in echo]

        def chunk(index: int, text: str, finish: Optional[str] = None,
                  logprobs: Optional[list[TokenLogprob]] = None) -> bytes:
            entries = None
            if request.sampling.logprobs and logprobs:  # a chunk without tokens: null, as SGLang sends
                entries, offsets[index] = _completion_logprob_entries(logprobs, offsets[index])
            body = {**head, "choices": [protocol.completion_choice(index, text, finish, entries)]}
            if request.include_usage:
                body["usage"] = None
            return _event(body)

        def events(k: int, step: Delta, final: bool) -> list[bytes]:
            if step.text or step.logprobs or final:
                return [chunk(k, step.text, step.finish_reason if final else None, step.logprobs)]
            return []

        def usage(completion_tokens: int) -> bytes:
            return _event({**head, "choices": [], "usage": protocol.usage(prompt_tokens, completion_tokens)})

        for k, text in enumerate(echo):
            if text:
                yield chunk(k, text)
        async with contextlib.aclosing(self._step_events(
                prepared, request.sampling, events, usage if request.include_usage else None)) as rest:
            async for event in rest:
                yield event

    # ------------------------------------------------------------------ streaming choices

    async def _step_events(self, prepared: Sequence[_Prepared], sampling: Sampling,
                           events: Callable[[int, Delta, bool], list[bytes]],
                           usage: Optional[Callable[[int], bytes]]) -> AsyncIterator[bytes]:
        """The rest of a streamed response: ``events(k, step, final)`` for every step of the
        choices, then ``usage(completion tokens)`` when given, then ``[DONE]``; at an engine error,
        its error event and ``[DONE]`` instead."""
        async with self._streams(prepared, sampling) as steps:
            async for item in steps:
                if isinstance(item, APIError):
                    yield _event(item.body())
                    yield _DONE
                    return
                k, step, final = item
                for event in events(k, step, final):
                    yield event
            if usage is not None:
                yield usage(steps.completion_tokens)
        yield _DONE

    @contextlib.asynccontextmanager
    async def _streams(self, prepared: Sequence[_Prepared], sampling: Sampling) -> AsyncIterator["_Steps"]:
        """Run every choice of ``prepared`` (in order: choice ``k`` is request ``k``) through the
        engine's stream at once; iterate the result for ``(k, Delta, final)`` steps, or an
        ``APIError`` (then stop). Leaving the context cancels what still runs."""
        requests = [r for p in prepared for r in p.requests]
        steps = _Steps(len(requests))
        tasks = [asyncio.ensure_future(self._stream_one(k, r, sampling, steps))
                 for k, r in enumerate(requests)]
        try:
            yield steps
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _stream_one(self, k: int, request: GenerationRequest, sampling: Sampling,
                          steps: "_Steps") -> None:
        try:
            async with contextlib.aclosing(self._choice_steps(request, sampling)) as choice:
                async for step, final, generated in choice:
                    steps.put(k, step, final, generated)
        except asyncio.CancelledError:
            raise
        except APIError as exc:
            steps.fail(exc)
        except Exception as exc:  # noqa: BLE001 - reported to the client in the stream
            log.exception("streaming choice %d failed", k)
            steps.fail(APIError(f"generation failed: {exc}", None, 500, "server_error"))

    async def _choice_steps(self, request: GenerationRequest,
                            sampling: Sampling) -> AsyncIterator[tuple[Delta, bool, int]]:
        """One choice's deltas as the engine streams its tokens: ``(delta, final, tokens generated
        so far)``, the last one final. A stop string or ``stop_regex`` match ends it at once
        (leaving the engine's stream stops the generation). Raises APIError when the engine
        aborts the request or its stream ends without a finish reason."""
        params = request.sampling
        text = ChoiceText(self.decode, end_ids=self.eos_token_ids | frozenset(params.stop_token_ids),
                          stops=sampling.stop, logprobs=sampling.logprobs, stop_regex=sampling.stop_regex)
        async with contextlib.aclosing(self.engine.generate_stream(request)) as stream:
            async for piece in stream:
                step = text.push(piece.token_ids, piece.logprobs, piece.top_logprobs)
                if not text.stopped and piece.last and piece.finish_reason == "abort":
                    raise APIError("the engine stopped before the completion was done",
                                   None, 503, "server_error", "engine_closed")
                if step.text or step.logprobs:
                    yield step, False, text.generated
                if text.stopped or piece.last:
                    yield text.finish("stop" if text.stopped else piece.finish_reason), True, text.generated
                    return
        raise APIError("the engine's stream ended without a finish reason", None, 500, "server_error")


_DONE = b"data: [DONE]\n\n"


class _Steps:
    """The choices' steps in the order they happen: ``put`` / ``fail`` from the choices' tasks,
    ``async for`` in the event generator (ends when every choice is final, or at an error)."""

    def __init__(self, choices: int) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()
        self._open = choices
        self._generated = [0] * choices

    @property
    def completion_tokens(self) -> int:
        return sum(self._generated)

    def put(self, k: int, step: Delta, final: bool, generated: int) -> None:
        self._generated[k] = generated
        self._queue.put_nowait((k, step, final))

    def fail(self, error: APIError) -> None:
        self._queue.put_nowait(error)

    def __aiter__(self) -> "_Steps":
        return self

    async def __anext__(self) -> Any:
        if self._open == 0:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, APIError):
            self._open = 0
        elif item[2]:
            self._open -= 1
        return item


def _call_id() -> str:
    return protocol.new_id("call").replace("-", "_")


def _chat_logprob_entry(token: str, logprob: float,
                        top: Sequence[tuple[str, float]]) -> dict[str, Any]:
    """One ``logprobs.content[i]`` of a chat choice (OpenAI's shape; ``top_logprobs`` most likely
    first, empty unless asked for)."""
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}
                             for t, lp in top]}


def _completion_top(token: str, logprob: float, top: Sequence[tuple[str, float]]) -> dict[str, float]:
    """A legacy completion's ``top_logprobs[i]``: the N most likely tokens and the sampled one
    (vLLM's shape; tokens with the same text share one key)."""
    entry = {t: lp for t, lp in top}
    entry.setdefault(token, logprob)
    return entry


def _chat_logprob_entries(tokens: list[TokenLogprob]) -> list[dict[str, Any]]:
    return [_chat_logprob_entry(t.token, t.logprob, t.top) for t in tokens]


def _completion_logprob_entries(tokens: list[TokenLogprob], start: int) -> tuple[dict[str, Any], int]:
    offsets, position = [], start
    for t in tokens:
        offsets.append(position)
        position += len(t.token)
    return {"tokens": [t.token for t in tokens], "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [_completion_top(t.token, t.logprob, t.top) for t in tokens],
            "text_offset": offsets}, position


def _event(value: Any) -> bytes:
    return b"data: " + json_bytes(value) + b"\n\n"


def _chat_logprobs(choice: Generated, request: ChatRequest) -> Optional[list[dict[str, Any]]]:
    if not request.sampling.logprobs:
        return None
    tops = choice.top_logprobs or [()] * len(choice.logprobs)
    return [_chat_logprob_entry(token, logprob, top)
            for (token, logprob), top in zip(choice.logprobs, tops)]


def _completion_logprobs(choice: Generated, sampling: Sampling, start: int) -> Optional[dict[str, Any]]:
    if not sampling.logprobs:
        return None
    offsets, position = [], start
    for token, _ in choice.logprobs:
        offsets.append(position)
        position += len(token)
    return {"tokens": [t for t, _ in choice.logprobs],
            "token_logprobs": [lp for _, lp in choice.logprobs],
            "top_logprobs": [_completion_top(t, lp, top) for (t, lp), top in zip(
                choice.logprobs, choice.top_logprobs or [()] * len(choice.logprobs))],
            "text_offset": offsets}
