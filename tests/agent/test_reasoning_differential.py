"""spade's reasoning split against SGLang 0.5.23's own reasoning parser, on seeded random replies.

Every reply is read by ``spade.agent.reasoning.split`` and by SGLang's
``ReasoningParser(parser, force_reasoning=inside).parse_non_stream`` (``sglang/srt/parser/
reasoning_parser.py`` from the pinned wheel, ``make sglang-src``), and reported as SGLang's chat
response reports it (``serving_chat.py``: ``reasoning_content`` null when empty, ``content`` "" when
empty). The replies cover what thinking models write and what they write when they go wrong:
leading whitespace and new lines before ``<think>``, text before the tag, no closing tag, several
think blocks, tags and tool calls inside the reasoning or the answer, empty reasoning, cut-off tags,
replies to prompts that already opened ``<think>`` (``inside``), both parsers (``qwen3``, and
``deepseek-r1`` which is always inside).

A disagreement fails the test unless a category of ``DOCUMENTED`` claims it; each category has a
row in docs/fidelity.md ("Serving thinking models") saying why we differ. There is one: SGLang's
``qwen3`` ends reasoning that has no ``</think>`` at a ``<tool_call>``, ours keeps it reasoning. ``drop_leading_block``
(the action parser's and designer's reader) must give SGLang's ``qwen3`` content for a reply that
does not start inside reasoning, and ``ReasoningStream`` fed the reply in random pieces must add up
to ``split`` of the whole reply.
"""

from __future__ import annotations

import random
import types
from typing import Callable, NamedTuple, Optional

import pytest

import sglang_source
from spade.agent.reasoning import ReasoningStream, drop_leading_block, split

SEED = 45
CASES = 1200
PARSERS = ("qwen3", "deepseek-r1")

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
WORDS = ("Let me think.", "2 + 2 = 4", "\\boxed{4}", "The answer is 4.", "hmm", "ok", "x", "Maybe")
# fragments the random replies are made of: text, tags, tags cut short, look-alikes
FRAGMENTS = (*WORDS, "\n", "\n\n", " ", "<think>", "</think>", "<think>\n", "\n</think>\n\n", CALL,
             "<tool_call>", "<thi", "</thi", "<", "</", "think>", "<think/>", "<THINK>", "<answer>4</answer>")


class Reading(NamedTuple):
    reasoning: Optional[str]
    content: str


class Case(NamedTuple):
    kind: str
    text: str
    parser: str
    inside: bool


# ----------------------------------------------------------------------------- replies


def _words(rng: random.Random, most: int = 4) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, most)))


def _lead(rng: random.Random) -> str:
    return rng.choice(["", "", "\n", "\n\n", " ", "  \n", "\t", "Sure. ", "Okay\n"])


def _shaped(rng: random.Random) -> tuple[str, str]:
    """A reply of a named shape (the categories the issue lists)."""
    thought, answer = _words(rng), _words(rng)
    shapes: dict[str, Callable[[], str]] = {
        "block": lambda: f"<think>{thought}</think>\n\n{answer}",
        "lead-then-block": lambda: f"{_lead(rng)}<think>{thought}</think>{answer}",
        "text-before-tag": lambda: f"{_words(rng, 2)} <think>{thought}</think>{answer}",
        "unclosed": lambda: f"{_lead(rng)}<think>{thought}",
        "unclosed-call": lambda: f"<think>{thought}\n{CALL}\n{_words(rng, 2)}",
        "call-in-reasoning": lambda: f"{_lead(rng)}<think>{thought} {CALL} {thought}</think>\n\n{answer}",
        "call-after-reasoning": lambda: f"<think>{thought}</think>\n\n{CALL}",
        "several-blocks": lambda: f"<think>{thought}</think>{answer}<think>{_words(rng)}</think>{_words(rng)}",
        "repeated-open": lambda: "<think>" * rng.randint(2, 3) + f"{thought}</think>{answer}",
        "tags-in-answer": lambda: f"<think>{thought}</think>{answer} use <think> and </think> {answer}",
        "empty-reasoning": lambda: f"<think></think>{answer}" if rng.random() < 0.5 else "<think>\n\n</think>\n\n" + answer,
        "opened-by-prompt": lambda: f"{thought}\n</think>\n\n{answer}",  # the template wrote <think>\n
        "no-tags": lambda: answer,
        "close-only": lambda: f"{answer}</think>{answer}",
        "cut-tag": lambda: f"<think>{thought}" + rng.choice(["</", "</th", "</think", "<tool_", "<"]),
        "empty": lambda: "",
    }
    kind = rng.choice(sorted(shapes))
    return kind, shapes[kind]()


def replies(seed: int = SEED, count: int = CASES) -> list[Case]:
    """``count`` seeded replies: half of a named shape, half random fragment soup, each read by a
    parser with and without a prompt that opened the reasoning."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        if i % 2:
            kind, text = _shaped(rng)
        else:
            kind, text = "soup", "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 9)))
        parser = rng.choice(PARSERS)
        inside = rng.random() < 0.5 if parser == "qwen3" else True  # deepseek-r1 is always inside
        cases.append(Case(kind, text, parser, inside))
    return cases


def chunkings(rng: random.Random, text: str) -> list[list[str]]:
    """The text in random pieces (some empty), and one character at a time."""
    out = [list(text) or [""]]
    for _ in range(3):
        cuts = sorted(rng.choices(range(len(text) + 1), k=rng.randint(0, 8)))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
    return out


# ----------------------------------------------------------------------------- the readers


def spade_reading(case: Case) -> Reading:
    got = split(case.text, inside=case.inside)
    return Reading(got.reasoning, got.answer)


def sglang_reading(module: types.ModuleType, case: Case) -> Reading:
    parser = module.ReasoningParser(case.parser, stream_reasoning=False, force_reasoning=case.inside)
    reasoning, content = parser.parse_non_stream(case.text)
    return Reading(reasoning or None, content or "")


def streamed(case: Case, pieces: list[str]) -> Reading:
    stream = ReasoningStream(inside=case.inside)
    deltas = [stream.push(p, final=k == len(pieces) - 1) for k, p in enumerate(pieces)]
    reasoning = "".join(d.reasoning for d in deltas)
    return Reading(reasoning or None, "".join(d.answer for d in deltas))


class Category(NamedTuple):
    name: str
    fidelity_row: str  # the start of its row in docs/fidelity.md
    claims: Callable[[Case, Reading, Reading], bool]  # (case, spade's, SGLang's)


def _call_ends_unclosed_reasoning(case: Case, ours: Reading, theirs: Reading) -> bool:
    """``qwen3`` in reasoning with no ``</think>``: SGLang ends the reasoning at the first
    ``<tool_call>`` (content from the tag on), ours keeps all of it as reasoning."""
    body = case.text
    while body.startswith("<think>"):
        body = body[len("<think>"):]
    cut = body.find("<tool_call>")
    return (case.parser == "qwen3" and (case.inside or "<think>" in case.text) and "</think>" not in body
            and cut >= 0 and ours == Reading(body, "") and theirs == Reading(body[:cut] or None, body[cut:]))


# Disagreements we keep on purpose, each with its reason in docs/fidelity.md.
DOCUMENTED: tuple[Category, ...] = (
    Category("a <tool_call> ends unclosed qwen3 reasoning", "`<tool_call>` inside reasoning",
             _call_ends_unclosed_reasoning),
)


def differences(module: types.ModuleType, cases: list[Case],
                read: Callable[[Case], Reading] = spade_reading) -> list[tuple[Case, Reading, Reading]]:
    return [(case, ours, theirs) for case in cases
            if (ours := read(case)) != (theirs := sglang_reading(module, case))]


# ----------------------------------------------------------------------------- SGLang's code


@pytest.fixture(scope="module")
def sglang_parser() -> types.ModuleType:
    """SGLang's reasoning parser of the pinned wheel (``.sglang-src``), taken out of ``sys.modules``
    after the module's tests."""
    yield sglang_source.reasoning_parser()
    sglang_source.unload()


# ----------------------------------------------------------------------------- the tests


def test_the_replies_cover_every_shape_and_both_parsers():
    cases = replies()
    assert len(cases) >= 1000
    kinds = {c.kind for c in cases}
    assert {"lead-then-block", "text-before-tag", "unclosed", "several-blocks", "tags-in-answer",
            "empty-reasoning", "opened-by-prompt", "call-in-reasoning", "soup"} <= kinds
    assert {(c.parser, c.inside) for c in cases} == {("qwen3", False), ("qwen3", True), ("deepseek-r1", True)}
    assert sum(c.text.lstrip() != c.text and "<think>" in c.text for c in cases) > 50


def test_split_reads_every_reply_as_sglang_does(sglang_parser):
    found = differences(sglang_parser, replies())
    undocumented = [(case, ours, theirs) for case, ours, theirs in found
                    if not any(cat.claims(case, ours, theirs) for cat in DOCUMENTED)]
    assert not undocumented, "\n".join(f"{c.parser} inside={c.inside} {c.text!r}: spade {o}, SGLang {t}"
                                       for c, o, t in undocumented[:10])
    for category in DOCUMENTED:  # each still happens (else its row and classifier go)
        assert any(category.claims(*d) for d in found), category.name


def test_documented_categories_have_their_fidelity_row():
    fidelity = (sglang_source.REPO / "docs" / "fidelity.md").read_text()
    for category in DOCUMENTED:
        assert f"| {category.fidelity_row}" in fidelity, category.name


def test_the_issue_examples(sglang_parser):
    """Reasoning that does not start at the first character is separated (issue 45)."""
    for text in ("\n<think>Let me think.</think>Answer", " <think>Let me think.</think>Answer"):
        case = Case("issue", text, "qwen3", False)
        assert spade_reading(case) == sglang_reading(sglang_parser, case)
        assert spade_reading(case).content == drop_leading_block(text) == "Answer"
    # the tag stays in the reasoning when text came before it, as in SGLang
    assert split("\n<think>a</think>b", inside=False).reasoning == "\n<think>a"


def test_drop_leading_block_is_sglangs_qwen3_content(sglang_parser):
    for case in replies(seed=SEED + 1, count=400):
        plain = case._replace(parser="qwen3", inside=False)
        ours, theirs = spade_reading(plain), sglang_reading(sglang_parser, plain)
        assert drop_leading_block(case.text) == ours.content
        assert ours == theirs or any(cat.claims(plain, ours, theirs) for cat in DOCUMENTED), case.text


def test_any_chunking_of_the_stream_adds_up_to_the_whole_reply():
    rng = random.Random(SEED)
    for case in replies():
        whole = spade_reading(case)
        for pieces in chunkings(rng, case.text):
            assert streamed(case, pieces) == whole, (case, pieces)


def test_a_stream_sends_what_no_later_text_can_change():
    """What is held, and only that: a tag cut between pieces, text not yet known to be reasoning
    (no ``<think>`` so far), reasoning from a ``<tool_call>`` on until ``</think>`` or the end."""
    def push(stream: ReasoningStream, piece: str, final: bool = False) -> tuple[str, str]:
        delta = stream.push(piece, final=final)
        return delta.reasoning, delta.answer

    stream = ReasoningStream(inside=True)
    assert [push(stream, p) for p in ("Let me", " think.</th", "ink>\n\nAns", "wer")] == [
        ("Let me", ""), (" think.", ""), ("", "\n\nAns"), ("", "wer")]
    plain = ReasoningStream(inside=False)
    assert push(plain, "The answer") == ("", "") and push(plain, " is 4.", True) == ("", "The answer is 4.")
    late = ReasoningStream(inside=False)
    assert push(late, "Sure. ") == ("", "") and push(late, "<think>hm") == ("Sure. <think>hm", "")
    assert push(late, "</think>ok", True) == ("", "ok")
