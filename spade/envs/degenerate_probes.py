"""Degenerate-policy probes: admission's ``degenerate_probe`` stage (spade's addition, issue 23).

A fixed family of cheap policies that know nothing about the game plays a loaded environment to
the end on a few seeds, through the same sandboxed ``reset`` / ``step`` calls training uses. A
game in which one of them reaches a mean return at or above the threshold pays for something
other than skill (a reward for running out of turns, for an unparseable action, a secret shown in
the first observation, ...) and is rejected as ``degenerate_win``.

The family (names as they appear in reports):

* ``boxed_0``, ``boxed_1``, ``empty``, ``plain_text``: the same reply every turn;
* ``observation_number_1`` .. ``_4`` and ``observation_number_last``: the first four distinct
  numbers of the episode's first observation, and its last one, each replied every turn as
  ``\\boxed{N}``; ``observation_word_first_1``, ``_first_2``, ``_last_1``, ``_last_2``: the same
  for words (three letters or more, common English words left out). A policy with nothing to say
  on a seed (the observation shows fewer numbers) does not play that seed;
* ``repeat_previous``: a seeded random short reply, then that reply again every turn;
* ``random_short``: a fresh seeded random short reply every turn (a digit or one to three letters,
  boxed or not).

Each episode runs to the end of the turn budget (the game's own ``max_turns``, bounded by the run's)
or until the game ends it, and is scored with the episode return rule (the last reward, clipped
to [-1, 1], iff the episode terminated). An environment fault ends the episode with return 0, as
in training. Cheapness: a policy stops being played once the seeds left cannot lift its mean to
the threshold, one constant reply is played once per seed, and the probes stop at ``max_steps``
``step`` calls or ``max_seconds`` in all (the report says so; the policies not reached are not judged).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..agent.actions import parse_action
from .protocol import EnvFault, EnvInstance, InfrastructureFault, episode_return
from .runner import DEFAULT_MAX_TURNS, turn_budget

DEFAULT_THRESHOLD = 0.5
PROBE_SEEDS: tuple[int, ...] = (1, 2, 3)
DEFAULT_MAX_STEPS = 1000
DEFAULT_MAX_SECONDS = 15.0

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_WORD = re.compile(r"[A-Za-z]{3,}")
_COMMON = frozenset("""
the and for are but not you all any can had her was one our out has him his how its may new now
own see two way who did get let put say she too use from with this that have they will your what
when which their there then them than been were into more some such only also each here over just
like make most must very well while where would could should about after again other these those
reply replies guess number numbers turn turns left game answer boxed you're right wrong
""".split())
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class ProbeSettings:
    """``threshold``: a policy whose mean return reaches it wins (``selfplay.degenerate_threshold``);
    ``seeds``: the reset seeds each policy plays; ``max_steps``: ``step`` calls over all probes
    (``selfplay.degenerate_probe_steps``); ``max_seconds``: wall-clock time over all probes (a game
    with slow steps is then judged on the policies played, not timed out of admission)."""

    threshold: float = DEFAULT_THRESHOLD
    seeds: tuple[int, ...] = PROBE_SEEDS
    max_steps: int = DEFAULT_MAX_STEPS
    max_seconds: float = DEFAULT_MAX_SECONDS


@dataclass(frozen=True)
class ProbeView:
    """What a probe policy sees before its reply."""

    first_observation: str
    observation: str
    previous_action: str | None
    rng: random.Random


@dataclass(frozen=True)
class ProbePolicy:
    name: str
    description: str
    act: Callable[[ProbeView], str | None]  # None: nothing to play on this seed
    constant: bool = False  # the same reply all episode: played once per (seed, reply)


@dataclass
class PolicyResult:
    policy: str
    description: str
    returns: list[float] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    errors: int = 0  # episodes an environment fault ended (return 0)

    @property
    def mean_return(self) -> float | None:
        return sum(self.returns) / len(self.returns) if self.returns else None

    def cannot_reach(self, threshold: float, seeds_left: int) -> bool:
        """Even a return of 1.0 on every seed left would keep the mean below ``threshold``."""
        if not self.returns:
            return False
        return (sum(self.returns) + seeds_left * 1.0) / (len(self.returns) + seeds_left) < threshold

    def to_json(self) -> dict[str, Any]:
        mean = self.mean_return
        return {"policy": self.policy, "description": self.description,
                "mean_return": None if mean is None else round(mean, 4),
                "returns": [round(r, 4) for r in self.returns], "seeds": list(self.seeds), "errors": self.errors}


@dataclass
class ProbeReport:
    threshold: float
    turns: int  # the turn budget each episode had
    results: list[PolicyResult] = field(default_factory=list)
    steps: int = 0
    budget_exhausted: bool = False
    winner: PolicyResult | None = None

    def judge(self, result: PolicyResult, budget: ProbeBudget) -> bool:
        """After a policy's episodes: it is the winner when its mean return reaches the threshold.
        True when probing stops (a winner, or the budget ran out)."""
        mean = result.mean_return
        if mean is not None and mean >= self.threshold:
            self.winner = result
        self.steps, self.budget_exhausted = budget.used, budget.exhausted
        return self.winner is not None or budget.exhausted

    def to_json(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "turns": self.turns, "steps": self.steps,
                "budget_exhausted": self.budget_exhausted,
                "winner": None if self.winner is None else self.winner.policy,
                "policies": [result.to_json() for result in self.results]}

    def lines(self) -> list[str]:
        """One line per policy, for ``spade env check``."""
        out = []
        for result in self.results:
            mean = result.mean_return
            shown = (("not played: the probe budget ran out" if self.budget_exhausted and result is self.results[-1]
                      else "not played: the first observation shows no such value") if mean is None
                     else f"mean return {mean:+.3f} over {len(result.returns)} seed(s)")
            flag = "  <- wins" if result is self.winner else ""
            out.append(f"{result.policy:<26} {shown}{flag}")
        if self.budget_exhausted:
            out.append(f"(the probe budget ran out after {self.steps} steps: the policies after this one were not "
                       "played or judged)")
        return out


def _distinct(items: list[str], key: Callable[[str], str] = lambda s: s) -> list[str]:
    seen: set[str] = set()
    out = []
    for item in items:
        if key(item) not in seen:
            seen.add(key(item))
            out.append(item)
    return out


def observation_numbers(text: str) -> list[str]:
    return _distinct(_NUMBER.findall(text))


def observation_words(text: str) -> list[str]:
    return _distinct([w for w in _WORD.findall(text) if w.lower() not in _COMMON], key=str.lower)


def _pick(values: Callable[[str], list[str]], index: int) -> Callable[[ProbeView], str | None]:
    def act(view: ProbeView) -> str | None:
        found = values(view.first_observation)
        if not (-len(found) <= index < len(found)):
            return None
        return "\\boxed{" + found[index] + "}"
    return act


def _random_short(rng: random.Random) -> str:
    body = str(rng.randrange(10)) if rng.random() < 0.5 else "".join(
        rng.choice(_LETTERS) for _ in range(rng.randint(1, 3)))
    return "\\boxed{" + body + "}" if rng.random() < 0.7 else body


def _constant(reply: str) -> Callable[[ProbeView], str]:
    return lambda view: reply


def probe_policies() -> tuple[ProbePolicy, ...]:
    """The family, cheapest and most telling first (the step budget is spent in this order)."""
    policies = [
        ProbePolicy("boxed_0", "always \\boxed{0}", _constant("\\boxed{0}"), constant=True),
        ProbePolicy("boxed_1", "always \\boxed{1}", _constant("\\boxed{1}"), constant=True),
        ProbePolicy("empty", "always the empty reply", _constant(""), constant=True),
        ProbePolicy("plain_text", "always 'I am not sure.'", _constant("I am not sure."), constant=True),
    ]
    for i in range(4):
        policies.append(ProbePolicy(f"observation_number_{i + 1}",
                                    f"always the first observation's number #{i + 1}, boxed",
                                    _pick(observation_numbers, i), constant=True))
    policies.append(ProbePolicy("observation_number_last", "always the first observation's last number, boxed",
                                _pick(observation_numbers, -1), constant=True))
    policies.append(ProbePolicy("repeat_previous", "a random short reply, then the same again",
                                lambda v: v.previous_action if v.previous_action is not None else _random_short(v.rng)))
    policies.append(ProbePolicy("random_short", "a fresh random short reply every turn",
                                lambda v: _random_short(v.rng)))
    for name, index in (("first_1", 0), ("first_2", 1), ("last_1", -1), ("last_2", -2)):
        policies.append(ProbePolicy(f"observation_word_{name}", f"always the first observation's word "
                                    f"({name.replace('_', ' #')}), boxed", _pick(observation_words, index),
                                    constant=True))
    return tuple(policies)


class ProbeBudget:
    """The probes' shared allowance of step calls and wall-clock seconds (ProbeSettings.max_steps,
    max_seconds); ``used`` counts the calls taken, ``exhausted`` says one was refused."""

    def __init__(self, steps: int, seconds: float):
        self.left, self.used, self.exhausted = steps, 0, False
        self.deadline = time.monotonic() + seconds

    def take(self) -> bool:
        """One step call, if the step and time budgets allow it."""
        if self.left <= 0 or time.monotonic() > self.deadline:
            self.exhausted = True
            return False
        self.left, self.used = self.left - 1, self.used + 1
        return True


async def _episode(env: EnvInstance, policy: ProbePolicy, seed: int, turns: int, budget: ProbeBudget,
                   played: dict[tuple[int, str], float]) -> tuple[float, bool, str | None] | None:
    """(return, ended by an environment fault, the constant reply) of one episode; None when the
    policy has nothing to play on this seed or the budget ran out. A constant reply already played
    on this seed (``played``) is not played again."""
    rng = random.Random(f"{seed}:{policy.name}")
    try:
        first = await env.reset(seed=seed)
    except InfrastructureFault:
        raise
    except EnvFault:
        return 0.0, True, None
    observation, previous = first.observation, None
    rewards: list[float] = []
    terminated = False
    for _ in range(turns):
        reply = policy.act(ProbeView(first.observation, observation, previous, rng))
        if reply is None:
            return None
        if policy.constant and previous is None and (seed, reply) in played:
            return played[(seed, reply)], False, None
        if not budget.take():
            return None
        try:
            result = await env.step(parse_action(reply))
        except InfrastructureFault:
            raise
        except EnvFault:
            return 0.0, True, reply if policy.constant else None
        rewards.append(result.reward)
        previous, observation = reply, result.observation
        if result.terminated or result.truncated:
            terminated = result.terminated
            break
    return episode_return(rewards, terminated), False, previous if policy.constant else None


async def run_probes(env: EnvInstance, settings: ProbeSettings, *, max_turns: int | None = None) -> ProbeReport:
    """Play every probe policy on ``env`` (already loaded) and report each one's mean return; the
    first policy at or above the threshold is the winner (probing stops there)."""
    turns = turn_budget(max_turns or DEFAULT_MAX_TURNS, env.max_turns)
    report = ProbeReport(settings.threshold, turns)
    budget = ProbeBudget(settings.max_steps, settings.max_seconds)
    played: dict[tuple[int, str], float] = {}  # (seed, constant reply) -> return
    for policy in probe_policies():
        result = PolicyResult(policy.name, policy.description)
        report.results.append(result)
        for position, seed in enumerate(settings.seeds):
            if result.cannot_reach(settings.threshold, len(settings.seeds) - position):
                break
            outcome = await _episode(env, policy, seed, turns, budget, played)
            if outcome is None:
                if budget.exhausted:
                    break
                continue
            value, fault, reply = outcome
            result.returns.append(value)
            result.seeds.append(seed)
            result.errors += int(fault)
            if reply is not None:
                played[(seed, reply)] = value
        if report.judge(result, budget):
            break
    return report
