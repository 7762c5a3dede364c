"""Admission's winnability stage (issue 40) through the real sandbox: what the designer offered as
proof that its game can be won (``solution()`` actions, an optional ``reference_policy``) is played
on the candidate's probe seeds; offered and lost rejects as ``unwinnable``, only a description is
``unproven`` (admitted or rejected by ``selfplay.admission.winnability_unproven``)."""

from __future__ import annotations

import textwrap

import pytest

from spade.envs.admission import admit
from spade.envs.degenerate_probes import ProbeSettings
from spade.envs.protocol import ErrorKind, Stage
from spade.envs.sandbox.runtime.probe_play import NothingToPlay, solution_actions
from spade.envs.winnability import WinnabilitySettings
from spade.selfplay.settings import AdmissionSettings, SelfPlaySettings

# Open a three-digit lock, one digit a turn, told how many are right so far; the win ends the episode.
LOCK = textwrap.dedent('''
    import random
    import re


    class DigitLockEnv:
        def __init__(self, max_turns=10):
            self.max_turns = max_turns

        def reset(self, seed=None):
            rng = random.Random(seed)
            self.code = [rng.randint(0, 9) for _ in range(3)]
            self.entered = []
            self.turn = 0
            return "Enter the lock's three digits one at a time as \\\\boxed{D}.", {}

        def step(self, action):
            self.turn += 1
            found = re.search(r"\\\\boxed\\{(\\d)\\}", action)
            if found is None:
                return "One digit.", 0.0, False, self.turn >= self.max_turns, {}
            self.entered.append(int(found.group(1)))
            if self.entered[-3:] == self.code:
                return "Open.", 1.0, WIN_ENDS, False, {}
            right = sum(a == b for a, b in zip(self.entered[-3:], self.code))
            return f"{right} right so far.", 0.0, False, self.turn >= self.max_turns, {}
''')


def lock(solution: str = "", *, win_ends: bool = True) -> str:
    return LOCK.replace("WIN_ENDS", str(win_ends)) + textwrap.indent(textwrap.dedent(solution), "    ")


ACTIONS = '''
def solution(self):
    return ["\\\\boxed{%d}" % d for d in self.code]
'''
BARE_ACTIONS = '''
def solution(self):
    return [str(d) for d in self.code]
'''
BOXED_TEXT = '''
def solution(self):
    return "Enter " + ", then ".join("\\\\boxed{%d}" % d for d in self.code)
'''
PROSE = '''
def solution(self):
    return "enter the digits of the code in order"
'''
NOT_WRITTEN = '''
def solution(self):
    raise NotImplementedError
'''
WRONG = '''
def solution(self):
    return ["\\\\boxed{%d}" % ((d + 1) % 10) for d in self.code]
'''
REFERENCE = '''
def reference_policy(self, observation):
    return "\\\\boxed{%d}" % self.code[len(self.entered) % 3]
'''


def verdict_for(sandbox, source: str, unproven: str = "admit"):
    return sandbox.run(admit(sandbox.service, source, max_turns=10, probes=ProbeSettings(seed_base=1),
                             winnability=WinnabilitySettings(unproven=unproven)), timeout=120)


@pytest.mark.parametrize("solution", [ACTIONS, BARE_ACTIONS, BOXED_TEXT, REFERENCE],
                         ids=["boxed list", "bare list", "boxed text", "reference policy only"])
def test_a_proof_that_wins_every_seed_admits(sandbox, solution):
    verdict = verdict_for(sandbox, lock(solution), unproven="reject")
    assert verdict.admitted, verdict.error
    report = verdict.winnability_report
    assert report.verdict == "won" and report.winner().returns == [1.0] * 8
    assert report.seeds == verdict.probe_report.seeds[:8]


def test_a_game_that_never_ends_on_the_win_is_unwinnable(sandbox):
    """The proof reaches the win, but the game never sets terminated: every episode returns 0."""
    verdict = verdict_for(sandbox, lock(ACTIONS, win_ends=False))
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.UNWINNABLE, Stage.WINNABILITY)
    assert verdict.probe_report.winner is None  # no probe can see it
    assert "solution reaches a mean return of 0.000" in verdict.error.message


def test_a_wrong_solution_is_unwinnable_and_a_winning_reference_rescues_it(sandbox):
    assert verdict_for(sandbox, lock(WRONG)).error.kind is ErrorKind.UNWINNABLE
    rescued = verdict_for(sandbox, lock(WRONG + REFERENCE))
    assert rescued.admitted and rescued.winnability_report.to_json()["won_by"] == "offered_reference_policy"


@pytest.mark.parametrize("solution, why", [(PROSE, "not a list of actions"), (NOT_WRITTEN, "NotImplementedError"),
                                           ("", "no solution() method")],
                         ids=["prose", "not written", "missing"])
def test_only_a_description_is_unproven_admitted_or_rejected_by_the_switch(sandbox, solution, why):
    admitted = verdict_for(sandbox, lock(solution))
    assert admitted.admitted and admitted.winnability_report.verdict == "unproven"
    assert why in admitted.winnability_report.why_unproven()
    rejected = verdict_for(sandbox, lock(solution), unproven="reject")
    assert (rejected.error.kind, rejected.error.stage) == (ErrorKind.UNWINNABLE, Stage.WINNABILITY)
    assert "no playable proof" in rejected.error.message


def test_solution_actions_reads_lists_and_boxed_text():
    assert solution_actions(["a", "b"]) == ["a", "b"]
    assert solution_actions("first \\boxed{go north}, then \\boxed{ open door }") == ["\\boxed{go north}",
                                                                                     "\\boxed{open door}"]
    for described in ("reach the exit", 42, [], ["a", 1], None):
        with pytest.raises(NothingToPlay):
            solution_actions(described)


def test_the_switches():
    assert SelfPlaySettings().admission_winnability_settings() is None
    gate = AdmissionSettings(winnability_gate=True)
    on = SelfPlaySettings(admission=AdmissionSettings(winnability_gate=True, winnability_unproven="reject",
                                                      reference_min_return=0.8))
    assert on.admission_winnability_settings() == WinnabilitySettings(
        min_return=0.8, unproven="reject", max_steps=on.admission.probe_steps, max_seconds=on.admission.timeout_s / 4)
    exact = AdmissionSettings(winnability_gate=True, paper_exact=True)
    assert SelfPlaySettings(admission=exact).admission_winnability_settings() is None
    assert SelfPlaySettings(admission=gate, domain="tool_use").admission_winnability_settings() is None
    from spade.config import ConfigError

    with pytest.raises(ConfigError, match=r"selfplay\.admission\.winnability_unproven.*admit, reject"):
        AdmissionSettings(winnability_unproven="maybe")
    with pytest.raises(ConfigError, match=r"selfplay\.admission\.winnability_gate"):
        AdmissionSettings(winnability_gate="yes")
    with pytest.raises(ConfigError, match=r"selfplay\.admission\.probe_seeds"):
        AdmissionSettings(probe_seeds=0)
