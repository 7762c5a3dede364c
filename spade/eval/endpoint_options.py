"""``--tau2 KEY=VALUE`` / ``--acebench KEY=VALUE``: the settings of a benchmark that runs in its own
venv against OpenAI-compatible endpoints, read from command-line pairs and checked the same way, and
who plays the user that such a run simulates."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional, Sequence, TypeVar

T = TypeVar("T")
SELF_SIMULATED = "self-simulated user"


def settings_from_pairs(cls: type[T], pairs: Sequence[str], prefix: str) -> T:
    """``cls`` (a dataclass) from ``KEY=VALUE`` strings (lists comma-separated; ``none`` for no value);
    ``prefix`` (``tau2``, ``acebench``) names the option in errors and may precede a key."""
    kinds = {f.name: f.type for f in fields(cls)}
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().removeprefix(f"{prefix}.")
        if not sep or key not in kinds:
            raise ValueError(f"--{prefix} {pair!r}: expected KEY=VALUE with KEY one of {', '.join(kinds)}")
        values[key] = parse_value(f"{prefix}.{key}", str(kinds[key]), text.strip())
    return cls(**values)


def parse_value(name: str, kind: str, text: str) -> Any:
    """``text`` read as the annotated ``kind`` (a type's text: tuple, bool, int, float, else str)."""
    if text.lower() == "none" and kind.startswith("Optional"):
        return None
    try:
        if "tuple" in kind:
            return tuple(t.strip() for t in text.split(",") if t.strip())
        if "bool" in kind:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("true", "1", "yes")
        if "int" in kind:
            return int(text)
        if "float" in kind:
            return float(text)
    except ValueError:
        raise ValueError(f"{name}: cannot read {text!r} as {kind}") from None
    return text


def check_endpoints(settings: Any, prefix: str) -> None:
    """``agent_url`` / ``user_url``: http(s) base URLs, each with the model served there named."""
    for url, name in (("agent_url", "agent_model"), ("user_url", "user_model")):
        value = getattr(settings, url)
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"{prefix}.{url} must be an http(s) base URL such as http://host:8000/v1, got {value!r}")
        if value is not None and not getattr(settings, name):
            raise ValueError(f"{prefix}.{url} is set: {prefix}.{name} must name the model served there")


def check_harness_settings(settings: Any, prefix: str, at_least_one: Sequence[str]) -> None:
    """The checks tau2's and ACEBench's settings share: the ``at_least_one`` keys (counts and
    limits) >= 1, ``max_concurrency`` >= 1 or unset, ``user_temperature`` >= 0, ``timeout_s`` > 0 or
    unset, and the endpoints (:func:`check_endpoints`). Errors name ``prefix.key``."""
    for key in at_least_one:
        if getattr(settings, key) < 1:
            raise ValueError(f"{prefix}.{key} must be >= 1, got {getattr(settings, key)}")
    if settings.max_concurrency is not None and settings.max_concurrency < 1:
        raise ValueError(f"{prefix}.max_concurrency must be >= 1, got {settings.max_concurrency}")
    if settings.user_temperature < 0:
        raise ValueError(f"{prefix}.user_temperature must be >= 0, got {settings.user_temperature}")
    if settings.timeout_s is not None and settings.timeout_s <= 0:
        raise ValueError(f"{prefix}.timeout_s must be > 0, got {settings.timeout_s}")
    check_endpoints(settings, prefix)


@dataclass(frozen=True)
class UserSimulator:
    """Who plays the user: ``note`` for the summary's notes; ``off_protocol`` set (the reason) when
    it is the model under test, which the paper never does (its user is an external model)."""

    note: str
    off_protocol: Optional[str] = None


def user_simulator(settings: Any, prefix: str) -> UserSimulator:
    """The user simulator of a tau2 or ACEBench run from its settings (``user_url``, ``user_model``,
    ``agent_url``, ``agent_model``); ``prefix`` names the settings (``tau2``, ``acebench``)."""
    if settings.user_url is None or (settings.user_url == settings.agent_url
                                     and (settings.user_model or settings.agent_model) == settings.agent_model):
        return UserSimulator("self: the model under test plays the user",
                             f"{SELF_SIMULATED}: the model under test plays the user, where the paper uses an "
                             f"external user model; kept out of the paper's column (set {prefix}.user_url and "
                             f"{prefix}.user_model)")
    return UserSimulator(f"{settings.user_model} at {settings.user_url}")
