"""A thinking model's reasoning, separated from its answer (pure functions, no model).

The reading is that of SGLang 0.5.23's reasoning parser (``sglang/srt/parser/reasoning_parser.py``,
``BaseReasoningFormatDetector.detect_and_parse`` with the ``Qwen3Detector`` and
``DeepSeekR1Detector`` settings), checked against that code by
``tests/agent/test_reasoning_differential.py``:

* A reply is in reasoning when it starts inside it (``inside``: the prompt left a ``<think>`` open,
  ``prompt_opens_reasoning``; ``deepseek-r1`` always, as DeepSeek-R1 writes no opening tag) or when
  ``<think>`` occurs anywhere in it. Otherwise it is all answer.
* In reasoning, ``<think>`` tags at the very start are dropped (only there: ``"\\n<think>a</think>b"``
  has the reasoning ``"\\n<think>a"``). The text before the first ``</think>`` is the reasoning, the
  text after it the answer; nothing is stripped of whitespace.
* With no ``</think>`` at all the reply was cut (or ended) inside its reasoning: all of it is
  reasoning and the answer is empty.

There is one reading, ``_read``: ``split`` is it for a whole reply, ``drop_leading_block`` its answer
for a reply that does not start inside reasoning, and ``ReasoningStream`` sends, piece by piece, the
part of it that no later text can change, so the concatenated deltas equal ``split`` of the whole
text. The price of that in a stream: a reply not started inside reasoning is held until a
``<think>`` turns up or the reply ends, since a ``<think>`` anywhere makes the text before it
reasoning (SGLang's own stream sends such text as content at once, and so can read a reply otherwise
than its whole-reply parser does).

Where we differ from SGLang (docs/fidelity.md, "Serving thinking models"): its ``qwen3`` decides
"inside from the start" from the request (``enable_thinking`` not false) and a regex over the chat
template, we from the rendered prompt itself, which is what the model continues; and its ``qwen3``
ends reasoning that has no ``</think>`` at a ``<tool_call>`` (a Qwen3.5 habit), so a call written in
reasoning cut short becomes a real call. Ours stays reasoning: a call inside the reasoning is never
one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

OPEN = "<think>"
CLOSE = "</think>"
PARSERS: tuple[str, ...] = ("auto", "qwen3", "deepseek-r1", "none")
FORCED = frozenset({"deepseek-r1"})  # parsers whose replies are reasoning until </think>


def resolve_parser(name: str, chat_template: Any, key: str = "--reasoning-parser") -> str:
    """The parser to use: ``auto`` is ``qwen3`` for a chat template that writes ``<think>`` or
    ``</think>`` (its text, or any of a mapping of named templates; Qwen3's hybrid and thinking
    templates both do) and ``none`` otherwise. Errors name ``key``."""
    if name not in PARSERS:
        raise ValueError(f"{key}: {name!r} is not allowed; choose one of: {', '.join(PARSERS)}")
    if name != "auto":
        return name
    texts = list(chat_template.values()) if isinstance(chat_template, Mapping) else [chat_template]
    knows = any(isinstance(t, str) and (OPEN in t or CLOSE in t) for t in texts)
    return "qwen3" if knows else "none"


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether the rendered prompt ends inside a ``<think>`` block (its generation prompt opened
    one), so that the reply starts inside the reasoning."""
    return prompt.rstrip().endswith(OPEN)


def starts_inside(parser: str, prompt: str) -> bool:
    """Whether a reply to ``prompt`` is reasoning from its first character under ``parser``."""
    return parser in FORCED or prompt_opens_reasoning(prompt)


@dataclass(frozen=True)
class ReasoningSplit:
    """A reply's reasoning (``None`` when there is none) and its answer ("" when there is none)."""

    reasoning: Optional[str]
    answer: str


def split(text: str, *, inside: bool) -> ReasoningSplit:
    """Separate a whole reply (module docstring); ``inside``: the reply starts inside reasoning
    (``starts_inside``: always under ``deepseek-r1``)."""
    reasoning, answer = _read(text, inside=inside, final=True)
    return ReasoningSplit(reasoning or None, answer)


def drop_leading_block(text: str) -> str:
    """``text`` without its reasoning: ``split``'s answer for a reply that does not start inside
    reasoning (so a reply cut inside ``<think>`` leaves nothing). How the agent's action parser and
    the designer's code extraction skip a thinking model's reasoning."""
    return split(text, inside=False).answer


def _read(text: str, *, inside: bool, final: bool) -> tuple[str, str]:
    """(reasoning, answer) of ``text`` (module docstring). Not ``final``: ``text`` is the start of a
    reply, and what is returned are the parts that no continuation can change (prefixes of the
    whole reply's parts)."""
    if not (inside or OPEN in text):
        return ("", text) if final else ("", "")  # a later <think> would make it reasoning
    body = text
    while body.startswith(OPEN):
        body = body[len(OPEN):]
    if not final and OPEN.startswith(body):
        return "", ""  # more leading tags may follow
    reasoning, closed, answer = body.partition(CLOSE)
    if closed:
        return reasoning, answer
    keep = 0 if final else _partial_suffix(body, CLOSE)  # could still become </think>
    return body[:len(body) - keep], ""


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    answer: str = ""


class ReasoningStream:
    """``split`` for text that arrives in pieces: ``push`` each piece (``final`` with the last one)
    and send what it returns (module docstring)."""

    def __init__(self, *, inside: bool) -> None:
        self._inside = inside
        self._text = ""
        self._sent = (0, 0)  # characters of reasoning and of answer already returned

    def push(self, piece: str, *, final: bool = False) -> ReasoningDelta:
        self._text += piece
        reasoning, answer = _read(self._text, inside=self._inside, final=final)
        r, a = self._sent
        self._sent = (len(reasoning), len(answer))
        return ReasoningDelta(reasoning[r:], answer[a:])


def _partial_suffix(text: str, tag: str) -> int:
    """How many trailing characters of ``text`` could begin ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0
