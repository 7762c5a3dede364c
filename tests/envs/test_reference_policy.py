"""Admission's optional winnability proof (issue 23): with ``selfplay.admission.reference_policy``
the designer prompt asks for ``reference_policy(observation)`` and admission plays it on the
probes' seeds, admitting only when it wins (mean return >= ``selfplay.admission.reference_min_return``)."""

from __future__ import annotations

import random
import re
import textwrap

import pytest

from spade.designer.prompts import REFERENCE_POLICY_SPEC, DesignerRequest, designer_messages
from spade.envs.admission import admit
from spade.envs.degenerate_probes import PROBE_SEEDS
from spade.envs.protocol import ErrorKind, Stage
from spade.envs.reference_policy import ReferenceSettings
from spade.selfplay.settings import AdmissionSettings, SelfPlaySettings
from spade.designer.skills import Skill

# A hidden number from 1 to 50, told left / right on the number line; the reference policy bisects
# (at most 6 guesses, within the 8 guesses the game allows whatever the run's turn budget).
# ``{policy}`` is the method's body. The feedback avoids the comparison words the probes' own
# bisection reads (issue 40), so that this file tests the reference stage alone; a game a blind
# bisection wins is rejected before it (tests/envs/test_degenerate_probes.py).
HUNT = '''
import random
import re


class HuntEnv:
    def __init__(self, max_turns=8):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.secret = random.Random(seed).randint(1, 50)
        self.low, self.high, self.turn = 1, 50, 0
        return "Find my number from 1 to 50 in 8 guesses. Reply with \\\\boxed{N}.", {}

    def step(self, action):
        self.turn += 1
        found = re.search(r"-?\\d+", action)
        guess = int(found.group()) if found else 0
        if guess == self.secret:
            return "Found it.", 1.0, True, False, {}
        if self.turn >= 8:
            return "Out of guesses.", 0.0, True, False, {}
        if guess < self.secret:
            self.low = max(self.low, guess + 1)
            hint = "right"
        else:
            self.high = min(self.high, guess - 1)
            hint = "left"
        return f"It lies to the {hint} of that. Reply with \\\\boxed{{N}}.", 0.0, False, self.turn >= self.max_turns, {}
'''
BISECT = '''
    def reference_policy(self, observation):
        return "\\\\boxed{" + str((self.low + self.high) // 2) + "}"
'''
ALWAYS_ONE = '''
    def reference_policy(self, observation):
        return "\\\\boxed{1}"
'''
RAISES = '''
    def reference_policy(self, observation):
        raise RuntimeError("not written yet")
'''


def verdict_for(sandbox, source: str, reference=ReferenceSettings()):
    return sandbox.run(admit(sandbox.service, source, max_turns=25, reference=reference), timeout=120)


def _hand_bisect(seed: int) -> int:
    """Guesses the bisecting reference needs for the secret of ``seed``, computed here."""
    secret, low, high = random.Random(seed).randint(1, 50), 1, 50
    for guesses in range(1, 9):
        guess = (low + high) // 2
        if guess == secret:
            return guesses
        low, high = (guess + 1, high) if guess < secret else (low, guess - 1)
    raise AssertionError("bisection takes at most 6 guesses for 50 numbers")


def test_a_winning_reference_policy_is_admitted_with_both_returns_reported(sandbox):
    verdict = verdict_for(sandbox, HUNT + BISECT)
    assert verdict.admitted, verdict.error
    report = verdict.reference_report
    assert report.won and report.result.returns == [1.0] * len(PROBE_SEEDS) and report.result.seeds == list(PROBE_SEEDS)
    assert report.steps == sum(_hand_bisect(seed) for seed in PROBE_SEEDS)
    best = max(r.mean_return for r in verdict.probe_report.results if r.mean_return is not None)
    assert report.probes_best_return == best < 0.5
    data = verdict.to_json()["reference_report"]
    assert data["mean_return"] == 1.0 and data["won"] and data["probes_best_return"] == best
    assert "reference_policy" in verdict.timings_ms


def test_a_losing_reference_policy_is_rejected_as_reference_lost(sandbox):
    """Always guessing 1 wins only where the secret is 1 (none of seeds 1-3: computed here)."""
    assert all(random.Random(seed).randint(1, 50) != 1 for seed in PROBE_SEEDS)
    verdict = verdict_for(sandbox, HUNT + ALWAYS_ONE)
    assert not verdict.admitted
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.REFERENCE_LOST, Stage.REFERENCE_POLICY)
    assert "mean return of 0.000" in verdict.error.message and verdict.reference_report.mean_return == 0.0
    # a raising method loses too, its episode ended by the fault
    raising = verdict_for(sandbox, HUNT + RAISES)
    assert raising.error.kind is ErrorKind.REFERENCE_LOST
    assert raising.reference_report.result.endings[0] == "policy_fault"


def test_a_class_without_the_method_is_rejected_as_reference_missing(sandbox):
    verdict = verdict_for(sandbox, HUNT)
    assert not verdict.admitted
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.REFERENCE_MISSING, Stage.REFERENCE_POLICY)
    assert "HuntEnv has no reference_policy" in verdict.error.message
    # without the switch the same class is admitted and its reference policy is not played
    off = verdict_for(sandbox, HUNT, reference=None)
    assert off.admitted and off.reference_report is None and "reference_policy" not in off.timings_ms


def test_the_settings_reach_admission_through_admit_candidate(sandbox):
    from spade.selfplay.sources.designer_source import admit_candidate

    def run(**admission):
        return sandbox.run(admit_candidate(sandbox.service, SelfPlaySettings(admission=AdmissionSettings(**admission)),
                                           HUNT), timeout=120)

    assert run(reference_policy=True).error.kind is ErrorKind.REFERENCE_MISSING
    assert run().admitted and run(reference_policy=True, paper_exact=True).admitted
    # in a run the reference policy plays the candidate's own first round of probe seeds (issue 40)
    won = sandbox.run(admit_candidate(sandbox.service, SelfPlaySettings(admission=AdmissionSettings(reference_policy=True)),
                                      HUNT + BISECT, run_seed=5), timeout=120)
    assert won.admitted and won.reference_report.won
    assert won.reference_report.seeds == won.probe_report.seeds[:8] and len(set(won.reference_report.seeds)) == 8


def test_the_switch_reaches_the_prompt_and_admission():
    request = DesignerRequest(skill=Skill("Logical Deduction", "deduce hidden facts"), document="A text.")
    off = SelfPlaySettings()
    assert not off.asks_reference_policy and off.admission_reference_settings() is None
    assert REFERENCE_POLICY_SPEC not in designer_messages(request)[-1]["content"]
    on = SelfPlaySettings(admission=AdmissionSettings(reference_policy=True, reference_min_return=0.8))
    assert on.asks_reference_policy
    assert on.admission_reference_settings() == ReferenceSettings(min_return=0.8, seeds=(),
                                                                  max_seconds=on.admission.timeout_s / 4)
    asked = DesignerRequest(skill=request.skill, document="A text.", reference_policy=True)
    for prompt in (designer_messages(asked), designer_messages(asked, no_corpus="concepts", rng=random.Random(0)),
                   designer_messages(asked, order="shared_prefix")):
        assert "reference_policy(self, observation)" in prompt[-1]["content"]
    # the paper-exact switch turns it off, prompt and stage
    exact = SelfPlaySettings(admission=AdmissionSettings(reference_policy=True, paper_exact=True))
    assert not exact.asks_reference_policy and exact.admission_reference_settings() is None


@pytest.mark.parametrize("settings, says", [
    (dict(reference_policy="yes"), "selfplay.admission.reference_policy"),
    (dict(reference_min_return=0.0), "selfplay.admission.reference_min_return"),
    (dict(reference_min_return=1.5), "selfplay.admission.reference_min_return"),
])
def test_bad_values_name_the_key(settings, says):
    from spade.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape(says)):
        AdmissionSettings(**settings)


def test_the_rejections_count_per_step_as_their_own_metrics(tmp_path):
    from spade.selfplay.sources.designer_source import RegenerationResult, write_rejection
    from spade.selfplay.step_figures import regeneration_figures

    record = {"step": 0, "slot": 0, "attempt": 0, "skill": "Logical Deduction"}
    rejection = write_rejection(tmp_path, record, ErrorKind.REFERENCE_LOST, Stage.REFERENCE_POLICY, "lost", "")
    metrics: dict[str, float] = {}
    metrics.update(regeneration_figures(SelfPlaySettings(admission=AdmissionSettings(reference_policy=True)),
                                        RegenerationResult(attempts=1, rejections=[rejection])))
    assert metrics["env/rejected_reference_lost"] == 1.0 and metrics["env/rejected_reference_missing"] == 0.0
    off: dict[str, float] = {}
    off.update(regeneration_figures(SelfPlaySettings(), RegenerationResult(attempts=1, rejections=[])))
    assert "env/rejected_reference_missing" not in off
