"""An external OpenAI-compatible endpoint for the designer's text roles (the paper's "Fixed ED").

``selfplay.designer_endpoint`` moves the designer call, the hint call and the tool-use model
screen from our rollout engine to a frontier model behind an OpenAI-compatible chat-completions
API (OpenAI, vLLM, SGLang, ``spade serve``, a proxy); the agent stays on our engine. The designer
prompts keep their corpus document and memory block. Such a designer is fixed: it makes no
trainable samples, so ``selfplay.train_designer`` must be false with an endpoint set.

Requests are sent by :class:`~spade.selfplay.sources.text_generators.ExternalGenerator`; this module is
only the typed settings (no network, no ``openai`` import), loaded like every config section.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from ...config import ConfigError, require

MaxTokensKey = Literal["max_tokens", "max_completion_tokens"]
MAX_TOKENS_KEYS: tuple[str, ...] = ("max_tokens", "max_completion_tokens")

_WHERE = "selfplay.designer_endpoint"


@dataclass(frozen=True)
class EndpointSettings:
    """Where the fixed designer is served and how requests to it are sent.

    ``url`` is the base URL as the ``openai`` client takes it (for most servers it ends in ``/v1``:
    ``https://api.openai.com/v1``, ``http://host:30000/v1``); ``spade train`` checks it answers
    ``GET {url}/models`` before writing the run directory. The API key is read from the
    environment variable ``api_key_env`` when the generator is made (never stored in the config);
    ``api_key_env: null`` for a server that needs none.

    ``timeout_s`` bounds each request (None: the role's own ``selfplay.sampling.designer.timeout_s``,
    ``.hint.timeout_s`` or ``.screen.timeout_s``). A request that times out, cannot connect, or is answered 429 or
    5xx is retried up to ``max_retries`` times, waiting ``backoff_s * 2**i`` seconds (at most
    ``max_backoff_s``) before retry ``i``; after that the attempt counts as a failed designer
    attempt (kind ``timeout`` or ``no_output``), or an empty hint. A 400 saying the prompt is over
    the model's context rejects that attempt (``prompt_too_long``). Any other 4xx (bad key, unknown
    model, a parameter the server refuses) stops the run with the URL, the model and the status.
    ``max_concurrent`` caps the requests in flight at once (None: one per slot of the set, as many
    as the designer round makes).

    Sampling: each role sends the temperature, ``top_p`` and token budget of its
    ``selfplay.sampling`` record (``designer``, ``hint``, ``screen``); ``temperature`` and ``top_p`` here override
    them for every call (reasoning models often accept only 1.0). ``top_k`` is not part of
    OpenAI's API: it is sent (in the request body) only when set here. ``max_tokens_key`` names
    the budget field (OpenAI's reasoning models want ``max_completion_tokens``); ``send_seed``
    sends each call's derived seed; ``extra_body`` is merged into every request body as given
    (e.g. ``{chat_template_kwargs: {enable_thinking: false}}`` for a vLLM/SGLang server).
    """

    url: str = ""
    model: str = ""
    api_key_env: str | None = "OPENAI_API_KEY"
    timeout_s: float | None = None
    max_retries: int = 3
    backoff_s: float = 2.0
    max_backoff_s: float = 60.0
    max_concurrent: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens_key: MaxTokensKey = "max_tokens"
    send_seed: bool = True
    extra_body: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        def key(name: str) -> str:
            return f"{_WHERE}.{name}"

        require(isinstance(self.url, str) and self.url.startswith(("http://", "https://")), key("url"),
                f"must be the endpoint's base URL (http:// or https://, e.g. https://api.openai.com/v1), "
                f"got {self.url!r}")
        require(isinstance(self.model, str) and bool(self.model.strip()), key("model"),
                "must name the model the endpoint serves (e.g. gpt-4o), got nothing")
        require(self.api_key_env is None or (isinstance(self.api_key_env, str) and bool(self.api_key_env)),
                key("api_key_env"), "must name an environment variable, or be null for an endpoint without a key")
        require(self.timeout_s is None or self.timeout_s > 0, key("timeout_s"),
                f"must be > 0 or null (the role's selfplay timeout), got {self.timeout_s}")
        require(isinstance(self.max_retries, int) and not isinstance(self.max_retries, bool)
                and self.max_retries >= 0, key("max_retries"), f"must be an integer >= 0, got {self.max_retries!r}")
        require(self.backoff_s >= 0, key("backoff_s"), f"must be >= 0, got {self.backoff_s}")
        require(self.max_backoff_s >= 0, key("max_backoff_s"), f"must be >= 0, got {self.max_backoff_s}")
        require(self.max_concurrent is None or (isinstance(self.max_concurrent, int)
                and not isinstance(self.max_concurrent, bool) and self.max_concurrent >= 1), key("max_concurrent"),
                f"must be an integer >= 1 or null (no cap), got {self.max_concurrent!r}")
        require(self.temperature is None or 0.0 <= self.temperature <= 2.0, key("temperature"),
                f"must be in [0, 2] or null (the role's selfplay temperature), got {self.temperature}")
        require(self.top_p is None or 0.0 < self.top_p <= 1.0, key("top_p"),
                f"must be in (0, 1] or null (selfplay.top_p), got {self.top_p}")
        require(self.top_k is None or (isinstance(self.top_k, int) and self.top_k >= 1), key("top_k"),
                f"must be an integer >= 1 or null (not sent), got {self.top_k!r}")
        require(self.max_tokens_key in MAX_TOKENS_KEYS, key("max_tokens_key"),
                f"{self.max_tokens_key!r} is not allowed; choose one of: {', '.join(MAX_TOKENS_KEYS)}")
        require(self.extra_body is None or isinstance(self.extra_body, dict), key("extra_body"),
                f"must be a mapping or null, got {self.extra_body!r}")

    def api_key(self) -> str:
        """The key from ``api_key_env``; a :class:`ConfigError` naming the variable when it is unset."""
        if self.api_key_env is None:
            return "none"  # the client insists on some key; a server without auth ignores it
        value = os.environ.get(self.api_key_env, "")
        if not value:
            raise ConfigError(f"{_WHERE}.api_key_env: the environment variable {self.api_key_env} is not set "
                              f"(the API key of {self.url}); export it, name another variable, or set "
                              "api_key_env: null for an endpoint that needs no key")
        return value
