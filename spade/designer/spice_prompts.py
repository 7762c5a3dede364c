"""The SPICE Challenger's prompt and the reading of its reply (``selfplay.env_source: spice``).

SPICE (arXiv 2510.24684) has the Challenger read one corpus document and pose a question with a
verifiable answer, either multiple choice or free form (an integer or an expression), which a
Reasoner then answers without the document. The wording here is this project's own (the paper's
template was not available to us): the document, the kind of question wanted, the requirement
that the question stand on its own (the Reasoner never sees the document) and have one
checkable answer, and a fixed reply format.

The reply format: ``<question>``, for multiple choice ``<options>`` (one option a line, ``A)``,
``B)``, ...), ``<answer>`` (the option letter, or the expression) and ``<evidence>`` (a sentence
copied from the document that supports the answer; :func:`parse_challenger_reply` reads it,
``selfplay.spice.grounding`` decides whether it is checked). The last occurrence of each tag
counts, so a Challenger that drafts before answering is read by its final version.

Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Message = dict[str, str]

KIND_WORDS = {
    "mcq": "a multiple-choice question with exactly {options} options, of which exactly one is correct",
    "free_form": "a question whose answer is a single number or a short mathematical expression",
}
_TAG = "<{0}>(.*?)</{0}>"
_OPTION = re.compile(r"^\s*\(?([A-Za-z])\s*[).:]\s*(.+?)\s*$")


def challenger_messages(document: str, kind: str, *, options: int = 4) -> list[Message]:
    """The Challenger's prompt for one document and one kind of question (``mcq`` or ``free_form``)."""
    what = KIND_WORDS[kind].format(options=options)
    letters = ", ".join(chr(ord("A") + i) for i in range(options))
    if kind == "mcq":
        layout = ("<question>the question</question>\n"
                  f"<options>\nA) first option\nB) second option\n... one line per option, lettered {letters}\n"
                  "</options>\n<answer>the letter of the correct option</answer>\n")
    else:
        layout = ("<question>the question</question>\n"
                  "<answer>the answer alone: a number or an expression such as 3/4, 2\\sqrt{3} or x^2+1</answer>\n")
    text = (
        "You set reasoning problems for a solver who will NOT see the text below.\n\n"
        f"=== Text ===\n{document}\n=== End of text ===\n\n"
        f"Using facts or relations stated in the text, write {what}.\n"
        "Rules:\n"
        "- The question must make sense on its own: state every fact, quantity or definition the solver needs, "
        "and never refer to \"the text\", \"the passage\" or \"the document\".\n"
        "- It must have one answer that the text supports and that can be checked exactly.\n"
        "- Make it demanding: it should take several steps of reasoning, not a lookup.\n\n"
        "Reply in exactly this format and nothing after it:\n"
        f"{layout}"
        "<evidence>one sentence copied word for word from the text that supports the answer</evidence>"
    )
    return [{"role": "user", "content": text}]


def self_check_messages(document: str, question_text: str) -> list[Message]:
    """The Challenger's own check (``grounding: self_answer``): its question, with the document in view."""
    text = (f"=== Text ===\n{document}\n=== End of text ===\n\n"
            f"Answer this question using the text above.\n\n{question_text}")
    return [{"role": "user", "content": text}]


@dataclass(frozen=True)
class ChallengerReply:
    """What a Challenger reply says, once read; ``problem`` names what is missing or malformed."""

    question: str = ""
    answer: str = ""
    options: tuple[str, ...] = ()
    evidence: str = ""
    problem: str | None = None


def last_tag(text: str, tag: str) -> str | None:
    found = re.findall(_TAG.format(tag), text, flags=re.DOTALL | re.IGNORECASE)
    return found[-1].strip() if found else None


def parse_options(block: str) -> tuple[tuple[str, ...], str | None]:
    """The options of an ``<options>`` block in letter order; a problem when they are not A, B, ... in order."""
    options, letters = [], []
    for line in block.splitlines():
        if not line.strip():
            continue
        found = _OPTION.match(line)
        if not found:
            return (), f"an option line is not lettered: {line.strip()[:60]!r}"
        letters.append(found.group(1).upper())
        options.append(found.group(2))
    expected = [chr(ord("A") + i) for i in range(len(letters))]
    if letters != expected:
        return (), f"options are lettered {''.join(letters) or 'nothing'}, expected {''.join(expected) or 'A, B, ...'}"
    return tuple(options), None


def parse_challenger_reply(reply: str, kind: str, *, options: int = 4) -> ChallengerReply:
    """The question, options, answer and evidence of a reply; ``problem`` set when it cannot be used."""
    question, answer, evidence = last_tag(reply, "question"), last_tag(reply, "answer"), last_tag(reply, "evidence")
    if not question:
        return ChallengerReply(problem="no <question>...</question>")
    if not answer:
        return ChallengerReply(question=question, problem="no <answer>...</answer>")
    parsed_options: tuple[str, ...] = ()
    if kind == "mcq":
        block = last_tag(reply, "options")
        if block is None:
            return ChallengerReply(question=question, answer=answer, problem="no <options>...</options>")
        parsed_options, problem = parse_options(block)
        if problem is not None:
            return ChallengerReply(question=question, answer=answer, problem=problem)
        if len(parsed_options) != options:
            return ChallengerReply(question=question, answer=answer,
                                   problem=f"{len(parsed_options)} options, expected {options}")
        if len({o.strip().lower() for o in parsed_options}) != len(parsed_options):
            return ChallengerReply(question=question, answer=answer, problem="two options are the same")
    return ChallengerReply(question=question, answer=answer, options=parsed_options, evidence=evidence or "")


def normalised(text: str) -> str:
    """Lower case, punctuation dropped, whitespace collapsed: how evidence is compared with the document."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def quote_in_document(evidence: str, document: str, min_words: int) -> str | None:
    """None when ``evidence`` (at least ``min_words`` words) occurs in ``document``; else the problem."""
    quote = normalised(evidence)
    if len(quote.split()) < min_words:
        return f"the evidence has {len(quote.split())} words, at least {min_words} needed"
    if quote not in normalised(document):
        return "the evidence is not in the document"
    return None
