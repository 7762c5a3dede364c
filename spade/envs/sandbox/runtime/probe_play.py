"""The degenerate-policy probes' family and their play loop (issue 23), pure standard library.

This module runs in two places: inside the sandboxed child, which plays every probe episode of a
candidate in one ``probe`` request (no round trip per step), and in the trainer
(:mod:`spade.envs.degenerate_probes`), which builds the request, reads the report, and finishes
the loop itself when the child was killed mid-probe. Both run this same code; the reply parser
(``spade.agent.actions.parse_action``) reaches the child as source (:mod:`.host_modules`).

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

The loop (:func:`play`): each policy in order plays each seed to the end of the turn budget or
until the game ends the episode, scored with :func:`episode_return`. A policy stops being played
once the seeds left cannot lift its mean to the threshold, one constant reply is played once per
seed, probing stops at the first policy whose mean reaches the threshold, and the step and time
budgets stop it early (the policies not reached are not judged). An environment fault (the game
raised, returned a bad value, or a call outlived its timeout) gives that episode return 0, and
every later call fails the same way, as the environment is discarded after a fault in training.
"""

from __future__ import annotations

import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .returns import episode_return

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


def cannot_reach(returns: list[float], threshold: float, seeds_left: int) -> bool:
    """Even a return of 1.0 on every seed left would keep the mean of ``returns`` below ``threshold``."""
    if not returns:
        return False
    return (sum(returns) + seeds_left * 1.0) / (len(returns) + seeds_left) < threshold


def reaches(returns: list[float], threshold: float) -> bool:
    """The mean of ``returns`` is at or above ``threshold`` (a winning policy)."""
    return bool(returns) and sum(returns) / len(returns) >= threshold


# -- the family --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeView:
    """What a probe policy sees before its reply."""

    first_observation: str
    observation: str
    previous_action: Optional[str]
    rng: random.Random


@dataclass(frozen=True)
class ProbePolicy:
    name: str
    description: str
    act: Callable[[ProbeView], Optional[str]]  # None: nothing to play on this seed
    constant: bool = False  # the same reply all episode: played once per (seed, reply)


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


def _pick(values: Callable[[str], list[str]], index: int) -> Callable[[ProbeView], Optional[str]]:
    def act(view: ProbeView) -> Optional[str]:
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


REFERENCE_POLICY = "reference_policy"


def reference_policy(reply: Callable[[str], str]) -> ProbePolicy:
    """The game's own ``reference_policy(observation)`` as a policy of this loop (the admission
    stage of that name, :mod:`spade.envs.reference_policy`); ``reply`` calls it and may raise
    :class:`EnvFailed`."""
    return ProbePolicy(REFERENCE_POLICY, "the game's own reference_policy(observation)",
                       lambda view: reply(view.observation))


# -- the loop ----------------------------------------------------------------------------------


class ProbeBudget:
    """The probes' shared allowance of step calls and wall-clock seconds; ``used`` counts the
    calls taken, ``exhausted`` says one was refused."""

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


class EnvFailed(Exception):
    """An environment fault in a probe episode: ``kind`` is an error kind (``step_error``, ``timeout``, ...)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


@dataclass(frozen=True)
class ProbePlan:
    """What one ``probe`` request plays: ``policies`` (names from :func:`probe_policies`, in
    order), ``seeds``, ``turns`` (each episode's turn budget), ``threshold``, the step and time
    budgets, and ``reset_timeout_s`` / ``step_timeout_s``: a call that takes longer is a
    ``timeout`` fault, as the per-call timeout makes it outside."""

    policies: tuple[str, ...]
    seeds: tuple[int, ...]
    turns: int
    threshold: float
    max_steps: int
    max_seconds: float
    reset_timeout_s: float
    step_timeout_s: float

    def to_json(self) -> dict[str, Any]:
        return {"policies": list(self.policies), "seeds": list(self.seeds), "turns": self.turns,
                "threshold": self.threshold, "max_steps": self.max_steps, "max_seconds": self.max_seconds,
                "reset_timeout_s": self.reset_timeout_s, "step_timeout_s": self.step_timeout_s}

    @classmethod
    def from_json(cls, data: Any) -> "ProbePlan":
        """Raises ValueError naming the field that is missing or of the wrong type."""
        if not isinstance(data, dict):
            raise ValueError("the probe plan must be an object")
        known = {p.name for p in probe_policies()} | {REFERENCE_POLICY}
        policies, seeds = data.get("policies"), data.get("seeds")
        if not isinstance(policies, list) or not all(isinstance(p, str) and p in known for p in policies):
            raise ValueError(f"policies must be a list of names from: {', '.join(sorted(known))}")
        if not isinstance(seeds, list) or not all(_is_int(s) for s in seeds):
            raise ValueError("seeds must be a list of integers")
        if not _is_int(data.get("turns")) or data["turns"] < 1 or not _is_int(data.get("max_steps")):
            raise ValueError("turns (>= 1) and max_steps must be integers")
        numbers = ("threshold", "max_seconds", "reset_timeout_s", "step_timeout_s")
        if not all(_is_real(data.get(name)) for name in numbers):
            raise ValueError(f"{', '.join(numbers)} must be finite numbers")
        return cls(tuple(policies), tuple(seeds), data["turns"], float(data["threshold"]), data["max_steps"],
                   float(data["max_seconds"]), float(data["reset_timeout_s"]), float(data["step_timeout_s"]))


# How an episode ended: the game ended it (terminated / truncated), the turn budget ran out
# (turns), a fault (reset_fault / step_fault / policy_fault: the reference policy failed; killed:
# the sandbox killed the child during this episode, whose steps are then not counted), the same
# constant reply was already played on this seed (same_reply), the policy had nothing to say
# (nothing_to_play), the budget ran out (budget).
UNPLAYED = ("nothing_to_play", "budget")


@dataclass(frozen=True)
class Episode:
    """One probe episode: its return (None when not played: ``ending`` in :data:`UNPLAYED`), how it
    ended, the steps it took, and for a constant policy the reply it played."""

    policy: str
    seed: int
    value: Optional[float]
    ending: str
    steps: int = 0
    reply: Optional[str] = None

    @property
    def fault(self) -> bool:
        return self.ending in ("reset_fault", "step_fault", "policy_fault", "killed")

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "seed": self.seed, "value": self.value, "ending": self.ending,
                "steps": self.steps, "reply": self.reply}

    @classmethod
    def from_json(cls, data: Any) -> "Episode":
        if not isinstance(data, dict) or not isinstance(data.get("policy"), str) or not _is_int(data.get("seed")) \
                or not (data.get("value") is None or _is_real(data.get("value"))) \
                or not isinstance(data.get("ending"), str) or not _is_int(data.get("steps")) \
                or not (data.get("reply") is None or isinstance(data.get("reply"), str)):
            raise ValueError("a probe episode record needs policy, seed, value, ending, steps and reply")
        value = None if data["value"] is None else float(data["value"])
        return cls(data["policy"], data["seed"], value, data["ending"], data["steps"], data["reply"])


@dataclass
class ProbeOutcome:
    """Everything a probe run found: the episodes in the order played, the step calls made,
    whether a budget ran out, and the first fault (kind, message), if any."""

    episodes: list[Episode] = field(default_factory=list)
    steps: int = 0
    budget_exhausted: bool = False
    fault: Optional[tuple[str, str]] = None

    def to_json(self) -> dict[str, Any]:
        return {"episodes": [e.to_json() for e in self.episodes], "steps": self.steps,
                "budget_exhausted": self.budget_exhausted,
                "fault": None if self.fault is None else {"kind": self.fault[0], "message": self.fault[1]}}


Reset = Callable[[int], str]  # seed -> first observation; raises EnvFailed
Step = Callable[[str], tuple[str, float, bool, bool]]  # action -> observation, reward, terminated, truncated


def play(plan: ProbePlan, reset: Reset, step: Step, parse: Callable[[str], str], *,
         prior: tuple[Episode, ...] = (), on_episode: Optional[Callable[[Episode], None]] = None,
         extra: tuple[ProbePolicy, ...] = ()) -> ProbeOutcome:
    """Play the plan (module docstring). ``prior``: episodes already played, taken in order
    instead of playing them again (finishing a run that was cut); ``on_episode`` sees each
    episode as it ends; ``extra``: policies beside the family (the reference policy)."""
    family = {policy.name: policy for policy in (*probe_policies(), *extra)}
    outcome = ProbeOutcome()
    budget = ProbeBudget(plan.max_steps, plan.max_seconds)
    played: dict[tuple[int, str], float] = {}  # (seed, constant reply) -> return
    pending = list(prior)
    for name in plan.policies:
        policy = family[name]
        returns: list[float] = []
        for position, seed in enumerate(plan.seeds):
            if cannot_reach(returns, plan.threshold, len(plan.seeds) - position):
                break
            if pending:
                episode = pending.pop(0)
                budget.left, budget.used = budget.left - episode.steps, budget.used + episode.steps
                budget.exhausted = budget.exhausted or episode.ending == "budget"
            else:
                episode = _episode(plan, policy, seed, reset, step, parse, budget, played, outcome)
                if on_episode is not None:
                    on_episode(episode)
            outcome.episodes.append(episode)
            if episode.value is None:
                if budget.exhausted:
                    break
                continue
            returns.append(episode.value)
            if episode.reply is not None:
                played[(seed, episode.reply)] = episode.value
        outcome.steps, outcome.budget_exhausted = budget.used, budget.exhausted
        if reaches(returns, plan.threshold) or budget.exhausted:
            break
    return outcome


def _episode(plan: ProbePlan, policy: ProbePolicy, seed: int, reset: Reset, step: Step, parse: Callable[[str], str],
             budget: ProbeBudget, played: dict[tuple[int, str], float], outcome: ProbeOutcome) -> Episode:
    rng = random.Random(f"{seed}:{policy.name}")
    try:
        first = reset(seed)
    except EnvFailed as failed:
        outcome.fault = outcome.fault or (failed.kind, failed.message)
        return Episode(policy.name, seed, 0.0, "reset_fault")
    observation, previous = first, None
    rewards: list[float] = []
    terminated, ending, steps = False, "turns", 0
    for _ in range(plan.turns):
        try:
            reply = policy.act(ProbeView(first, observation, previous, rng))
        except EnvFailed as failed:
            outcome.fault = outcome.fault or (failed.kind, failed.message)
            return Episode(policy.name, seed, 0.0, "policy_fault", steps)
        if reply is None:
            return Episode(policy.name, seed, None, "nothing_to_play", steps)
        if policy.constant and previous is None and (seed, reply) in played:
            return Episode(policy.name, seed, played[(seed, reply)], "same_reply", steps)
        if not budget.take():
            return Episode(policy.name, seed, None, "budget", steps)
        steps += 1
        try:
            observation, reward, terminated, truncated = step(parse(reply))
        except EnvFailed as failed:
            outcome.fault = outcome.fault or (failed.kind, failed.message)
            return Episode(policy.name, seed, 0.0, "step_fault", steps, reply if policy.constant else None)
        rewards.append(reward)
        previous = reply
        if terminated or truncated:
            ending = "terminated" if terminated else "truncated"
            break
    return Episode(policy.name, seed, episode_return(rewards, terminated), ending, steps,
                   previous if policy.constant else None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
