"""What the probe policies read in an observation (issue 40), pure standard library.

Each reader takes one observation and returns the distinct values of one kind in the order they
appear: numbers, words, quoted strings, code-like tokens, listed options, the command words the
rules mention, a numeric range the rules state, and which way a comparison word in feedback
points. The probe family (:mod:`.probe_family`) builds its policies from these; they run inside
the sandboxed child, so they must stay cheap: each reader caches its answers, since the same
observation is read by many policies and turns.
"""

from __future__ import annotations

import functools
import re
from typing import Callable, Optional

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_WORD = re.compile(r"[A-Za-z]{3,}")
_COMMON = frozenset("""
the and for are but not you all any can had her was one our out has him his how its may new now
own see two way who did get let put say she too use from with this that have they will your what
when which their there then them than been were into more some such only also each here over just
like make most must very well while where would could should about after again other these those
reply replies guess number numbers turn turns left game answer boxed you're right wrong
""".split())
_QUOTED = re.compile(r"\"([^\"\n]{1,80})\"|'([^'\n]{1,80})'|`([^`\n]{1,80})`|“([^”\n]{1,80})”|‘([^’\n]{1,80})’"
                     r"|«([^»\n]{1,80})»")
# a token mixing letters with digits, underscores, dashes or inner capitals (ORD-1042, x_7, QX7, fooBar)
_CODE = re.compile(r"(?<![\w-])(?=[\w-]*[A-Za-z])(?:(?=[\w-]*\d)|(?=[\w-]*_)|(?=[A-Za-z]*[a-z][A-Z]))[\w-]{2,40}"
                   r"|(?<![\w-])[A-Z]{3,12}(?![\w-])")
_BOXED = re.compile(r"\\boxed\{([^{}\n]{1,60})\}")
# an option line: "A) text", "(b) text", "1. text", "- text", "* text"
_OPTION_LINE = re.compile(r"^\s*(?:\(?([A-Za-z]|\d{1,2})[).:]|[-*•])\s+(.{1,80}?)\s*$", re.MULTILINE)
_OPTION_INLINE = re.compile(r"(?:options?|choices?|choose|pick|one of|candidates?|either)\s*(?:are|is)?\s*[:\-]?\s*"
                            r"([^\n.?!]{3,200})", re.IGNORECASE)
_INLINE_SPLIT = re.compile(r"\s*(?:,|/|\||;|\bor\b)\s*")
_RANGE = re.compile(r"(?:between|from|in)\s+(-?\d+)\s*(?:and|to|-|–|\.\.)\s*(-?\d+)"
                    r"|\[\s*(-?\d+)\s*(?:,|-|\.\.)\s*(-?\d+)\s*\]|(-?\d+)\s*(?:-|–|\.\.)\s*(-?\d+)", re.IGNORECASE)
# command words a designer's rules name in passing, and the help-like ones a macro asks first
COMMANDS = ("done", "submit", "finish", "hint", "help", "answer", "solve", "check", "confirm", "reveal", "skip",
            "pass", "end", "stop", "quit", "ready", "yes", "accept", "claim", "win", "next", "continue", "start",
            "go", "look", "status", "show", "peek", "clue", "ask", "open", "unlock", "verify", "commit", "wait")
HELP_WORDS = ("hint", "help", "clue", "reveal", "status", "show", "peek", "look", "inspect", "check", "ask",
              "examine", "scan", "info", "debug", "map", "solve")
_COMMAND = re.compile(r"\b(" + "|".join(COMMANDS + ("inspect", "examine", "scan", "info", "debug", "map")) + r")\b",
                      re.IGNORECASE)
# feedback about a guess: the secret lies above it (UP) or below it (DOWN); "too X" phrases first
_TOO_LOW = re.compile(r"\btoo\s+(?:low|small|few|short|early|little|cold|light|young|soon)\b|\bnot\s+enough\b",
                      re.IGNORECASE)
_TOO_HIGH = re.compile(r"\btoo\s+(?:high|big|large|many|long|late|much|hot|heavy|old)\b|\bovershoot", re.IGNORECASE)
_SAYS_UP = re.compile(r"\b(?:higher|greater|larger|bigger|more|above|later|newer|after|increase|up|taller|"
                      r"heavier|warmer|hotter|younger)\b", re.IGNORECASE)
_SAYS_DOWN = re.compile(r"\b(?:lower|smaller|less|fewer|below|earlier|older|before|decrease|down|shorter|"
                        r"lighter|cooler|colder)\b", re.IGNORECASE)
UP, DOWN = 1, -1


def distinct(items: "list[str] | tuple[str, ...]", key: Callable[[str], str] = lambda s: s) -> tuple[str, ...]:
    seen: set[str] = set()
    out = []
    for item in items:
        if key(item) not in seen:
            seen.add(key(item))
            out.append(item)
    return tuple(out)


@functools.lru_cache(maxsize=512)
def numbers(text: str) -> tuple[str, ...]:
    return distinct(_NUMBER.findall(text))


@functools.lru_cache(maxsize=512)
def words(text: str) -> tuple[str, ...]:
    return distinct([w for w in _WORD.findall(text) if w.lower() not in _COMMON], key=str.lower)


@functools.lru_cache(maxsize=512)
def quoted(text: str) -> tuple[str, ...]:
    found = ["".join(groups).strip() for groups in _QUOTED.findall(text)]
    return distinct([q for q in found if q and "<" not in q])


@functools.lru_cache(maxsize=512)
def code_tokens(text: str) -> tuple[str, ...]:
    return distinct(_CODE.findall(text))


@functools.lru_cache(maxsize=512)
def boxed_examples(text: str) -> tuple[str, ...]:
    """The contents of ``\\boxed{...}`` examples in the rules, placeholders such as ``<action>`` left out."""
    return distinct([b.strip() for b in _BOXED.findall(text) if "<" not in b and "..." not in b and b.strip()])


_ANY_BOXED = re.compile(r"\\boxed\{([^{}\n]{1,60})\}")
# a placeholder in a command template: <anything>, or an all-capitals token such as N, NNNN, VALUE
_PLACEHOLDER = re.compile(r"<[^<>]{1,20}>|\b[A-Z][A-Z_]{0,11}\b")
_NUMERIC = re.compile(r"<?(?:N+|NUM|NUMBER|D|K|X|Y|Z|T|AMOUNT|Y+|COUNT|INDEX|INT|DIGITS?|GRAMS|YEAR)>?$", re.IGNORECASE)


@functools.lru_cache(maxsize=512)
def templates(text: str) -> tuple[str, ...]:
    """The rules' ``\\boxed{...}`` examples that hold a placeholder (``guess N``, ``key VALUE``,
    ``open <door>``), as written; a lone placeholder (``\\boxed{N}``) is no command template."""
    found = [b.strip() for b in _ANY_BOXED.findall(text)]
    return distinct([b for b in found if _PLACEHOLDER.search(b) and _PLACEHOLDER.sub("", b).strip(" ,")])


def fill(template: str, numbers_first: tuple[str, ...], texts_first: tuple[str, ...]) -> str:
    """``template`` with each placeholder replaced, in order, by the next value: a number for a
    numeric-looking placeholder (N, NNNN, <number>, X, ...), else a text value (a token, a quoted
    string or a word, then a number). When the values run out, a filler of the placeholder's shape
    (``111`` for ``NNN``, ``1``, ``a``): a first try that the game accepts as well-formed, so that
    its feedback comes."""
    numbers_left, texts_left = list(numbers_first), list(texts_first)

    def value(match: "re.Match[str]") -> str:
        placeholder = match.group()
        numeric = bool(_NUMERIC.match(placeholder))
        pool = numbers_left if numeric else (texts_left or numbers_left)
        if numeric and len(placeholder) > 1 and set(placeholder) == {"N"}:  # NNN: a value of that many digits
            sized = [v for v in pool if len(v.lstrip("-")) == len(placeholder)]
            if sized:
                pool.remove(sized[0])
                return sized[0]
        if pool:
            return pool.pop(0)
        if numeric:
            return "1" * len(placeholder) if set(placeholder) == {"N"} else "1"
        return "a"

    return _PLACEHOLDER.sub(value, template)


@functools.lru_cache(maxsize=512)
def options(text: str) -> tuple[str, ...]:
    """The options a text lists: one per line after a letter, digit or bullet, else the items of an
    inline list after "options:" / "choose" / "one of" (commas, slashes, bars or "or")."""
    lines = [body.strip() for _, body in _OPTION_LINE.findall(text)]
    if len(lines) >= 2:
        return distinct(lines)
    found = _OPTION_INLINE.search(text)
    if found is None:
        return ()
    items = [i.strip(" '\"`[]()") for i in _INLINE_SPLIT.split(found.group(1))]
    return distinct([i for i in items if i and len(i) <= 40])[:12]


def seen_in(values: Callable[[str], tuple[str, ...]], observations: tuple[str, ...]) -> set[str]:
    """Every value of one kind that any of ``observations`` shows (each read once, then cached)."""
    seen: set[str] = set()
    for observation in observations:
        seen.update(values(observation))
    return seen


@functools.lru_cache(maxsize=512)
def commands(text: str) -> tuple[str, ...]:
    """The command words a text names: its boxed examples first, then known command words it mentions."""
    named = [b for b in boxed_examples(text) if len(b.split()) <= 3]
    return distinct(list(named) + [w.lower() for w in _COMMAND.findall(text)], key=str.lower)


def number_range(text: str) -> Optional[tuple[int, int]]:
    """The first integer range a text states ("between 1 and 100", "from 0 to 50", "[1, 20]", "1-99")."""
    for found in _RANGE.finditer(text):
        values = [int(v) for v in found.groups() if v is not None]
        low, high = min(values), max(values)
        if high - low >= 2:
            return low, high
    return None


def direction(feedback: str, about_guess: bool = False) -> Optional[int]:
    """Which way the feedback points: UP when the secret lies above the guess. "too low" / "too
    high" phrases come first; a bare comparison word is read as said of the secret ("higher"), or
    with ``about_guess`` of the guess ("your guess is higher": DOWN). None when it has none."""
    if _TOO_LOW.search(feedback):
        return UP
    if _TOO_HIGH.search(feedback):
        return DOWN
    up, down = _SAYS_UP.search(feedback), _SAYS_DOWN.search(feedback)
    said = UP if up and (not down or up.start() < down.start()) else DOWN if down else None
    return None if said is None else -said if about_guess else said
