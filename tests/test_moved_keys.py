"""``MOVED_KEYS``: a section's keys that moved load at their new paths (spade.config.upgrade_keys),
with one warning each; a key given both ways is an error naming both."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from spade.config import ConfigError, from_mapping, upgrade_keys


@dataclass(frozen=True)
class Inner:
    size: int = 1
    mode: str = "a"


@dataclass(frozen=True)
class Outer:
    MOVED_KEYS: ClassVar[dict[str, Any]] = {
        "inner_size": "inner.size",                                   # one new path
        "both_sizes": ("inner.size", "other.size"),                   # fanned out
        "preset": {"plain": {}, "wide": {"inner.size": 9, "inner.mode": "w"}},  # a choice, by its values
    }

    inner: Inner = field(default_factory=Inner)
    other: Inner = field(default_factory=Inner)


@dataclass(frozen=True)
class Top:
    outer: Outer = field(default_factory=Outer)


def test_a_moved_key_loads_at_its_new_path_with_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="spade.config"):
        loaded = from_mapping(Outer, {"inner_size": 3}, where="x")
    assert loaded == Outer(inner=Inner(size=3))
    assert caplog.messages == ["x.inner_size is now x.inner.size"]
    fanned = from_mapping(Outer, {"both_sizes": 4, "inner": {"mode": "b"}}, where="x")
    assert fanned == Outer(inner=Inner(4, "b"), other=Inner(4))
    assert from_mapping(Outer, {"preset": "wide"}, where="x") == Outer(inner=Inner(9, "w"))
    assert from_mapping(Outer, {"preset": "plain"}, where="x") == Outer()


def test_old_keys_apply_in_table_order_and_a_choice_outside_it_is_refused():
    assert from_mapping(Outer, {"preset": "wide", "both_sizes": 2}, where="x") == \
        Outer(inner=Inner(9, "w"), other=Inner(2))
    with pytest.raises(ConfigError, match=r"x\.preset: 'tall' is not allowed; choose one of: plain, wide"):
        from_mapping(Outer, {"preset": "tall"}, where="x")


def test_a_setting_given_both_ways_names_both():
    with pytest.raises(ConfigError, match=r"x\.inner_size and x\.inner\.size are the same setting"):
        from_mapping(Outer, {"inner_size": 3, "inner": {"size": 4}}, where="x")


def test_upgrade_keys_reaches_nested_sections_and_leaves_the_input_alone():
    data = {"outer": {"inner_size": 5}}
    assert upgrade_keys(Top, data, where="top") == {"outer": {"inner": {"size": 5}}}
    assert data == {"outer": {"inner_size": 5}}
    assert from_mapping(Top, data, where="top") == Top(Outer(inner=Inner(size=5)))
