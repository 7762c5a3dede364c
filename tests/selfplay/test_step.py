"""The step counter: one count (updates done before the step), each of its readings by name.

The expected values are written out by hand from SPEC section 1 (k = 4: sets at steps 0, 4, 8; a
design of step 4 is scored at step 8 from the plays of steps 4-7) and from the run directory's
rules (checkpoint N holds N updates; resuming at N keeps what steps 0..N-1 wrote).
"""

from __future__ import annotations

import pytest

from spade.selfplay.step import Step

K = 4


def test_regeneration_steps_and_their_sets():
    steps = [Step(n) for n in range(10)]
    assert [s.regenerates(K) for s in steps] == [True, False, False, False, True, False, False, False, True, False]
    assert [s.regeneration(K) for s in steps] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert [Step(n).regenerates(1) for n in range(3)] == [True, True, True]  # k = 1: a new set every step


def test_after_is_the_version_and_checkpoint_of_the_step_and_last_run_what_a_resume_keeps():
    assert Step(0).after == Step(1) and Step(6).after.updates_done == 7
    assert Step(0).last_run == -1 and Step(7).last_run == 6
    assert [n for n in range(1, 11) if Step(n).every(4)] == [4, 8]
    assert Step(2) < Step(3) and Step(3) == Step(3)


def test_the_delayed_designer_window():
    design = Step(4)
    assert design.release_step(K) == 8
    assert [n for n in range(12) if design.in_window(n, K)] == [5, 6, 7]  # the later steps of 4..7
    assert [n for n in range(12) if design.window_overlaps(n, K)] == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("bad", [-1, 1.0, True, "3", None])
def test_a_step_is_a_non_negative_integer(bad):
    with pytest.raises(ValueError, match="step: must be an integer >= 0"):
        Step(bad)


def test_ordinal_is_the_step_as_a_person_counts_it():
    """The console's 'step N/total' is 1 for the first step (0 updates done)."""
    assert [Step(s).ordinal for s in (0, 1, 9)] == [1, 2, 10]
