"""Formula reveal (SPEC 6: the share of physics environments whose opening observation states the
governing formula; 25% early -> 5% late). Two documented heuristics, each tested on positive and
negative examples (tests/analysis/test_analysis_detectors.py):

``is_physics(source, class_name)``
    The environment is physics-flavoured when its source and class name together use at least
    ``PHYSICS_MIN_TERMS`` (2) distinct physics stems from ``PHYSICS_STEMS`` (velocity, gravity,
    momentum, voltage, pendulum, ...), matched at the start of a word.

``states_formula(observation)``
    The opening observation (without the agent's instruction preamble and without the hint) states
    a formula when one of its clauses is an equation whose left side is a short symbol (``F``,
    ``KE``, ``v_0``, ``x(t)``) or a physical quantity's name, and whose right side combines
    variables rather than just giving a value:
    - symbols with an operator: ``v = u + a*t``, ``h = 1/2 g t^2``, ``d = speed * time``
      (right-side words must be short symbols, physics words or math functions, so an English
      clause like ``score = hits - misses`` does not count);
    - a product written by juxtaposition of symbol letters: ``F = ma``, ``E = mc^2``, ``V = IR``;
    - in words: ``force equals mass times acceleration`` (two of the three nouns physics words).
    Numbers with units (``4 m/s``, ``9.8 m/s^2``) count as values, not as variables, so
    ``speed = 4 m/s`` and ``mass = 3 kg`` state data, not a formula.

A model judge through the engine would be the next step; it is not part of this module.
"""

from __future__ import annotations

import re

PHYSICS_MIN_TERMS = 2
PHYSICS_STEMS = (
    "velocit", "accelerat", "gravit", "momentum", "kinetic", "friction", "projectile", "pendulum",
    "spring constant", "oscillat", "wavelength", "frequenc", "voltage", "resist", "ohm", "capacit",
    "circuit", "electric", "magnet", "thermal", "thermodynam", "buoyan", "torque", "angular",
    "orbit", "collision", "elastic", "newton", "joule", "watt", "refract", "photon", "radioactiv",
    "half-life", "viscos", "inclined plane", "displacement", "kinemat", "potential energy",
    "force", "mass", "energy", "pressure", "density", "heat capacity", "specific heat", "ideal gas",
    "speed of light", "free fall", "air resistance", "spring", "lens", "optic", "charge", "current",
)
PHYSICS_WORDS = {
    "force", "mass", "acceleration", "velocity", "speed", "distance", "time", "energy", "momentum",
    "power", "work", "pressure", "volume", "temperature", "density", "height", "gravity", "weight",
    "voltage", "current", "resistance", "charge", "frequency", "wavelength", "period", "displacement",
    "impulse", "torque", "area", "length", "radius", "angle", "heat", "kinetic", "potential",
}
MATH_FUNCTIONS = {"sin", "cos", "tan", "sqrt", "exp", "log", "ln", "abs", "pi"}
JUXTAPOSED_LETTERS = set("mavghtirnkxfpqcelwdsbuz")
STOPWORDS = {"the", "and", "for", "you", "are", "was", "not", "can", "has", "its", "one", "two", "all",
             "any", "but", "yes", "no", "is", "of", "to", "in", "on", "at", "an", "or", "if", "by", "be",
             "as", "it", "we", "so", "per", "off", "set", "get", "use", "let", "how", "who", "why", "now"}
_OPERATORS = set("*/^+-·×²³√")

_NUMBER_WITH_UNIT = re.compile(
    r"(?<![A-Za-z_])\d+(?:[.,]\d+)?(?:\s*(?:[a-zA-Zµ°Ω]{1,4})(?:\s*/\s*[a-zA-Z]{1,3})?(?:\s*\^?\s*[23²³])?)?(?![A-Za-z])")
_LHS = re.compile(r"(?:^|(?<=[\s(:;,]))([A-Za-zΔαβγδθλμρστωΩ][A-Za-z]{0,2}(?:_\w{1,3})?(?:\(\w\))?|[A-Za-z]{3,14})\s*=\s*([^=\n;]+)")
_TOKEN = re.compile(r"[A-Za-zΔαβγδθλμρστωΩ]+(?:_\w+)?|N|\\frac|[*/^+\-·×²³√]")
_WORD_FORM = re.compile(
    r"\b([a-z]+)\s+(?:equals|is equal to|=)\s+(?:the\s+)?([a-z]+)\s+"
    r"(?:times|multiplied by|divided by|over|plus|minus|[*×/·])\s+(?:the\s+)?([a-z]+)\b")
_PREAMBLE_END = "The game answers each action with a new observation until it ends."


def is_physics(source: str, class_name: str = "") -> bool:
    text = f"{class_name} {source}".lower()
    found = {stem for stem in PHYSICS_STEMS if re.search(r"(?<![a-z])" + re.escape(stem), text)}
    return len(found) >= PHYSICS_MIN_TERMS


def observation_of(opening: str) -> str:
    """The environment's own first observation inside the agent's opening message."""
    text = opening
    if _PREAMBLE_END in text:
        text = text.split(_PREAMBLE_END, 1)[1]
    return text.split("\n\nHINT:", 1)[0].strip()


def _symbolic(lhs: str, rhs: str) -> bool:
    rhs = re.split(r"(?<!\d)[.,](?!\d)|\?|!", rhs, maxsplit=1)[0]
    lhs_name = re.sub(r"\(\w\)$", "", lhs)
    lhs_symbol = len(lhs_name.split("_")[0]) <= 3
    if not lhs_symbol and lhs_name.lower() not in PHYSICS_WORDS:
        return False

    def variable(word: str) -> bool:
        base, lower = word.split("_")[0], word.lower()
        if lower in STOPWORDS:
            return False
        return len(base) <= 3 or lower in PHYSICS_WORDS or lower in MATH_FUNCTIONS

    # the formula is the right side up to where English resumes ("... to find the time")
    formula: list[str] = []
    for token in _TOKEN.findall(_NUMBER_WITH_UNIT.sub(" N ", rhs)):
        if token[0].isalpha() and token != "N" and not variable(token):
            break
        formula.append(token)
    words = [t for t in formula if t[0].isalpha() and t != "N"]
    operators = [t for t in formula if t in _OPERATORS or t == "\\frac"]
    if not words:
        return False
    if operators:
        return True
    # a product by juxtaposition: F = ma, V = IR (E = mc^2 has an operator already)
    return lhs_symbol and len(formula) == 1 and 2 <= len(words[0]) <= 3 \
        and all(c in JUXTAPOSED_LETTERS for c in words[0].lower())


def states_formula(observation: str) -> bool:
    text = observation_of(observation)
    for match in _LHS.finditer(text):
        if _symbolic(match.group(1), match.group(2)):
            return True
    for match in _WORD_FORM.finditer(text.lower()):
        nouns = [match.group(1), match.group(2), match.group(3)]
        if sum(1 for n in nouns if n in PHYSICS_WORDS) >= 2:
            return True
    return False
