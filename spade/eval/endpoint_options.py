"""``--tau2 KEY=VALUE`` / ``--acebench KEY=VALUE``: the settings of a benchmark that runs in its own
venv against OpenAI-compatible endpoints, read from command-line pairs and checked the same way."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Sequence, TypeVar

T = TypeVar("T")


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
