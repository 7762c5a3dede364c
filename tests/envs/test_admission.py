"""The admission pipeline (SPEC section 3) end to end through the real sandbox."""

from __future__ import annotations

import textwrap

import pytest

from spade.envs.admission import admit
from spade.envs.protocol import ErrorKind, Stage

from conftest import EXAMPLE_ENVS

GOOD = textwrap.dedent('''
    import random

    class GuessEnv:
        def __init__(self, max_turns=8):
            self.max_turns = max_turns

        def reset(self, seed=None):
            self.rng = random.Random(seed)
            self.secret = self.rng.randint(1, 100)
            self.turn = 0
            return f"Guess a number from 1 to 100. Seed-dependent banner {self.rng.random():.6f}", {}

        def step(self, action):
            self.turn += 1
            digits = "".join(c for c in action if c.isdigit())
            if digits and int(digits) == self.secret:
                return "right", 1.0, True, False, {}
            if self.turn >= 5:  # five guesses whatever the run's turn budget: a bisection cannot be sure
                return "out of guesses", 0.0, True, False, {}
            hint = "higher" if digits and int(digits) < self.secret else "lower"
            return hint, 0.0, False, self.turn >= self.max_turns, {"turn": self.turn}
''')


def verdict_for(sandbox, source: str, **kwargs):
    return sandbox.run(admit(sandbox.service, source, **kwargs))


@pytest.mark.parametrize("path", EXAMPLE_ENVS, ids=lambda p: p.stem)
def test_every_example_is_admitted(sandbox, path):
    """The hand-written examples pass every stage and report their class and first observation."""
    verdict = verdict_for(sandbox, path.read_text())
    assert verdict.admitted, verdict.error
    assert verdict.class_name.endswith("Env")
    assert verdict.first_observation
    assert set(verdict.timings_ms) == {"extract", "syntax", "load", "smoke", "determinism", "degenerate_probe"}


def test_fenced_response_with_fstring_bug_is_repaired_and_admitted(sandbox):
    """A designer response in markdown with a bad f-string field is extracted, repaired, admitted."""
    broken = GOOD.replace('return "right"', 'return f"right, written {as digits}"')
    response = f"Here is the environment.\n\n```python\n{broken}\n```\nEnjoy."
    verdict = verdict_for(sandbox, response)
    assert verdict.admitted, verdict.error
    assert verdict.repairs == 1
    assert "{{as digits}}" in verdict.code


def test_empty_response_is_rejected_at_extract(sandbox):
    verdict = verdict_for(sandbox, "I cannot write that.\n```python\n```")
    assert not verdict.admitted
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.SYNTAX_ERROR, Stage.EXTRACT)


def test_syntax_error_is_rejected_before_the_sandbox(sandbox):
    verdict = verdict_for(sandbox, "class BrokenEnv:\n    def reset(self:\n        pass\n")
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.SYNTAX_ERROR, Stage.SYNTAX)
    assert "timings_ms" in verdict.to_json() and "load" not in verdict.timings_ms


@pytest.mark.parametrize("source, kind", [
    ("class Board:\n    pass\n", ErrorKind.NO_ENV_CLASS),
    ("import os\nclass AEnv:\n    pass\n", ErrorKind.IMPORT_BLOCKED),
    ("class AEnv:\n    def __init__(self):\n        raise ValueError('boom')\n"
     "    def reset(self, seed=None):\n        return 'x', {}\n    def step(self, a):\n        return 'x', 0.0, True, False, {}\n",
     ErrorKind.INIT_ERROR),
])
def test_load_stage_failures(sandbox, source, kind):
    verdict = verdict_for(sandbox, source)
    assert (verdict.error.kind, verdict.error.stage) == (kind, Stage.LOAD)


SMOKE_CASES = {
    "empty observation": (GOOD.replace('return f"Guess a number from 1 to 100. Seed-dependent banner '
                                       '{self.rng.random():.6f}", {}', 'return "", {}'),
                          ErrorKind.BAD_RETURN, "empty observation"),
    "reset raises": (GOOD.replace("self.secret = self.rng.randint(1, 100)", "self.secret = 1 / 0"),
                     ErrorKind.RESET_ERROR, "ZeroDivisionError"),
    "step raises": (GOOD.replace("self.turn += 1", "self.turn += undefined_name"),
                    ErrorKind.STEP_ERROR, "NameError"),
    "step returns 4-tuple": (GOOD.replace('return hint, 0.0, False, self.turn >= self.max_turns, {"turn": self.turn}',
                                          'return hint, 0.0, False, {}'),
                             ErrorKind.BAD_RETURN, "4-tuple"),
    "reward out of range": (GOOD.replace("return hint, 0.0,", "return hint, 11.5,"),
                            ErrorKind.BAD_RETURN, "outside [-10, 10]"),
    "reward is a string": (GOOD.replace("return hint, 0.0,", "return hint, '0.0',"),
                           ErrorKind.BAD_RETURN, "real number"),
    "info not serialisable": (GOOD.replace('{"turn": self.turn}', '{"turn": object()}'),
                              ErrorKind.NOT_SERIALIZABLE, "JSON"),
    "reset with second seed fails": (GOOD.replace("self.turn = 0", "self.turn = 0\n        assert seed != 123"),
                                     ErrorKind.RESET_ERROR, "AssertionError"),
}


@pytest.mark.parametrize("name", SMOKE_CASES)
def test_smoke_stage_failures(sandbox, name):
    source, kind, fragment = SMOKE_CASES[name]
    verdict = verdict_for(sandbox, source)
    assert not verdict.admitted
    assert (verdict.error.kind, verdict.error.stage) == (kind, Stage.SMOKE)
    assert fragment in verdict.error.message


def test_unseeded_randomness_is_rejected_as_nondeterministic(sandbox):
    """The first observation must be a function of the seed (this project's addition to the paper)."""
    source = "import random\n" + GOOD.replace("{self.rng.random():.6f}", "{random.random():.6f}")
    verdict = verdict_for(sandbox, source)
    assert (verdict.error.kind, verdict.error.stage) == (ErrorKind.NONDETERMINISTIC_RESET, Stage.DETERMINISM)


def test_state_leaking_across_resets_is_rejected(sandbox):
    source = GOOD.replace("self.turn = 0\n", "self.turn = 0\n        self.resets = getattr(self, 'resets', 0) + 1\n") \
                 .replace("{self.rng.random():.6f}", "{self.resets}")
    verdict = verdict_for(sandbox, source)
    assert verdict.error.kind is ErrorKind.NONDETERMINISTIC_RESET


def test_probing_stops_when_the_episode_ends(sandbox):
    """An environment that terminates on its first step is not stepped again after the end."""
    source = textwrap.dedent('''
        class OneShotEnv:
            def reset(self, seed=None):
                self.done = False
                return "answer once", {}
            def step(self, action):
                if self.done:
                    raise RuntimeError("stepped after the end")
                self.done = True
                return "over", 0.0, True, False, {}
    ''')
    verdict = verdict_for(sandbox, source)
    assert verdict.admitted, verdict.error


def test_max_turns_is_passed_when_accepted(sandbox):
    verdict = verdict_for(sandbox, GOOD, max_turns=3)
    assert verdict.admitted and verdict.max_turns == 3
    verdict = verdict_for(sandbox, GOOD.replace("def __init__(self, max_turns=8):", "def __init__(self):")
                          .replace("self.max_turns = max_turns", "self.max_turns = 8"), max_turns=3)
    assert verdict.admitted and verdict.max_turns == 8


def test_json_verdict_has_the_documented_keys(sandbox):
    data = verdict_for(sandbox, GOOD).to_json("env.py")
    assert list(data) == ["path", "admitted", "class_name", "error", "first_observation", "timings_ms", "probe_report"]
    assert data["admitted"] is True and data["error"] is None


@pytest.mark.parametrize("raw, says", [
    (b"class AEnv:\n    name = '\xff\xfe'\n", "byte 0xff, which is not UTF-8, at line 2, column 13"),
    (b"\x89PNG\r\n\x1a\n\x00\x00", "byte 0x89, which is not UTF-8, at line 1, column 1"),
    (b"class AEnv:\n    x = 1\x00\n", "a NUL byte, at line 2, column 10"),
], ids=["latin-1", "binary", "nul"])
def test_source_that_is_not_text_is_a_syntax_error_in_plain_words(sandbox, tmp_path, capsys, raw, says):
    """What ``spade env check`` reads (UTF-8 with surrogateescape) and admit() sees."""
    from spade.cli import main
    from spade.cli.common import read_text

    path = tmp_path / "env.py"
    path.write_bytes(raw)
    verdict = verdict_for(sandbox, read_text(str(path)))
    assert (verdict.admitted, verdict.error.kind, verdict.error.stage) == (False, ErrorKind.SYNTAX_ERROR, Stage.SYNTAX)
    assert says in verdict.error.message and "Error" not in verdict.error.message

    assert main(["env", "check", "--isolation", "unsafe-local", str(path)]) == 1
    out = capsys.readouterr().out
    assert out == f"{path}: rejected at syntax: syntax_error: {verdict.error.message}\n" \
                  "checked 1: 0 admitted, 1 rejected (syntax_error 1)\n"
    assert main(["env", "run", "--isolation", "unsafe-local", str(path), "--actions", "x"]) == 2
    assert says in capsys.readouterr().err


def test_determinism_stage_is_a_switch_and_off_restores_the_paper(sandbox):
    """``selfplay.admission.determinism`` (on by default): off, the paper's stages alone run (SPEC
    3.4), so a first observation that ignores the seed is admitted and no determinism stage is timed;
    the switch reaches admission through ``admit_candidate``, as the designer round and the pool call it."""
    from spade.selfplay.sources.designer_source import admit_candidate
    from spade.selfplay.settings import AdmissionSettings, SelfPlaySettings

    source = "import random\n" + GOOD.replace("{self.rng.random():.6f}", "{random.random():.6f}")
    paper = verdict_for(sandbox, source, determinism=False)
    assert paper.admitted, paper.error
    assert "determinism" not in paper.timings_ms and "smoke" in paper.timings_ms
    assert SelfPlaySettings().admission.determinism is True
    paper = SelfPlaySettings(admission=AdmissionSettings(determinism=False))
    on = sandbox.run(admit_candidate(sandbox.service, SelfPlaySettings(), source))
    assert (on.error.kind, on.error.stage) == (ErrorKind.NONDETERMINISTIC_RESET, Stage.DETERMINISM)
    off = sandbox.run(admit_candidate(sandbox.service, paper, source))
    assert off.admitted, off.error
    # the smoke test itself (the paper's) still rejects what it always did
    broken = source.replace("self.turn = 0\n", "self.turn = 0\n        assert seed != 123\n")
    rejected = sandbox.run(admit_candidate(sandbox.service, paper, broken))
    assert (rejected.error.kind, rejected.error.stage) == (ErrorKind.RESET_ERROR, Stage.SMOKE)
