"""The degenerate-policy probes' family (issues 23 and 40), pure standard library.

Every policy knows nothing of the game beyond its text: it copies, lists, echoes or counts what
the observations show, and never works out what the game asks. Policies come in families (the
name a rejection and a metric carry); each family is a way generated games go wrong, not a list
of games:

* ``constant``: the same reply every turn (``\\boxed{0}``, ``\\boxed{1}``, a huge and a negative
  number, empty, plain text);
* ``first_observation``: a number, word, quoted string or token of the first observation, every turn,
  or each of its values in turn, bare or in the rules' command template (a leaked secret);
* ``option``: an option letter (A-D), the first or last option listed, the options in order;
* ``command``: a command word the rules name (their ``\\boxed{...}`` examples first, then words such
  as done / submit / hint), every turn or each in turn;
* ``copy``: a number, word, quoted string or code-like token copied from the *latest* observation,
  preferring what it shows for the first time (a correction, a hint, a later reveal), alone or
  filled into a command template the rules show (``\\boxed{submit N}``);
* ``pairs``: two or three numbers of the latest observation (coordinates), every turn;
* ``scan``: 0, 1, 2, ... / 1, 2, 3, ... / the stated range from its low end / a, b, c, ...;
* ``bisect``: a binary search over the stated range (else 0-100) steered by comparison words in
  the feedback, read as said of the secret or of the guess; judged at :data:`SEARCH_THRESHOLD`
  (a game a blind search wins on only some seeds is a search game, not a leak);
* ``macro``: ask for help (hint / help / reveal ... as the rules name it), then copy what it printed,
  alone or in a command template;
* ``list``: one long reply listing every option, number, quoted string and word seen so far;
* ``echo``: the observation sent back: raw, boxed, three times, or the first one every turn;
* ``random``: a seeded random short reply, repeated or fresh every turn.

A policy returns None when it has nothing to say: on its first turn it then does not play that
seed, later it stops and the episode ends with what it earned.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import probe_text as text

SEARCH_THRESHOLD = 0.9
SEARCH_FAMILIES = frozenset({"bisect"})
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_LIST_LIMIT = 300  # items in one listing reply


@dataclass(frozen=True)
class ProbeView:
    """What a probe policy sees before its reply: the first and latest observations, its previous
    reply, a seeded rng, every observation and reply of the episode so far, and a scratch dict the
    policy may keep state in for the episode."""

    first_observation: str
    observation: str
    previous_action: Optional[str]
    rng: random.Random
    observations: tuple[str, ...] = ()
    replies: tuple[str, ...] = ()
    memory: dict[str, Any] = field(default_factory=dict)

    @property
    def turn(self) -> int:
        return len(self.replies)


@dataclass(frozen=True)
class ProbePolicy:
    name: str
    description: str
    act: Callable[[ProbeView], Optional[str]]  # None: nothing (more) to play
    constant: bool = False  # the same reply all episode: played once per (seed, reply)
    family: str = "constant"
    full_length: bool = False  # played to the last turn even when stuck (rewards for running out of turns)


def box(value: str) -> str:
    return "\\boxed{" + value + "}"


def _constant(reply: str) -> Callable[[ProbeView], str]:
    return lambda view: reply


def _first(values: Callable[[str], tuple[str, ...]], index: int) -> Callable[[ProbeView], Optional[str]]:
    def act(view: ProbeView) -> Optional[str]:
        found = values(view.first_observation)
        return box(found[index]) if -len(found) <= index < len(found) else None
    return act


def _in_order(values: Callable[[str], tuple[str, ...]]) -> Callable[[ProbeView], Optional[str]]:
    def act(view: ProbeView) -> Optional[str]:
        found = values(view.first_observation)
        return box(found[view.turn % len(found)]) if found else None
    return act


def _new(values: Callable[[str], tuple[str, ...]], view: ProbeView) -> list[str]:
    """The values of the latest observation that no earlier observation showed."""
    seen = text.seen_in(values, view.observations[:-1])
    return [v for v in values(view.observation) if v not in seen]


def _copy(values: Callable[[str], tuple[str, ...]], index: int, new: bool) -> Callable[[ProbeView], Optional[str]]:
    """A value of the latest observation (``new``: shown there first, else any), else the previous reply."""
    def act(view: ProbeView) -> Optional[str]:
        found = _new(values, view) if new else values(view.observation)
        if not found and new:
            found = values(view.observation)
        if -len(found) <= index < len(found):
            return box(found[index])
        return view.previous_action if view.turn else None
    return act


def _numbers_reply(count: int, last: bool, new: bool, template: str) -> Callable[[ProbeView], Optional[str]]:
    def act(view: ProbeView) -> Optional[str]:
        found = _new(text.numbers, view) if new else text.numbers(view.observation)
        if len(found) < count:
            found = text.numbers(view.observation)
        if len(found) < count:
            return view.previous_action if view.turn else None
        picked = found[-count:] if last else found[:count]
        return box(template.format(*picked) if template else " ".join(picked))
    return act


def _scan(start: Callable[[ProbeView], Optional[int]]) -> Callable[[ProbeView], Optional[str]]:
    def act(view: ProbeView) -> Optional[str]:
        first = start(view)
        return None if first is None else box(str(first + view.turn))
    return act


def _range_low(view: ProbeView) -> Optional[int]:
    stated = text.number_range(view.first_observation)
    return None if stated is None else stated[0]


def _bisect(about_guess: bool) -> Callable[[ProbeView], Optional[str]]:
    """Binary search over the stated range (else 0-100); past its ends the interval slides."""
    def act(view: ProbeView) -> Optional[str]:
        memory = view.memory
        if "low" not in memory:
            memory["low"], memory["high"] = text.number_range(view.first_observation) or (0, 100)
        elif "guess" in memory:
            guess, width = memory["guess"], max(2, memory["high"] - memory["low"])
            way = text.direction(view.observation, about_guess)
            if way == text.DOWN:
                memory["high"] = guess - 1
                if memory["high"] < memory["low"]:
                    memory["low"] = memory["high"] - width
            else:  # up, or no comparison word: move on above the guess
                memory["low"] = guess + 1
                if memory["low"] > memory["high"]:
                    memory["high"] = memory["low"] + width
        memory["guess"] = (memory["low"] + memory["high"]) // 2
        return box(str(memory["guess"]))
    return act


def _help_word(view: ProbeView) -> str:
    """The help-like command words the rules name, most telling first, taken in turn (else "hint")."""
    named = {c.lower() for c in text.commands(view.first_observation)}
    words = [w for w in text.HELP_WORDS if w in named] or ["hint"]
    return words[(view.turn // 2) % len(words)]


def _macro(read: Callable[[ProbeView], list[str]]) -> Callable[[ProbeView], Optional[str]]:
    """Ask for help on even turns, copy what the answer showed on odd ones."""
    def act(view: ProbeView) -> Optional[str]:
        if view.turn % 2 == 0:
            return box(_help_word(view))
        found = read(view)
        return box(found[0]) if found else box(_help_word(view))
    return act


def _template_values(view: ProbeView) -> Optional[str]:
    """A command template of the rules filled with the latest observation's values, what it shows
    for the first time first; the templates are taken in turn."""
    shapes = text.templates(view.first_observation)
    if not shapes:
        return None
    numbers = tuple(_new(text.numbers, view)) + text.numbers(view.observation)
    texts = tuple(_printed_text(view)) + text.code_tokens(view.observation) + text.words(view.observation)
    return box(text.fill(shapes[view.turn % len(shapes)], numbers, texts))


def _first_values(view: ProbeView) -> tuple[str, ...]:
    """Every value the first observation shows (code-like tokens, quoted strings, numbers, then
    uncommon words, each once), taken from both ends inwards: a leak is most often a banner at the
    start or a note at the end."""
    first = view.first_observation
    values = text.distinct([*text.code_tokens(first), *text.quoted(first), *text.numbers(first), *text.words(first)],
                           key=str.lower)
    ordered = []
    for low, high in zip(range(len(values)), range(len(values) - 1, -1, -1)):
        if low > high:
            break
        ordered += [values[high]] if low == high else [values[high], values[low]]
    return tuple(ordered)


def _values_in_order(templated: bool) -> Callable[[ProbeView], Optional[str]]:
    """The first observation's values one per turn, bare or filled into the rules' first command template."""
    def act(view: ProbeView) -> Optional[str]:
        values = _first_values(view)
        shapes = text.templates(view.first_observation)
        if not values or (templated and not shapes):
            return None
        value = values[view.turn % len(values)]
        if not templated:
            return box(value)
        return box(text.fill(shapes[0], (value,) if text.numbers(value) == (value,) else (), (value,)))
    return act


def _help_then_template(view: ProbeView) -> Optional[str]:
    if view.turn % 2 == 0:
        return box(_help_word(view))
    return _template_values(view) or box(_help_word(view))


def _printed_value(view: ProbeView) -> list[str]:
    return _new(text.numbers, view)


def _printed_text(view: ProbeView) -> list[str]:
    for values in (text.quoted, text.code_tokens, text.words):
        found = _new(values, view)
        if found:
            return found
    return []


def _echo(times: int, boxed: bool, first: bool = False) -> Callable[[ProbeView], Optional[str]]:
    def act(view: ProbeView) -> Optional[str]:
        shown = (view.first_observation if first else view.observation).strip()
        reply = "\n".join([shown] * times)
        return box(reply) if boxed else reply
    return act


def _listing(readers: tuple[Callable[[str], tuple[str, ...]], ...], joiner: str, boxed: bool,
             letters: bool = False) -> Callable[[ProbeView], Optional[str]]:
    def act(view: ProbeView) -> Optional[str]:
        shown = view.observations or (view.first_observation,)
        items = [item for read in readers for observation in shown for item in read(observation)]
        if letters:
            items += ["A", "B", "C", "D"]
        items = text.distinct(items, key=str.lower)[:_LIST_LIMIT]
        if not items:
            return None
        reply = joiner.join(items)
        return box(reply) if boxed else reply
    return act


def _random_short(rng: random.Random) -> str:
    body = str(rng.randrange(10)) if rng.random() < 0.5 else "".join(
        rng.choice(_LETTERS) for _ in range(rng.randint(1, 3)))
    return box(body) if rng.random() < 0.7 else body


def _options(view_text: str) -> tuple[str, ...]:
    return text.options(view_text)


def probe_policies() -> tuple[ProbePolicy, ...]:
    """The family, cheapest and most telling first (the step budget is spent in this order)."""
    P = ProbePolicy
    policies = [
        P("boxed_0", "always \\boxed{0}", _constant(box("0")), constant=True, full_length=True),
        P("boxed_1", "always \\boxed{1}", _constant(box("1")), constant=True, full_length=True),
        P("empty", "always the empty reply", _constant(""), constant=True, full_length=True),
        P("plain_text", "always 'I am not sure.'", _constant("I am not sure."), constant=True, full_length=True),
        P("boxed_big", "always \\boxed{999999}", _constant(box("999999")), constant=True),
        P("boxed_negative", "always \\boxed{-1}", _constant(box("-1")), constant=True),
    ]
    for i in range(3):
        policies.append(P(f"command_{i + 1}", f"always the command word #{i + 1} the rules name",
                          _first(text.commands, i), constant=True, family="command"))
    policies.append(P("commands_in_order", "the command words the rules name, one per turn", _in_order(text.commands),
                      family="command"))
    for i in range(4):
        policies.append(P(f"observation_number_{i + 1}", f"always the first observation's number #{i + 1}, boxed",
                          _first(text.numbers, i), constant=True, family="first_observation"))
    policies.append(P("observation_number_last", "always the first observation's last number, boxed",
                      _first(text.numbers, -1), constant=True, family="first_observation"))
    for name, index in (("first_1", 0), ("first_2", 1), ("last_1", -1), ("last_2", -2)):
        policies.append(P(f"observation_word_{name}", f"always the first observation's word "
                          f"({name.replace('_', ' #')}), boxed", _first(text.words, index), constant=True,
                          family="first_observation"))
    for letter in "ABCD":
        policies.append(P(f"option_{letter}", f"always \\boxed{{{letter}}}", _constant(box(letter)), constant=True,
                          family="option"))
    policies += [
        P("option_first", "always the first option listed", _first(_options, 0), constant=True, family="option"),
        P("option_last", "always the last option listed", _first(_options, -1), constant=True, family="option"),
        P("options_in_order", "the listed options, one per turn", _in_order(_options), family="option"),
        P("quoted_first", "always the first observation's first quoted string", _first(text.quoted, 0),
          constant=True, family="first_observation"),
        P("code_token_first", "always the first observation's first code-like token", _first(text.code_tokens, 0),
          constant=True, family="first_observation"),
        P("observation_values_in_order", "every value of the first observation, one per turn",
          _values_in_order(False), family="first_observation"),
        P("template_values_in_order", "the rules' command template filled with each value of the first "
          "observation in turn", _values_in_order(True), family="first_observation"),
    ]
    policies += [
        P("scan_0", "0, 1, 2, ... one per turn", _scan(lambda v: 0), family="scan"),
        P("scan_1", "1, 2, 3, ... one per turn", _scan(lambda v: 1), family="scan"),
        P("scan_range", "the stated range from its low end, one per turn", _scan(_range_low), family="scan"),
        P("scan_letters", "a, b, c, ... one per turn", lambda v: box(_LETTERS[v.turn % 26]), family="scan"),
        P("copy_new_number", "the first number the latest observation shows for the first time",
          _copy(text.numbers, 0, new=True), family="copy"),
        P("copy_new_number_last", "the last number the latest observation shows for the first time",
          _copy(text.numbers, -1, new=True), family="copy"),
        P("copy_last_number", "the latest observation's last number", _copy(text.numbers, -1, new=False),
          family="copy"),
        P("copy_new_word", "the first word the latest observation shows for the first time",
          _copy(text.words, 0, new=True), family="copy"),
        P("copy_last_word", "the latest observation's last word", _copy(text.words, -1, new=False), family="copy"),
        P("copy_quoted", "the latest observation's newest quoted string", _copy(text.quoted, -1, new=True),
          family="copy"),
        P("copy_code_token", "the latest observation's newest code-like token", _copy(text.code_tokens, -1, new=True),
          family="copy"),
        P("pair_first", "the latest observation's first two numbers", _numbers_reply(2, False, False, ""),
          family="pairs"),
        P("pair_last", "the latest observation's last two numbers", _numbers_reply(2, True, False, ""),
          family="pairs"),
        P("pair_new", "the first two numbers the latest observation shows for the first time",
          _numbers_reply(2, False, True, ""), family="pairs"),
        P("pair_parenthesised", "the latest observation's first two numbers as (x, y)",
          _numbers_reply(2, False, False, "({}, {})"), family="pairs"),
        P("triple_first", "the latest observation's first three numbers", _numbers_reply(3, False, False, ""),
          family="pairs"),
        P("pair_zero", "always 0 0", _constant(box("0 0")), constant=True, family="pairs"),
        P("bisect_secret", "binary search steered by comparison words said of the secret", _bisect(False),
          family="bisect"),
        P("bisect_guess", "binary search steered by comparison words said of the guess", _bisect(True),
          family="bisect"),
        P("copy_into_template", "a command template of the rules filled with the latest observation's values",
          _template_values, family="copy"),
        P("help_then_number", "ask for help, then copy the number it printed", _macro(_printed_value),
          family="macro"),
        P("help_then_text", "ask for help, then copy the quoted string, token or word it printed",
          _macro(_printed_text), family="macro"),
        P("help_then_template", "ask for help, then fill a command template of the rules with what it printed",
          _help_then_template, family="macro"),
        P("list_everything", "every option, number, quoted string, token and word seen, boxed, comma-separated",
          _listing((_options, text.quoted, text.numbers, text.code_tokens, text.words), ", ", True, letters=True),
          family="list"),
        P("list_everything_raw", "every number and word seen, space-separated",
          _listing((text.numbers, text.words), " ", False), family="list"),
        P("list_options", "every option listed and the letters A-D, boxed, comma-separated",
          _listing((_options,), ", ", True, letters=True), family="list"),
        P("list_numbers", "every number seen, boxed, space-separated", _listing((text.numbers,), " ", True),
          family="list"),
        P("echo_raw", "the latest observation sent back", _echo(1, False), family="echo"),
        P("echo_boxed", "the latest observation sent back, boxed", _echo(1, True), family="echo"),
        P("echo_repeated", "the latest observation three times", _echo(3, False), family="echo"),
        P("echo_first", "the first observation sent back every turn", _echo(1, False, first=True), constant=True,
          family="echo"),
    ]
    policies.append(P("repeat_previous", "a random short reply, then the same again",
                      lambda v: v.previous_action if v.previous_action is not None else _random_short(v.rng),
                      family="random"))
    policies.append(P("random_short", "a fresh random short reply every turn", lambda v: _random_short(v.rng),
                      family="random"))
    return tuple(policies)


def threshold_for(policy: ProbePolicy, threshold: float) -> float:
    """The mean return at which ``policy`` wins: the stage's threshold, or for a search family
    :data:`SEARCH_THRESHOLD` when that is higher."""
    return max(threshold, SEARCH_THRESHOLD) if policy.family in SEARCH_FAMILIES else threshold
