"""Property tests: whatever source or action arrives, the outcome is a result or a classified EnvFault.

Hypothesis generates random sources (random text; a valid environment with lines deleted, duplicated
or swapped and random tokens inserted), random actions (unicode, NULs, lone surrogates, strings up to
100k characters) and random return values. Every outcome must be a well-formed result or an
:class:`EnvFault` with a valid :class:`ErrorKind`, never any other exception, and the supervisor
must stay up throughout.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spade.envs.protocol import EnvFault, ErrorKind, ResetResult, StepResult

PROPERTY_SETTINGS = settings(max_examples=30, deadline=None, database=None,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

VALID = '''import random


class MutableEnv:
    def __init__(self, max_turns=5):
        self.max_turns = max_turns
        self.state = 0
        self.turn = 0

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.state = self.rng.randint(0, 9)
        self.turn = 0
        return f"state {self.state}", {"state": self.state}

    def step(self, action):
        self.turn += 1
        self.state += len(action) % 3
        done = self.state > 20
        truncated = self.turn >= self.max_turns
        reward = float(self.state % 2)
        return f"state {self.state} after {action[:20]!r}", reward, done, truncated, {"turn": self.turn}
'''
VALID_LINES = VALID.split("\n")

# Tokens that break syntax, types or control flow, but can never loop forever.
TOKENS = ["(", ")", "[", "]", "{", "}", ":", ",", ".", "'", '"', '"""', "\\", "\x00", "\t", "    ", "\n",
          "return", "return None", "raise", "yield", "lambda", "self", "None", "1/0", "del self.rng",
          "import os", "from . import x", "global", "async", "await", "pass", "class", "def", "=", "==",
          "not", "+", "*", "-", "@", "#", "é", "\ud800", "\u2028", "😀", "self.step(action)",
          "self.reset()", "float('nan')", "{1}", "b'x'", "print('noise')"]

ACTION_CHARACTERS = st.one_of(st.characters(), st.sampled_from(["\x00", "\ud800", "\udfff", "\u2028", "\ufeff",
                                                                "😀", "\\", '"', "\n", "\r", "{", "}"]))
SHORT_ACTIONS = st.text(alphabet=ACTION_CHARACTERS, max_size=300)
HUGE_ACTIONS = st.builds(lambda chunk, times: (chunk * times)[:100_000],
                         st.text(alphabet=ACTION_CHARACTERS, min_size=1, max_size=8), st.integers(1, 100_000))
ACTIONS = st.one_of(SHORT_ACTIONS, HUGE_ACTIONS)


@st.composite
def mutated_sources(draw: Any) -> str:
    lines = list(VALID_LINES)
    for _ in range(draw(st.integers(1, 4))):
        operation = draw(st.sampled_from(["delete", "insert", "duplicate", "swap", "replace_char"]))
        index = draw(st.integers(0, len(lines) - 1))
        if operation == "delete" and len(lines) > 1:
            del lines[index]
        elif operation == "insert":
            token = draw(st.one_of(st.sampled_from(TOKENS), st.text(max_size=6)))
            column = draw(st.integers(0, len(lines[index])))
            lines[index] = lines[index][:column] + token + lines[index][column:]
        elif operation == "duplicate":
            lines.insert(index, lines[index])
        elif operation == "swap":
            other = draw(st.integers(0, len(lines) - 1))
            lines[index], lines[other] = lines[other], lines[index]
        elif operation == "replace_char" and lines[index]:
            column = draw(st.integers(0, len(lines[index]) - 1))
            lines[index] = lines[index][:column] + draw(st.characters()) + lines[index][column + 1:]
    return "\n".join(lines)


def check_result(result: Any) -> None:
    """A successful call returns a well-formed, JSON-clean result."""
    if isinstance(result, ResetResult):
        assert isinstance(result.observation, str) and isinstance(result.info, dict)
    else:
        assert isinstance(result, StepResult)
        assert isinstance(result.observation, str) and isinstance(result.info, dict)
        assert isinstance(result.reward, float) and math.isfinite(result.reward)
        assert isinstance(result.terminated, bool) and isinstance(result.truncated, bool)


def play(harness: Any, source: str, actions: list[str]) -> list[Any]:
    """Open, reset and step; returns results and at most one EnvFault (the first), never raising."""
    outcomes: list[Any] = []
    env = None
    try:
        env = harness.run(harness.service.open(source))
        outcomes.append(harness.run(env.reset(seed=0)))
        for action in actions:
            outcomes.append(harness.run(env.step(action)))
    except EnvFault as exc:
        assert isinstance(exc.error.kind, ErrorKind), exc
        assert not exc.error.infrastructure, f"a generated source caused an infrastructure fault: {exc}"
        outcomes.append(exc)
    finally:
        if env is not None:
            harness.run(env.close())
    for outcome in outcomes:
        if not isinstance(outcome, EnvFault):
            check_result(outcome)
    assert harness.service.running, "the supervisor died"
    return outcomes


@PROPERTY_SETTINGS
@given(source=st.one_of(st.text(max_size=400), st.lists(st.sampled_from(TOKENS), max_size=60).map("".join)),
       action=SHORT_ACTIONS)
def test_random_text_sources(sandbox, source, action):
    """Random text as a source: a result or a classified EnvFault, never another exception."""
    play(sandbox, source, [action])


@PROPERTY_SETTINGS
@given(source=mutated_sources(), actions=st.lists(SHORT_ACTIONS, min_size=1, max_size=3))
def test_mutated_env_sources(sandbox, source, actions):
    """A valid env with random deletions/insertions/swaps: a result or a classified EnvFault."""
    play(sandbox, source, actions)


ECHO = '''
import hashlib


class EchoEnv:
    def reset(self, seed=None):
        return "ready", {}

    def step(self, action):
        digest = hashlib.sha256(action.encode("utf-8", "surrogatepass")).hexdigest()
        return action[:1000], float(len(action) % 7), len(action) > 50_000, False, {"len": len(action), "sha": digest}
'''


@PROPERTY_SETTINGS
@given(actions=st.lists(ACTIONS, min_size=1, max_size=3))
def test_random_actions_arrive_intact(sandbox, actions):
    """Any action (unicode, NULs, lone surrogates, up to 100k chars) reaches the env intact and echoes
    back; an echo holding a lone surrogate is the environment's bad return (the next prompt would be
    text a tokenizer refuses), and ends the play there."""
    outcomes = play(sandbox, ECHO, actions)
    assert not isinstance(outcomes[0], EnvFault), outcomes[0]
    for sent, result in zip(actions, outcomes[1:]):
        # Frames are JSON: a str holding a surrogate *pair* as two code points ('\ud800\udfff') arrives
        # as the one astral character JSON's \uXXXX\uXXXX means. Everything else arrives unchanged.
        action = json.loads(json.dumps(sent))
        if any("\ud800" <= c <= "\udfff" for c in action[:1000]):
            assert isinstance(result, EnvFault) and result.error.kind is ErrorKind.BAD_RETURN, result
            assert "lone surrogate" in result.error.message
            return
        assert not isinstance(result, EnvFault), result
        assert result.observation == action[:1000]
        assert result.reward == float(len(action) % 7) and result.terminated == (len(action) > 50_000)
        assert result.info == {"len": len(action),
                               "sha": hashlib.sha256(action.encode("utf-8", "surrogatepass")).hexdigest()}


LEAVES = st.sampled_from([
    "0", "1", "-1.5", "1e308", "10**400", "float('nan')", "float('inf')", "True", "None", "'text'", "''",
    "'\\x00'", "'\\ud800'", "b'bytes'", "{1, 2}", "object()", "len", "1j", "()", "[]", "{}", "'x' * 70_000",
    "list(range(200_000))", "Decimal('1.5')", "Fraction(1, 3)", "2**63",
])


def containers(children: Any) -> Any:
    return st.one_of(
        st.lists(children, max_size=3).map(lambda items: "[" + ", ".join(items) + "]"),
        st.lists(children, max_size=3).map(lambda items: "(" + "".join(i + ", " for i in items) + ")"),
        st.dictionaries(st.sampled_from(["'k'", "'a'", "1", "None", "(1, 2)", "2.5"]), children, max_size=3)
        .map(lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"),
    )


VALUES = st.recursive(LEAVES, containers, max_leaves=8)
INFOS = st.dictionaries(st.sampled_from(["'k'", "'a'", "1", "None", "2.5"]), VALUES, max_size=3) \
    .map(lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}")


def mostly(default: str, others: Any) -> Any:
    """Usually the valid default, sometimes a random value: so some calls succeed and some do not."""
    return st.one_of(st.just(default), st.just(default), st.just(default), others)


STEP_RETURNS = st.one_of(
    st.tuples(mostly("'obs'", VALUES), mostly("0.5", VALUES), mostly("False", VALUES), mostly("False", VALUES),
              mostly("{}", st.one_of(INFOS, VALUES))).map(lambda parts: "(" + ", ".join(parts) + ")"),
    VALUES,
)
RESET_RETURNS = mostly("('start', {})", st.one_of(INFOS.map(lambda v: f"('start', {v})"), VALUES))


@PROPERTY_SETTINGS
@given(reset_value=RESET_RETURNS,
       step_value=STEP_RETURNS)
def test_random_return_values(sandbox, reset_value, step_value):
    """reset/step returning random values: a well-formed result, or bad_return / not_serializable / ...."""
    source = (
        "from decimal import Decimal\nfrom fractions import Fraction\n\n"
        "class ValueEnv:\n"
        f"    def reset(self, seed=None):\n        return {reset_value}\n"
        f"    def step(self, action):\n        return {step_value}\n"
    )
    outcomes = play(sandbox, source, ["go"])
    if isinstance(outcomes[-1], EnvFault):
        assert outcomes[-1].error.kind in {
            ErrorKind.BAD_RETURN, ErrorKind.NOT_SERIALIZABLE, ErrorKind.OUTPUT_TOO_LARGE,
            ErrorKind.RESET_ERROR, ErrorKind.STEP_ERROR, ErrorKind.INIT_ERROR,
        }, outcomes[-1]
