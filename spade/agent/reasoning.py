"""A thinking model's reasoning, separated from its answer (pure functions, no model).

The rules are those of SGLang's reasoning parser (``sgl-project/sglang``,
``python/sglang/srt/parser/reasoning_parser.py``: ``BaseReasoningFormatDetector``, with the
``qwen3`` and ``deepseek-r1`` detectors) and agree with vLLM's ``Qwen3ReasoningParser``:

* A reply is inside reasoning from its start when the parser forces it (``deepseek-r1``: DeepSeek-R1
  writes no opening tag) or when the prompt left a ``<think>`` open (``prompt_opens_reasoning``: the
  generation prompt of Qwen3-Thinking-2507 and DeepSeek-R1-0528 ends in ``<think>\\n``); otherwise a
  reply that begins with ``<think>`` opens it (Qwen3's hybrid models in thinking mode).
* Leading ``<think>`` tags are dropped. The text before the first ``</think>`` is the reasoning, the
  text after it the answer; neither is stripped of whitespace (Qwen3's answer usually starts with
  the two newlines it writes after ``</think>``).
* Inside reasoning with no ``</think>``: the reply was cut (or ended) there, so all of it is
  reasoning and the answer is empty.
* A reply that is not inside reasoning is all answer, ``<think>`` or not later on.

Where we differ from SGLang: SGLang's ``qwen3`` decides "inside from the start" from the request
(``enable_thinking`` not false) and a regex over the chat template, we from the rendered prompt
itself, which is what the model continues; and newer SGLang/vLLM ``qwen3`` parsers end reasoning at
a ``<tool_call>`` that comes before any ``</think>`` (a Qwen3.5 habit), which we do not: a tool call
inside the reasoning is part of the reasoning, in a stream as in a whole response.

``ReasoningStream`` applies the same rules to text that arrives in pieces: a piece that could be the
start of ``<think>`` (at the start) or of ``</think>`` (inside reasoning) is held until the next
piece decides, so the concatenated deltas equal the whole response's fields.
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
    """Separate a whole reply (module docstring); ``inside``: the reply starts inside reasoning."""
    if not (inside or text.startswith(OPEN)):
        return ReasoningSplit(None, text)
    while text.startswith(OPEN):
        text = text[len(OPEN):]
    reasoning, closed, answer = text.partition(CLOSE)
    if not closed:
        return ReasoningSplit(text or None, "")
    return ReasoningSplit(reasoning or None, answer)


def drop_leading_block(text: str) -> str:
    """``text`` without a leading ``<think>...</think>`` block (whitespace before it goes too); of an
    unclosed one only the tag goes, and what follows is kept (``split`` would call it all reasoning).
    How the agent's action parser and the designer's code extraction skip a thinking model's reasoning."""
    body = text.lstrip()
    if not body.startswith(OPEN):
        return text
    end = body.find(CLOSE)
    if end == -1:
        return body[len(OPEN):]
    return body[end + len(CLOSE):]


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    answer: str = ""


class ReasoningStream:
    """``split`` for text that arrives in pieces: ``push`` each piece (``final`` with the last one)
    and send what it returns."""

    def __init__(self, *, inside: bool) -> None:
        self._inside = inside
        self._state = "start"  # start (leading <think> tags may follow) | reasoning | answer
        self._held = ""

    def push(self, piece: str, *, final: bool = False) -> ReasoningDelta:
        out = ReasoningDelta()
        text = self._held + piece
        self._held = ""
        if self._state == "start":
            while text.startswith(OPEN):
                text, self._inside = text[len(OPEN):], True
            if text and OPEN.startswith(text) and not final:
                self._held = text  # could still become <think>
                return out
            if not text and not final:
                return out
            self._state = "reasoning" if self._inside else "answer"
        if self._state == "reasoning":
            reasoning, closed, rest = text.partition(CLOSE)
            if closed:
                out.reasoning, self._state, text = reasoning, "answer", rest
            else:
                keep = 0 if final else _partial_suffix(text, CLOSE)
                out.reasoning, self._held = text[:len(text) - keep], text[len(text) - keep:]
                return out
        out.answer = text
        return out


def _partial_suffix(text: str, tag: str) -> int:
    """How many trailing characters of ``text`` could begin ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0
