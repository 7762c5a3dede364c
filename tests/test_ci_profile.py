"""The suite's Hypothesis profile (tests/conftest.py): no per-example deadline, derandomized, and
each property test keeps the example count it asks for."""

from __future__ import annotations

import os

from hypothesis import settings

import test_actions


def test_the_profile_has_no_deadline_and_is_derandomized():
    profile = settings.get_profile("spade")
    assert profile.deadline is None and profile.derandomize
    if os.environ.get("HYPOTHESIS_PROFILE", "spade") == "spade":  # loaded unless another is asked for
        assert settings.default.deadline is None and settings.default.derandomize


def test_a_property_test_keeps_its_example_count_under_the_profile():
    own = test_actions.test_last_box_is_recovered._hypothesis_internal_use_settings
    assert own.max_examples == 300 and own.deadline == settings.default.deadline
