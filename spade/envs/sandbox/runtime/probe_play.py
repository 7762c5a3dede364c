"""The degenerate-policy probes' play loop (issues 23 and 40), pure standard library.

This module runs in two places: inside the sandboxed child, which plays every probe episode of a
candidate in one ``probe`` request (no round trip per step), and in the trainer
(:mod:`spade.envs.degenerate_probes`), which builds the request, reads the report, and finishes
the loop itself when the child was killed mid-probe. Both run this same code; the reply parser
(``spade.agent.actions.parse_action``) reaches the child as source (:mod:`.host_modules`).

The family of policies is :mod:`.probe_family` (its docstring lists them by family); the
winnability stage's policies (the game's ``solution()`` actions and its ``reference_policy``) and
the reference-policy stage's are played by this same loop.

The loop (:func:`play`): each policy in order plays each seed to the end of the turn budget or
until the game ends the episode, scored with :func:`episode_return`. A policy sees every
observation and reply of its episode so far. It stops being played once the seeds left cannot lift
its mean to its threshold (:func:`.probe_family.threshold_for`), one constant reply is played once
per seed, probing stops at the first policy whose mean reaches its threshold, and the step and
time budgets stop it early (the policies not reached are not judged). An environment fault (the
game raised, returned a bad value, or a call outlived its timeout) gives that episode return 0,
and every later call fails the same way, as the environment is discarded after a fault in training.
"""

from __future__ import annotations

import functools
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import probe_text
from .probe_family import ProbePolicy, ProbeView, box, probe_policies, threshold_for
from .returns import episode_return

DEFAULT_THRESHOLD = 0.5
PROBE_SEEDS: tuple[int, ...] = (1, 2, 3)
DEFAULT_MAX_STEPS = 4000
DEFAULT_MAX_SECONDS = 15.0


def observation_numbers(text: str) -> list[str]:
    return list(probe_text.numbers(text))


def observation_words(text: str) -> list[str]:
    return list(probe_text.words(text))


def cannot_reach(returns: list[float], threshold: float, seeds_left: int) -> bool:
    """Even a return of 1.0 on every seed left would keep the mean of ``returns`` below ``threshold``."""
    if not returns:
        return False
    return (sum(returns) + seeds_left * 1.0) / (len(returns) + seeds_left) < threshold


def reaches(returns: list[float], threshold: float) -> bool:
    """The mean of ``returns`` is at or above ``threshold`` (a winning policy)."""
    return bool(returns) and sum(returns) / len(returns) >= threshold


REFERENCE_POLICY = "reference_policy"
SOLUTION_POLICY = "solution"
OFFERED_REFERENCE = "offered_reference_policy"
WINNABILITY_POLICIES = (SOLUTION_POLICY, OFFERED_REFERENCE)


class NothingToPlay(Exception):
    """Raised by a policy that has nothing to play on this seed; ``ending`` says why (an
    :data:`UNPLAYED` ending)."""

    def __init__(self, ending: str, message: str = ""):
        super().__init__(message or ending)
        self.ending, self.message = ending, message


def reference_policy(reply: Callable[[str], str], name: str = REFERENCE_POLICY) -> ProbePolicy:
    """The game's own ``reference_policy(observation)`` as a policy of this loop (the admission
    stage of that name, :mod:`spade.envs.reference_policy`, and the winnability stage); ``reply``
    calls it and may raise :class:`EnvFailed` or :class:`NothingToPlay`."""
    return ProbePolicy(name, "the game's own reference_policy(observation)",
                       lambda view: reply(view.observation), family="winnability")


# A mean return at or above the threshold but below threshold + CONFIRM_MARGIN after a round of
# seeds (with 0.5 and 0.5: anything short of winning every seed) is played again on the next round,
# when the plan has one, and judged on all of them: a policy that wins one game in four would
# otherwise reach 0.5 on eight seeds one time in nine (a four-option quiz answered "A": measured
# 0.6% rejected with three rounds).
CONFIRM_MARGIN = 0.5
# A probe policy that sent the same reply and got the same observation this many times in a row is
# stuck: its episode ends there (but for the four that play every turn, boxed_0, boxed_1, empty and
# plain_text, so that rewards for running out of turns are seen). Numbers aside for a policy whose
# reply changes with what it reads; for a constant reply a changing number (a counter of presses)
# is progress and the episode goes on.
STUCK_REPEATS = 2
_DIGITS = re.compile(r"\d+")
_BOXED_ACTION = re.compile(r"\\boxed\{([^{}]*)\}")
MAX_SOLUTION_ACTIONS = 1000


def solution_actions(offered: Any) -> list[str]:
    """The actions in what ``solution()`` returned: a list or tuple of strings as they are; text with
    ``\\boxed{...}`` parts, those parts in order. Anything else is a description of the goal, not
    actions: :class:`NothingToPlay` (``no_actions``)."""
    if isinstance(offered, (list, tuple)) and offered and all(isinstance(a, str) for a in offered):
        return [str(a) for a in offered[:MAX_SOLUTION_ACTIONS]]
    if isinstance(offered, str):
        boxed = _BOXED_ACTION.findall(offered)
        if boxed:
            return [box(b.strip()) for b in boxed[:MAX_SOLUTION_ACTIONS]]
    shown = repr(offered)
    raise NothingToPlay("no_actions", f"solution() returned {shown[:120]}{'...' if len(shown) > 120 else ''}, "
                                      "not a list of actions or \\boxed{...} actions")


def solution_policy(actions: Callable[[], list[str]]) -> ProbePolicy:
    """The actions the game's ``solution()`` returns after each reset, played in order (the
    winnability stage); ``actions`` calls it and may raise :class:`EnvFailed` or
    :class:`NothingToPlay`. An action without a box is sent boxed, as the agent writes it."""
    def act(view: ProbeView) -> Optional[str]:
        if "actions" not in view.memory:
            view.memory["actions"] = actions()
        planned = view.memory["actions"]
        if view.turn >= len(planned):
            return None
        action = planned[view.turn]
        return action if "\\boxed" in action else box(action)
    return ProbePolicy(SOLUTION_POLICY, "the actions the game's solution() returns", act, family="winnability")


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
    screen_seeds: int = 0  # > 0: a policy with no positive return on this many first seeds is dropped
    round_seeds: int = 0  # > 0: seeds per round; a narrow win is confirmed on the next round (CONFIRM_MARGIN)

    def to_json(self) -> dict[str, Any]:
        return {"policies": list(self.policies), "seeds": list(self.seeds), "turns": self.turns,
                "threshold": self.threshold, "max_steps": self.max_steps, "max_seconds": self.max_seconds,
                "reset_timeout_s": self.reset_timeout_s, "step_timeout_s": self.step_timeout_s,
                "screen_seeds": self.screen_seeds, "round_seeds": self.round_seeds}

    @classmethod
    def from_json(cls, data: Any) -> "ProbePlan":
        """Raises ValueError naming the field that is missing or of the wrong type."""
        if not isinstance(data, dict):
            raise ValueError("the probe plan must be an object")
        known = {p.name for p in probe_policies()} | {REFERENCE_POLICY, *WINNABILITY_POLICIES}
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
        screen, rounds = data.get("screen_seeds", 0), data.get("round_seeds", 0)
        if not all(_is_int(v) and v >= 0 for v in (screen, rounds)):
            raise ValueError("screen_seeds and round_seeds must be integers >= 0")
        return cls(tuple(policies), tuple(seeds), data["turns"], float(data["threshold"]), data["max_steps"],
                   float(data["max_seconds"]), float(data["reset_timeout_s"]), float(data["step_timeout_s"]), screen,
                   rounds)


# How an episode ended: the game ended it (terminated / truncated), the turn budget ran out
# (turns), a fault (reset_fault / step_fault / policy_fault: the reference policy failed; killed:
# the sandbox killed the child during this episode, whose steps are then not counted), the same
# constant reply was already played on this seed (same_reply), the policy had nothing to say
# (nothing_to_play), the budget ran out (budget).
# A winnability policy with no actions to play: no_actions (solution() gave a description, not
# actions), no_method (no solution() / reference_policy()). stopped: the policy had nothing more to
# say mid-episode (a solution's actions ran out), scored as the episode stands; stuck: the same
# reply got the same observation STUCK_REPEATS times in a row (:func:`_episode`).
UNPLAYED = ("nothing_to_play", "budget", "no_actions", "no_method")


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
    parse = functools.lru_cache(maxsize=4096)(parse)  # many policies send the same reply, turn after turn
    outcome = ProbeOutcome()
    budget = ProbeBudget(plan.max_steps, plan.max_seconds)
    played: dict[tuple[int, str], float] = {}  # (seed, constant reply) -> return
    firsts: dict[int, str] = {}  # seed -> its first observation
    pending = list(prior)
    for name in plan.policies:
        policy = family[name]
        threshold = threshold_for(policy, plan.threshold)
        returns: list[float] = []
        round_end = plan.round_seeds or len(plan.seeds)
        for position, seed in enumerate(plan.seeds):
            if position == round_end:  # a round judged: a narrow win is played again on the next round
                if not reaches(returns, threshold) or sum(returns) / len(returns) >= threshold + CONFIRM_MARGIN:
                    break
                round_end += plan.round_seeds
            if cannot_reach(returns, threshold, round_end - position):
                break
            if plan.screen_seeds and position == plan.screen_seeds and not any(r > 0 for r in returns):
                break  # screened out: nothing earned on the first seeds
            if pending:
                episode = pending.pop(0)
                budget.left, budget.used = budget.left - episode.steps, budget.used + episode.steps
                budget.exhausted = budget.exhausted or episode.ending == "budget"
            else:
                episode = _episode(plan, policy, seed, reset, step, parse, budget, played, outcome, firsts)
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
        if reaches(returns, threshold) or budget.exhausted:
            break
    return outcome


def _episode(plan: ProbePlan, policy: ProbePolicy, seed: int, reset: Reset, step: Step, parse: Callable[[str], str],
             budget: ProbeBudget, played: dict[tuple[int, str], float], outcome: ProbeOutcome,
             firsts: dict[int, str]) -> Episode:
    rng = random.Random(f"{seed}:{policy.name}")
    if policy.constant and seed in firsts and outcome.fault is None:
        # a constant reply is a function of the first observation alone (the same for every reset of
        # this seed): with nothing to say, or a reply this seed has already scored, no reset is needed
        known = firsts[seed]
        reply = policy.act(ProbeView(known, known, None, rng))
        if reply is None:
            return Episode(policy.name, seed, None, "nothing_to_play")
        if (seed, reply) in played:
            return Episode(policy.name, seed, played[(seed, reply)], "same_reply")
    try:
        first = reset(seed)
    except EnvFailed as failed:
        outcome.fault = outcome.fault or (failed.kind, failed.message)
        return Episode(policy.name, seed, 0.0, "reset_fault")
    firsts[seed] = first
    observation, previous = first, None
    observations, replies, memory = [first], [], {}
    repeats, last_shape = 0, None
    rewards: list[float] = []
    terminated, ending, steps = False, "turns", 0
    for _ in range(plan.turns):
        try:
            view = ProbeView(first, observation, previous, rng, tuple(observations), tuple(replies), memory)
            reply = policy.act(view)
        except EnvFailed as failed:
            outcome.fault = outcome.fault or (failed.kind, failed.message)
            return Episode(policy.name, seed, 0.0, "policy_fault", steps)
        except NothingToPlay as nothing:
            return Episode(policy.name, seed, None, nothing.ending, steps, nothing.message or None)
        if reply is None and steps:
            ending = "stopped"
            break
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
        shape = (reply, observation if policy.constant else _DIGITS.sub("#", observation))
        repeats = repeats + 1 if shape == last_shape else 0
        last_shape = shape
        previous = reply
        observations.append(observation)
        replies.append(reply)
        if terminated or truncated:
            ending = "terminated" if terminated else "truncated"
            break
        if repeats >= STUCK_REPEATS and not policy.full_length and policy.family != "winnability":
            ending = "stuck"
            break
    return Episode(policy.name, seed, episode_return(rewards, terminated), ending, steps,
                   previous if policy.constant else None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
