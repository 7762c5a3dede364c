"""Typed configuration: dataclasses filled from YAML mappings, with errors that name the key.

Every section of spade's configuration is a frozen dataclass. ``from_mapping`` builds one from a
plain mapping (YAML, JSON, dotted overrides), rejecting unknown keys, wrong types and values
outside a ``Literal``'s choices with a message that names the full key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """An invalid configuration; the message names the key and the allowed values."""


def from_mapping(cls: type[T], data: Mapping[str, Any] | None, *, where: str) -> T:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {field.name: field for field in dataclasses.fields(cls) if field.init}
    unknown = sorted(set(data) - set(fields))
    retired = getattr(cls, "RETIRED_KEYS", {})  # keys an older spade had: say what replaces them
    for key in unknown:
        if key in retired:
            raise ConfigError(f"{where}.{key}: {retired[key]}")
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key; allowed keys: {', '.join(sorted(fields))}")
    values = {name: _coerce(value, hints[name], f"{where}.{name}") for name, value in data.items()}
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return data


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, where=key)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not allowed; choose one of: {', '.join(map(str, choices))}")
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{key}: invalid value {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_hint, *_rest) = typing.get_args(hint) or (Any,)
        return tuple(_coerce(item, item_hint, f"{key}[{i}]") for i, item in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    return value


def require(condition: bool, key: str, message: str) -> None:
    """For ``__post_init__`` range checks."""
    if not condition:
        raise ConfigError(f"{key}: {message}")
