"""Turning a stream of generated token ids into the text deltas of a streamed response.

``ChoiceText`` follows one choice: token ids (``GenerationChunk``s) in, text deltas out, such that
the concatenated deltas equal the text the non-streamed response would carry for the same ids:

* ``IncrementalDecoder`` decodes a sliding window of the last few ids and holds text back while
  it ends in U+FFFD (an incomplete UTF-8 sequence: the next token completes the character); at
  the end the whole completion is decoded once more and anything the window missed is sent.
* ``StopMatcher`` cuts the text at the first ``stop`` string even when a stop string arrives
  split over several deltas: text that could be the start of a stop string is held until the
  next delta decides. A stop string ends the choice at once (the engine stream is closed, which
  stops the generation).
* A token that ends a completion (EOS or a stop token id) is held until the next token shows it
  was not the last one; a final one is dropped, as the non-streamed text drops it.

``ToolCallStream`` sits after ``ChoiceText`` for chat requests with ``tools``: content outside
``<tool_call>`` blocks streams as it comes; the text of a block is held until its
``</tool_call>`` arrives and then becomes one ``tool_calls`` delta carrying the whole call (name
and arguments), the way OpenAI streams a call, except that the arguments are not split over
several deltas. A malformed block, or one left open at the end, is sent as content.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from spade.agent import tool_calls as tool_parser

REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """Token ids in, new text out, never splitting a multi-byte character.

    ``push`` decodes ``ids[start:]`` and ``ids[start:mark]`` and returns the difference, where
    ``mark`` is where the last emitted text ended and ``start`` the mark before it: the one token
    of left context lets tokenizers that drop a word's leading space at the start of a decode
    (SentencePiece) decode the new token as it reads inside the whole text.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self.text = ""  # everything emitted so far
        self._start = 0
        self._mark = 0

    def push(self, ids: Sequence[int]) -> str:
        self.ids.extend(ids)
        if len(self.ids) == self._mark:
            return ""
        before = self._decode(self.ids[self._start:self._mark])
        now = self._decode(self.ids[self._start:])
        if len(now) <= len(before) or now.endswith(REPLACEMENT) or not now.startswith(before):
            return ""  # nothing yet, an unfinished character, or a decode that rewrote its context
        self._start, self._mark = self._mark, len(self.ids)
        return self._emit(now[len(before):])

    def finish(self) -> str:
        """The rest: the whole completion's decode minus what was emitted."""
        whole = self._decode(self.ids)
        self._start = self._mark = len(self.ids)
        if whole.startswith(self.text):
            return self._emit(whole[len(self.text):])
        return ""  # cannot take back what was sent; does not happen with byte-level or SP decoders

    def _emit(self, piece: str) -> str:
        self.text += piece
        return piece


class StopMatcher:
    """Cuts a text that arrives in pieces at its first occurrence of any stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self._held = ""
        self.stopped = False

    def push(self, piece: str) -> str:
        """The text that can be sent now (``stopped`` is set once a stop string was found)."""
        if self.stopped:
            return ""
        text = self._held + piece
        if not self.stops:
            self._held = ""
            return text
        found = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        pending = self._partial_start(text)
        if found >= 0 and (pending is None or pending >= found):
            self.stopped = True
            self._held = ""
            return text[:found]
        # a longer stop string starting earlier might still complete: wait for it
        cut = len(text) if pending is None else pending
        self._held = text[cut:]
        return text[:cut]

    def finish(self) -> str:
        """At the end no partial match can complete: the first full match cuts, or all is sent."""
        if self.stopped:
            return ""
        text, self._held = self._held, ""
        found = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if found >= 0:
            self.stopped = True
            return text[:found]
        return text

    def _partial_start(self, text: str) -> Optional[int]:
        """The first position from which the rest of ``text`` is a proper prefix of a stop string."""
        longest = max(len(s) for s in self.stops)
        for position in range(max(0, len(text) - longest + 1), len(text)):
            rest = text[position:]
            if any(len(rest) < len(s) and s.startswith(rest) for s in self.stops):
                return position
        return None


@dataclass
class TokenLogprob:
    token: str
    logprob: float


@dataclass
class Delta:
    """What one step of a choice adds: text, the log-probs of the tokens it covers, and (on the
    last delta) the finish reason."""

    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: Optional[str] = None


class ChoiceText:
    """One choice's text as its tokens arrive (module docstring). ``end_ids`` are the ids that end
    a completion (EOS and stop token ids); ``stops`` the stop strings; with ``logprobs`` each
    delta carries the log-probs of the tokens whose text it completes."""

    def __init__(self, decode: Callable[[Sequence[int]], str], *, end_ids: frozenset[int],
                 stops: Sequence[str], logprobs: bool) -> None:
        self._decode = decode
        self.decoder = IncrementalDecoder(decode)
        self.matcher = StopMatcher(stops)
        self.end_ids = end_ids
        self.want_logprobs = logprobs
        self.generated = 0  # every id the engine produced (usage counts them all)
        self.sent = 0  # characters of text sent
        self._held_end: Optional[tuple[int, float]] = None
        self._tokens: list[TokenLogprob] = []  # kept tokens whose log-prob is not sent yet
        self._covered = 0  # characters of text the sent log-probs' tokens cover

    @property
    def stopped(self) -> bool:
        """A stop string was found: the choice is complete, generation can stop."""
        return self.matcher.stopped

    def push(self, ids: Sequence[int], logprobs: Sequence[float]) -> Delta:
        self.generated += len(ids)
        kept: list[tuple[int, float]] = []
        for pair in zip(ids, logprobs):
            if self._held_end is not None:
                kept.append(self._held_end)
                self._held_end = None
            if pair[0] in self.end_ids:
                self._held_end = pair
            else:
                kept.append(pair)
        if self.stopped:
            return Delta()
        self._keep(kept)
        text = self.matcher.push(self.decoder.push([t for t, _ in kept]))
        return self._delta(text, final=False)

    def finish(self, finish_reason: str) -> Delta:
        """The last delta. ``finish_reason`` is the engine's; a stop string makes it "stop"."""
        if not self.stopped:
            if self._held_end is not None and finish_reason != "stop":
                self._keep([self._held_end])
                self.decoder.push([self._held_end[0]])
            self._held_end = None
            text = self.matcher.push(self.decoder.finish())
            text += self.matcher.finish()
        else:
            text = ""
        delta = self._delta(text, final=True)
        delta.finish_reason = "stop" if self.stopped else finish_reason
        return delta

    def _keep(self, kept: list[tuple[int, float]]) -> None:
        if self.want_logprobs:
            self._tokens += [TokenLogprob(self._decode([t]), lp) for t, lp in kept]

    def _delta(self, text: str, *, final: bool) -> Delta:
        self.sent += len(text)
        released: list[TokenLogprob] = []
        if self._tokens:
            # a token's log-prob goes with the delta that completes its text; at the end every
            # kept token's goes, unless a stop string cut the text (then the tokens past the cut
            # are left out, as in the non-streamed response)
            while self._tokens and (
                    self._covered + len(self._tokens[0].token) <= self.sent
                    or (final and not self.stopped)):
                self._covered += len(self._tokens[0].token)
                released.append(self._tokens.pop(0))
            if final:
                self._tokens.clear()
        return Delta(text, released)


@dataclass
class ToolDelta:
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)


class ToolCallStream:
    """Content and tool calls from text deltas (module docstring). Whitespace right before a
    block and at the very end is held, so that ``content`` is stripped around calls as in the
    non-streamed message."""

    def __init__(self, tools: Optional[Sequence[Mapping[str, Any]]],
                 new_call_id: Callable[[], str]) -> None:
        self.tools = tools
        self.new_call_id = new_call_id
        self.calls = 0
        self._text = ""  # unsent: outside a block, or a block being read
        self._inside = False
        self._space = ""  # trailing whitespace held back

    def push(self, piece: str, *, final: bool = False) -> ToolDelta:
        out = ToolDelta()
        self._text += piece
        while True:
            if self._inside:
                end = self._text.find(tool_parser.CLOSE)
                if end < 0:
                    if final:  # never closed: the model's text, as written
                        self._content(out, self._text)
                        self._text, self._inside = "", False
                    break
                block = self._text[:end + len(tool_parser.CLOSE)]
                self._text, self._inside = self._text[len(block):], False
                parsed = tool_parser.parse(block, self.tools)
                if parsed.calls:
                    for call in parsed.calls:
                        out.calls.append({"index": self.calls, "id": self.new_call_id(),
                                          "type": "function",
                                          "function": {"name": call.name,
                                                       "arguments": call.arguments_json()}})
                        self.calls += 1
                else:
                    self._content(out, block)
                continue
            start = self._text.find(tool_parser.OPEN)
            if start >= 0:
                self._content(out, self._text[:start], hold_space=True)
                self._text, self._inside = self._text[start:], True
                continue
            keep = 0 if final else _open_prefix(self._text)
            self._content(out, self._text[:len(self._text) - keep], hold_space=True)
            self._text = self._text[len(self._text) - keep:]
            break
        if final:
            if not self.calls:  # no call: the text as written, trailing whitespace included
                out.content += self._space
            self._space = ""
        return out

    def _content(self, out: ToolDelta, text: str, *, hold_space: bool = False) -> None:
        if not text:
            return
        text = self._space + text
        self._space = ""
        if hold_space:
            body = text.rstrip()
            self._space = text[len(body):]
            text = body
        out.content += text


def _open_prefix(text: str) -> int:
    """How many trailing characters of ``text`` could begin ``<tool_call>``."""
    for k in range(min(len(tool_parser.OPEN) - 1, len(text)), 0, -1):
        if tool_parser.OPEN.startswith(text[-k:]):
            return k
    return 0
