"""Who writes the designer's texts: our rollout engine, or an external OpenAI-compatible endpoint.

The designer round makes three kinds of text calls (the designer's environment, the hint, the
tool-use model screen). Each goes through a :class:`TextGenerator`: chat messages and a
:class:`TextSampling` in, a :class:`GeneratedText` out, or :class:`GenerationFailed` with the
rejection kind the designer round records (``prompt_too_long``, ``timeout``, ``no_output``).

* :class:`LocalGenerator` renders the messages into a token-exact :class:`Conversation`, asks our
  engine, and returns the call's :class:`~spade.rl.samples.Trajectory` too, so a designer sample
  can be trained on (SPADE).
* :class:`ExternalGenerator` sends the messages to ``selfplay.designer_endpoint`` with the
  ``openai`` client (the "Fixed ED" ablation): no token ids, no trajectory, nothing trainable.
  Transient failures (timeouts, connection errors, 429, 5xx) are retried with exponential
  backoff; after the last retry the call fails with :class:`GenerationFailed`. A prompt the
  endpoint says is over its context (400, ``context_length_exceeded``) fails that call alone
  (``prompt_too_long``, as on our engine). A refusal that no retry can fix (any other 4xx: bad
  key, unknown model, a refused parameter) raises :class:`EndpointError`, which stops the run.

:func:`check_endpoint` is the preflight of ``spade train``: the endpoint answers ``GET
{url}/models`` with the configured key, before anything is written.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

from ...config import ConfigError
from ...envs.protocol import ErrorKind
from ...rollout.conversation import BudgetExceeded, ChatFormat, Conversation
from ...rollout.engine import GenerationRequest, RolloutEngine, SamplingParams
from ...rl.samples import Trajectory
from .endpoint import EndpointSettings
from ..trajectories import trajectory_of

if TYPE_CHECKING:
    from ..settings import RoleSampling, SelfPlaySettings

log = logging.getLogger(__name__)
Messages = Sequence[Mapping[str, str]]
PREFLIGHT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TextSampling:
    """How to sample one text call. ``top_k`` None is off; ``seed`` None draws a fresh one;
    ``timeout_s`` bounds the call (the external generator: each request of it)."""

    temperature: float
    top_p: float
    top_k: int | None
    max_tokens: int
    timeout_s: float
    seed: int | None = None

    @classmethod
    def of(cls, role: RoleSampling, seed: int | None) -> TextSampling:
        """A text call sampled as ``role`` (a record of ``selfplay.sampling``, spade.selfplay.sampling_settings)."""
        if role.timeout_s is None:
            raise ValueError("a text call needs a timeout")
        return cls(role.temperature, role.top_p, role.top_k, role.max_tokens, role.timeout_s, seed)


@dataclass(frozen=True)
class GeneratedText:
    """A completion's text (end-of-turn tokens left out), why it ended (the engine's or the
    endpoint's finish reason) and, from the local engine only, the call as a trajectory."""

    text: str
    finish_reason: str
    trajectory: Trajectory | None = None


class GenerationFailed(Exception):
    """The call produced nothing usable; ``kind`` is the rejection kind of a designer attempt."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class EndpointError(ConfigError):
    """The endpoint refused a request in a way retrying cannot fix (auth, model, parameters)."""


class TextGenerator(Protocol):
    async def generate(self, messages: Messages, sampling: TextSampling) -> GeneratedText:
        """One completion of ``messages``; raises :class:`GenerationFailed` when there is none."""
        ...


class LocalGenerator:
    """Our rollout engine, token-exact: the prompt is the chat template's rendering of the
    messages (capped by ``max_context_tokens``), the completion is kept as sampled."""

    def __init__(self, engine: RolloutEngine, tokenizer: Any, chat_format: ChatFormat, *,
                 max_context_tokens: int, stop_token_ids: tuple[int, ...] = ()):
        self.engine = engine
        self.tokenizer = tokenizer
        self.chat_format = chat_format
        self.max_context_tokens = max_context_tokens
        self.stop_token_ids = tuple(stop_token_ids)

    async def generate(self, messages: Messages, sampling: TextSampling) -> GeneratedText:
        try:
            conversation = Conversation(self.tokenizer, [dict(m) for m in messages],
                                        max_context_tokens=self.max_context_tokens, chat_format=self.chat_format)
        except BudgetExceeded as exc:
            raise GenerationFailed(ErrorKind.PROMPT_TOO_LONG, str(exc)) from None
        params = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                                max_new_tokens=max(1, conversation.max_new_tokens(sampling.max_tokens)),
                                stop_token_ids=self.stop_token_ids, seed=sampling.seed)
        try:
            generated = await asyncio.wait_for(
                self.engine.generate(GenerationRequest(tuple(conversation.token_ids), params)), sampling.timeout_s)
        except asyncio.TimeoutError:
            raise GenerationFailed(ErrorKind.TIMEOUT, f"generation took over {sampling.timeout_s:g} s") from None
        if not generated.token_ids:
            raise GenerationFailed(ErrorKind.NO_OUTPUT, f"the engine returned nothing ({generated.finish_reason})")
        text = conversation.append_generated(generated.token_ids, generated.logprobs, generated.finish_reason,
                                             generated.weight_version, routed_experts=generated.routed_experts)
        return GeneratedText(text, generated.finish_reason,
                             trajectory_of(conversation, logprob_temperature=params.logprob_temperature))


class ExternalGenerator:
    """``chat.completions`` of an OpenAI-compatible endpoint (see :mod:`.endpoint` for the
    settings). The API key is read when the generator is made: a missing variable fails here.

    ``requests`` and ``retries`` count what was sent (for metrics and tests). One client per
    event loop: the ``openai`` client's connection pool belongs to the loop it was used on.
    """

    def __init__(self, endpoint: EndpointSettings):
        import openai  # noqa: F401  (fail here, not at the first call, if the client is missing)

        self.endpoint = endpoint
        self._api_key = endpoint.api_key()
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self.requests = 0
        self.retries = 0

    def _client_for_loop(self) -> Any:
        import openai

        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = openai.AsyncOpenAI(base_url=self.endpoint.url, api_key=self._api_key, max_retries=0)
            self._loop = loop
            if self.endpoint.max_concurrent is not None:
                self._slots = asyncio.Semaphore(self.endpoint.max_concurrent)
        return self._client

    def request_body(self, messages: Messages, sampling: TextSampling) -> dict[str, Any]:
        """The ``chat.completions.create`` arguments of one call (timeout aside)."""
        e = self.endpoint
        body: dict[str, Any] = {
            "model": e.model,
            "messages": [dict(m) for m in messages],
            "temperature": sampling.temperature if e.temperature is None else e.temperature,
            "top_p": sampling.top_p if e.top_p is None else e.top_p,
            e.max_tokens_key: sampling.max_tokens,
        }
        if e.send_seed and sampling.seed is not None:
            body["seed"] = sampling.seed
        extra = dict(e.extra_body or {})
        if e.top_k is not None:
            extra["top_k"] = e.top_k
        if extra:
            body["extra_body"] = extra
        return body

    async def generate(self, messages: Messages, sampling: TextSampling) -> GeneratedText:
        import openai

        e = self.endpoint
        timeout = e.timeout_s if e.timeout_s is not None else sampling.timeout_s
        body = self.request_body(messages, sampling)
        client = self._client_for_loop()
        kind, reason = ErrorKind.NO_OUTPUT, ""
        for attempt in range(e.max_retries + 1):
            if attempt:
                self.retries += 1
                await asyncio.sleep(min(e.backoff_s * 2 ** (attempt - 1), e.max_backoff_s))
            try:
                completion = await self._send(client, body, timeout)
            except (asyncio.TimeoutError, openai.APITimeoutError):
                kind, reason = ErrorKind.TIMEOUT, f"no answer within {timeout:g} s"
            except openai.APIConnectionError as exc:
                kind, reason = ErrorKind.NO_OUTPUT, f"cannot connect ({exc})"
            except openai.APIStatusError as exc:
                if _context_overflow(exc):
                    raise GenerationFailed(ErrorKind.PROMPT_TOO_LONG, f"{e.url} (model {e.model}): HTTP "
                                           f"{exc.status_code}: {_error_text(exc)}") from None
                if exc.status_code != 429 and exc.status_code < 500:
                    raise EndpointError(f"selfplay.designer_endpoint: {e.url} refused a request for model "
                                        f"{e.model!r} with HTTP {exc.status_code}: {_error_text(exc)} (not retried: "
                                        "check url, model, api_key_env and the sampling fields)") from None
                kind, reason = ErrorKind.NO_OUTPUT, f"HTTP {exc.status_code}: {_error_text(exc)}"
            else:
                return _completion_text(completion)
            log.warning("designer endpoint %s (model %s), try %d of %d: %s", e.url, e.model, attempt + 1,
                        e.max_retries + 1, reason)
        raise GenerationFailed(kind, f"{e.url} (model {e.model}): {reason}, after {e.max_retries + 1} tries")


    async def _send(self, client: Any, body: dict[str, Any], timeout: float) -> Any:
        if self._slots is None:
            self.requests += 1
            return await asyncio.wait_for(client.chat.completions.create(**body, timeout=timeout), timeout)
        async with self._slots:  # the timeout starts once the request is sent, not while it queues
            self.requests += 1
            return await asyncio.wait_for(client.chat.completions.create(**body, timeout=timeout), timeout)


def _completion_text(completion: Any) -> GeneratedText:
    choices = getattr(completion, "choices", None) or []
    if not choices:
        raise GenerationFailed(ErrorKind.NO_OUTPUT, "the endpoint returned no choice")
    choice = choices[0]
    finish = str(choice.finish_reason or "stop")
    text = (choice.message.content if choice.message is not None else None) or ""
    if not text:
        raise GenerationFailed(ErrorKind.NO_OUTPUT, f"the endpoint returned nothing ({finish})")
    return GeneratedText(text, finish)


def _context_overflow(exc: Any) -> bool:
    """A 400 that says the prompt (plus the token budget) exceeds the model's context: OpenAI's
    ``context_length_exceeded`` code, or the wording vLLM / SGLang servers use."""
    if exc.status_code != 400:
        return False
    body = getattr(exc, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(inner, dict) and inner.get("code") == "context_length_exceeded":
        return True
    text = _error_text(exc).lower()
    return any(words in text for words in ("maximum context length", "context length is", "context window"))


def _error_text(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        if message:
            return str(message)[:500]
    return str(getattr(exc, "message", exc))[:500]


def text_generator(settings: "SelfPlaySettings", *, engine: RolloutEngine, tokenizer: Any, chat_format: ChatFormat,
                   stop_token_ids: tuple[int, ...] = ()) -> TextGenerator:
    """The designer's generator for ``settings``: the endpoint when one is configured, else our engine."""
    if settings.designer_endpoint is not None:
        return ExternalGenerator(settings.designer_endpoint)
    return LocalGenerator(engine, tokenizer, chat_format, max_context_tokens=settings.max_context_tokens,
                          stop_token_ids=stop_token_ids)


def check_endpoint(endpoint: EndpointSettings) -> None:
    """Preflight: ``GET {url}/models`` answers with the configured key; else a :class:`ConfigError`
    naming the key to fix. A model the list does not name is only warned about (aliases exist)."""
    import openai

    client = openai.OpenAI(base_url=endpoint.url, api_key=endpoint.api_key(),
                           timeout=min(endpoint.timeout_s or PREFLIGHT_TIMEOUT_S, PREFLIGHT_TIMEOUT_S), max_retries=1)
    where = "selfplay.designer_endpoint"
    try:
        models = [model.id for model in client.models.list()]
    except openai.APIConnectionError as exc:
        raise ConfigError(f"{where}.url: {endpoint.url} is not reachable (GET {endpoint.url.rstrip('/')}/models: "
                          f"{exc})") from None
    except openai.APIStatusError as exc:
        hint = {401: "the key is wrong (api_key_env)", 403: "the key may not list models (api_key_env)",
                404: "is url the base URL, usually ending in /v1?"}.get(exc.status_code, "")
        raise ConfigError(f"{where}.url: GET {endpoint.url.rstrip('/')}/models answered HTTP {exc.status_code}: "
                          f"{_error_text(exc)}" + (f" ({hint})" if hint else "")) from None
    finally:
        client.close()
    if models and endpoint.model not in models:
        log.warning("%s.model: %r is not among the models %s lists (%s)", where, endpoint.model, endpoint.url,
                    ", ".join(models[:10]) + (" ..." if len(models) > 10 else ""))


def check_designer_endpoint(settings: "SelfPlaySettings") -> None:
    """:func:`check_endpoint` for ``selfplay.designer_endpoint`` when it is set."""
    if settings.designer_endpoint is not None:
        check_endpoint(settings.designer_endpoint)
