r"""SPICE's corpus-grounded questions behind the environment contract (:class:`~spade.envs.protocol.Sandbox`).

A SPICE "environment" (``selfplay.env_source: spice``) is not code but a :class:`QuestionSpec` in
JSON: the question the Challenger wrote from one corpus document, its kind (``mcq``: options
lettered A, B, ...; ``free_form``: an integer or expression), the options and the Challenger's
answer. The document itself is not part of it: the Reasoner answers without it (SPICE's
information asymmetry). :meth:`SpiceSandbox.open` builds a single-turn instance in this process
(the question is data, nothing of it runs):

* ``reset`` returns the question (and its options) with an instruction to answer in ``\boxed{}``;
* ``step`` reads the agent's ``\boxed{X}`` action (:func:`spade.agent.actions.parse_action`) and
  returns 1.0 when it is right, else 0.0, with ``terminated=True``: for ``mcq`` the letter must be
  the Challenger's; for ``free_form`` ``math-verify`` must find X equal to the Challenger's answer
  (:func:`answers_match`). A reply without a box, or cut at its token limit, scores 0.

Standard library only, but for ``math-verify`` (imported when an answer is checked).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any, Optional

from .protocol import EnvError, EnvFault, ErrorKind, ResetResult, Stage, StepResult

__all__ = ["KINDS", "QuestionSpec", "SpiceInstance", "SpiceSandbox", "answers_match", "boxed_answer",
           "letter_of", "math_answer_parses", "math_equal", "question_text"]

KINDS = ("mcq", "free_form")
_BOX = "\\boxed{"
_LETTER = re.compile(r"^\(?\s*([A-Za-z])\s*\)?(?:[.):]|\s|$)")


@dataclass(frozen=True)
class QuestionSpec:
    """One Challenger question (the ``source`` of its :class:`EnvSpec`, as JSON)."""

    kind: str
    question: str
    answer: str                    # mcq: the right option's letter; free_form: the expression
    options: tuple[str, ...] = ()  # mcq: the options' texts, lettered A, B, ... in this order
    document: str = ""             # the corpus record it was written from (a key, never the text)

    def to_source(self) -> str:
        return json.dumps({"spice": {**asdict(self), "options": list(self.options)}}, sort_keys=True)

    @classmethod
    def from_source(cls, source: str) -> "QuestionSpec":
        try:
            data = json.loads(source)["spice"]
            spec = cls(kind=str(data["kind"]), question=str(data["question"]), answer=str(data["answer"]),
                       options=tuple(str(o) for o in data.get("options", ())), document=str(data.get("document", "")))
        except (ValueError, KeyError, TypeError) as exc:
            raise EnvFault(EnvError(ErrorKind.PROTOCOL_ERROR, Stage.LOAD,
                                    f"not a spice question ({type(exc).__name__}: {exc})")) from None
        if spec.kind not in KINDS:
            raise EnvFault(EnvError(ErrorKind.PROTOCOL_ERROR, Stage.LOAD,
                                    f"spice question kind {spec.kind!r}; expected one of: {', '.join(KINDS)}"))
        return spec


def option_letter(index: int) -> str:
    return chr(ord("A") + index)


def question_text(spec: QuestionSpec) -> str:
    """What the Reasoner reads: the question, its options, and how to answer."""
    if spec.kind == "mcq":
        options = "\n".join(f"{option_letter(i)}) {text}" for i, text in enumerate(spec.options))
        return (f"{spec.question}\n\n{options}\n\nThink it through, then give the letter of the one correct "
                "option inside \\boxed{...}, e.g. \\boxed{A}; only the last box in your reply counts.")
    return (f"{spec.question}\n\nThink it through, then give the final answer (a number or a mathematical "
            "expression) inside \\boxed{...}; only the last box in your reply counts.")


def boxed_answer(action: str) -> str | None:
    r"""The content of an action ``\boxed{X}``; None for an action without a box."""
    action = action.strip()
    if action.startswith(_BOX) and action.endswith("}"):
        return action[len(_BOX):-1].strip()
    return None


_WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm|mathbf)\{(.*)\}$", re.DOTALL)


def letter_of(text: str) -> str | None:
    """An option letter at the start of ``text`` (``B``, ``(B)``, ``B)``, ``B. text``, ``\\text{B}``), upper-cased."""
    text = text.strip()
    wrapped = _WRAPPER.match(text)
    found = _LETTER.match((wrapped.group(1) if wrapped else text).strip())
    return found.group(1).upper() if found else None


_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{3,}")
_FUNCTIONS = frozenset({"sin", "cos", "tan", "cot", "sec", "csc", "log", "exp", "sqrt", "arcsin", "arccos", "arctan",
                        "sinh", "cosh", "tanh", "max", "min", "mod", "gcd", "lcm", "det", "inf", "infty"})


def math_answer_parses(answer: str) -> bool:
    """Whether ``answer`` is a number or expression: ``math-verify`` reads it as a mathematical object
    (not only as text) and, LaTeX commands aside, it has no word of three letters or more but a
    function's name (``math-verify`` reads a word as a product of symbols: "Paris" is not an answer here)."""
    from math_verify import parse

    if any(word.lower() not in _FUNCTIONS for word in _WORD.findall(_LATEX_COMMAND.sub(" ", answer))):
        return False
    try:
        parsed = parse(f"${answer}$")
    except Exception:  # noqa: BLE001  (math-verify's parser raises on some inputs)
        return False
    return bool(parsed) and not isinstance(parsed[0], str)


def math_equal(gold: str, answer: str) -> bool:
    """``math-verify``: is ``answer`` mathematically equal to ``gold``? (False when either fails to parse)"""
    from math_verify import parse, verify

    try:
        gold_parsed = parse(f"${gold}$")
        answer_parsed = parse(f"\\boxed{{{answer}}}")
        return bool(gold_parsed and answer_parsed and verify(gold_parsed, answer_parsed))
    except Exception:  # noqa: BLE001
        return False


def answers_match(spec: QuestionSpec, answer: str | None) -> bool:
    """Whether the Reasoner's boxed ``answer`` is the Challenger's (see the module docstring)."""
    if answer is None or not answer.strip():
        return False
    if spec.kind == "mcq":
        return letter_of(answer) == spec.answer.upper()
    return math_equal(spec.answer, answer)


class SpiceInstance:
    """One play of one question (single-turn; see the module docstring)."""

    max_turns: Optional[int] = 1

    def __init__(self, spec: QuestionSpec):
        self.spec = spec
        self.class_name = f"spice_{spec.kind}"
        self.done = False

    async def reset(self, seed: Optional[int] = None) -> ResetResult:
        self.done = False
        return ResetResult(question_text(self.spec), {"kind": self.spec.kind})

    async def step(self, action: str) -> StepResult:
        if self.done:
            raise EnvFault(EnvError(ErrorKind.STEP_ERROR, Stage.STEP, "the question was already answered"))
        self.done = True
        answer = boxed_answer(action)
        correct = answers_match(self.spec, answer)
        info: dict[str, Any] = {"correct": correct, "answered": answer is not None}
        return StepResult("", 1.0 if correct else 0.0, True, False, info)

    async def close(self) -> None:
        pass


class SpiceSandbox:
    """Where SPICE questions are played (a :class:`~spade.envs.protocol.Sandbox`, in process)."""

    async def open(self, source: str, *, max_turns: Optional[int] = None) -> SpiceInstance:
        return SpiceInstance(QuestionSpec.from_source(source))

    async def close(self) -> None:
        pass
