"""The formula-reveal detector and the physics classifier on positive and negative examples."""

from __future__ import annotations

import pytest

from spade.analysis.formula import is_physics, observation_of, states_formula
from test_analysis_fixture import EXAMPLES, PREAMBLE

STATES_A_FORMULA = [
    "A ball is dropped from rest. Use h = 1/2 g t^2 to find the time.",
    "Kinetic energy: KE = 0.5 * m * v^2.",
    "Recall F = ma.",
    "Einstein: E = mc^2",
    "Remember that distance equals speed times time.",
    "The cart obeys v = u + a*t where a = 2 m/s^2.",
    "Ohm's law V = IR holds for every resistor.",
    "Position x(t) = x_0 + v*t",
    "d = speed * time",
    "The period is T = 2π√(L/g).",
    "For the gas, PV = nRT.",
]
STATES_NO_FORMULA = [
    "You have 5 turns. Score = 0.",
    "Mass = 3.2 kg, speed = 4 m/s.",
    "Acceleration = 9.8 m/s^2, height = 20 m.",
    "target = 17",
    "Guess x = ?",
    "Goal: make the lights show the target pattern: 1:ON 2:off.",
    "Use \\boxed{guess 691} to answer. N mod 13 = 5.",
    "score = hits - misses",
    "The answer is x = the number of apples + 2",
    "Option A = no, option B = on",
    "x = a number you choose",
    "A cannon fires a shell; measure where it lands by firing at different angles.",
]


@pytest.mark.parametrize("text", STATES_A_FORMULA)
def test_formulas_are_detected(text: str) -> None:
    assert states_formula(PREAMBLE + text)


@pytest.mark.parametrize("text", STATES_NO_FORMULA)
def test_values_rules_and_prose_are_not_formulas(text: str) -> None:
    assert not states_formula(PREAMBLE + text)


def test_only_the_observation_counts_not_the_preamble_or_the_hint() -> None:
    opening = PREAMBLE + "Launch the probe.\n\nHINT: use v = u + a*t"
    assert observation_of(opening) == "Launch the probe."
    assert not states_formula(opening)


PROJECTILE = '''"""Projectile range: the agent picks launch angles; the hidden gravity decides where shells land."""
import math, random


class ProjectileEnv:
    def reset(self, seed=None):
        self.gravity = random.Random(seed).uniform(5, 15)
        self.velocity = 20.0
        return "Fire at an angle.", {}
'''


def test_physics_classifier() -> None:
    assert is_physics(PROJECTILE, "ProjectileEnv")
    assert is_physics("# a pendulum with friction\nclass SwingEnv: pass", "SwingEnv")
    assert not is_physics("class KnapsackEnv:\n    '''pack crates by value'''", "KnapsackEnv")
    assert not is_physics("class MassageEnv: pass", "MassageEnv")  # one stem ('mass') is not enough
    for path in sorted(EXAMPLES.glob("*.py")):  # none of the hand-written examples is physics
        assert not is_physics(path.read_text(), ""), path.name
