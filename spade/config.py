"""Typed configuration: dataclasses filled from YAML mappings, with errors that name the key.

Every section of spade's configuration is a frozen dataclass. ``from_mapping`` builds one from a
plain mapping (YAML, JSON, dotted overrides), rejecting unknown keys, wrong types and values
outside a ``Literal``'s choices with a message that names the full key and what is allowed.

Keys an older spade had are handled by two class attributes of a section. ``RETIRED_KEYS`` (old key
-> message) refuses a key whose meaning is gone. ``MOVED_KEYS`` (old key -> new dotted path, relative
to the section) loads a key that only moved: :func:`upgrade_keys` writes its value at the new path
and logs one line naming it. A moved key can fan out to several paths (a tuple), or, for a key
that was a choice, map each choice to the values it stood for (a mapping ``{choice: {path: value}}``).
Setting a key both ways in one mapping is an error that names both.
"""

from __future__ import annotations

import dataclasses
import logging
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, TypeVar

import yaml

T = TypeVar("T")
log = logging.getLogger("spade.config")


class ConfigError(ValueError):
    """An invalid configuration; the message names the key and the allowed values."""


def from_mapping(cls: type[T], data: Mapping[str, Any] | None, *, where: str) -> T:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    data = _upgrade_here(cls, data, where)
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


def upgrade_keys(cls: type, data: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """``data`` (a mapping for section ``cls`` at ``where``) with every moved key of ``cls`` and of its
    nested sections written at its new path; the input is left as it is. Used where mappings are
    merged (config files, overrides), so that each source is upgraded before a later one overrides it."""
    out = _upgrade_here(cls, data, where)
    if not dataclasses.is_dataclass(cls):
        return out
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints.get(field.name)
        if dataclasses.is_dataclass(hint) and isinstance(out.get(field.name), Mapping):
            out[field.name] = upgrade_keys(hint, out[field.name], where=f"{where}.{field.name}")
    return out


def _upgrade_here(cls: type, data: Mapping[str, Any], where: str) -> dict[str, Any]:
    moved = getattr(cls, "MOVED_KEYS", {})
    out = dict(data)
    old = [key for key in moved if key in data]
    for key in old:  # a key given both ways: before any old key writes its value
        for path in _targets(moved[key], data[key], f"{where}.{key}"):
            if _get(data, path) is not _MISSING:
                raise ConfigError(f"{where}.{key} and {where}.{path} are the same setting, given twice: "
                                  f"keep {where}.{path} only")
    for key in old:
        value = out.pop(key)
        writes = _targets(moved[key], value, f"{where}.{key}")
        for path, new in writes.items():
            out = _put(out, path, new)
        if isinstance(moved[key], Mapping):
            now = ", ".join(f"{where}.{path}: {_yaml(new)}" for path, new in writes.items()) or "nothing (the values the new keys give stand)"
            log.warning("%s.%s: %s is now %s", where, key, value, now)
        else:
            log.warning("%s.%s is now %s", where, key, ", ".join(f"{where}.{path}" for path in writes))
    return out


_MISSING = object()


def _targets(rule: Any, value: Any, key: str) -> dict[str, Any]:
    """The new paths of one moved key and the value each gets."""
    if isinstance(rule, str):
        return {rule: value}
    if isinstance(rule, tuple):
        return {path: value for path in rule}
    if value not in rule:
        raise ConfigError(f"{key}: {value!r} is not allowed; choose one of: {', '.join(map(str, rule))}")
    return dict(rule[value])


def _get(data: Mapping[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _put(data: Mapping[str, Any], path: str, value: Any) -> dict[str, Any]:
    head, _, rest = path.partition(".")
    out = dict(data)
    if not rest:
        out[head] = value
        return out
    child = out.get(head)
    out[head] = _put(child if isinstance(child, Mapping) else {}, rest, value)
    return out


def _yaml(value: Any) -> str:
    return "null" if value is None else str(value)


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
