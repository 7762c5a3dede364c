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
* ``stop_regex`` patterns (SGLang's field) are searched in the text so far after each token's
  text arrives, whatever the chunking; the first search that finds a match ends the choice at the
  end of that match (the match stays in the text, as SGLang keeps a regex match: its stop trim
  looks for the pattern's own text). Text already sent cannot be taken back, so a match that
  ends inside it (a lookahead or ``$`` that only held for a shorter text) ends the choice there.
* A token that ends a completion (EOS or a stop token id) is held until the next token shows it
  was not the last one; a final one is dropped, as the non-streamed text drops it.

``ToolCallStream`` sits after ``ChoiceText`` for chat requests with ``tools``: content outside
``<tool_call>`` blocks streams as it comes; a block is held until the text decides it by the
rules of the non-streamed parse (``spade.agent.tool_calls``, SGLang 0.5.23's ``qwen25`` and
``qwen3_coder`` detectors), and its calls then go out as ``tool_calls`` deltas, each carrying the
whole call (name and arguments). SGLang's streaming detectors send a name first and the arguments
in pieces as partial JSON parses; holding the block instead means a stream never sends a call
that the whole text does not have (an unclosed block, a name outside the tools, a block whose
JSON breaks later), so the calls of a stream are those of the non-streamed response, in every
chunking. A block that gives no call is sent as content. ``ChatChoiceStream`` puts the reasoning
split (``spade.agent.reasoning.ReasoningStream``) in front of it for one chat choice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from spade.agent import reasoning
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
    """Cuts a text that arrives in pieces at its first occurrence of any stop string (excluded),
    or after the first match of any ``regexes`` (included; module docstring)."""

    def __init__(self, stops: Sequence[str], regexes: Sequence[str] = ()) -> None:
        self.stops = tuple(stops)
        self.regexes = tuple(re.compile(r) for r in regexes)
        self._widths = tuple(_max_width(r) for r in self.regexes)
        self._held = ""
        self._text = ""  # everything pushed (regexes search it)
        self.stopped = False

    def push(self, piece: str) -> str:
        """The text that can be sent now (``stopped`` is set once a stop string was found)."""
        if self.stopped:
            return ""
        searched = len(self._text)
        self._text += piece
        text = self._held + piece
        match_end = self._regex_end(searched)
        if match_end is not None:
            sent = len(self._text) - len(text)
            cut = max(match_end - sent, 0)
            found = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=cut)
            self.stopped, self._held = True, ""
            return text[:min(cut, found)]
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

    def _regex_end(self, searched: int) -> Optional[int]:
        """Where the first match of any regex in the text so far ends (None: no match). A match
        of at most ``width`` characters that ends before ``searched`` was there at the last search."""
        ends = []
        for pattern, width in zip(self.regexes, self._widths):
            start = 0 if width is None else max(0, searched - width)
            match = pattern.search(self._text, start)
            if match is not None:
                ends.append(match.end())
        return min(ends, default=None)

    def _partial_start(self, text: str) -> Optional[int]:
        """The first position from which the rest of ``text`` is a proper prefix of a stop string."""
        longest = max(len(s) for s in self.stops)
        for position in range(max(0, len(text) - longest + 1), len(text)):
            rest = text[position:]
            if any(len(rest) < len(s) and s.startswith(rest) for s in self.stops):
                return position
        return None


def _max_width(pattern: str) -> Optional[int]:
    """The most characters a match of ``pattern`` can span (None: unbounded, or not known)."""
    try:
        from re import _parser  # type: ignore[attr-defined]
        width = _parser.parse(pattern).getwidth()[1]
    except Exception:  # noqa: BLE001 - a private module: when it fails, search the whole text
        return None
    return width if width < (1 << 16) else None


@dataclass
class TokenLogprob:
    """A kept token's text and log-prob, and its alternatives (``top``: (text, log-prob), most
    likely first) when the request asked for top log-probs."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


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
                 stops: Sequence[str], logprobs: bool, stop_regex: Sequence[str] = ()) -> None:
        self._decode = decode
        self.decoder = IncrementalDecoder(decode)
        self.matcher = StopMatcher(stops, stop_regex)
        self.end_ids = end_ids
        self.want_logprobs = logprobs
        self.generated = 0  # every id the engine produced (usage counts them all)
        self.sent = 0  # characters of text sent
        self._held_end: Optional[tuple[int, float, tuple]] = None
        self._tokens: list[TokenLogprob] = []  # kept tokens whose log-prob is not sent yet
        self._covered = 0  # characters of text the sent log-probs' tokens cover

    @property
    def stopped(self) -> bool:
        """A stop string was found: the choice is complete, generation can stop."""
        return self.matcher.stopped

    def push(self, ids: Sequence[int], logprobs: Sequence[float],
             top_logprobs: Sequence[Sequence[tuple[int, float]]] = ()) -> Delta:
        """``top_logprobs``: each id's alternatives as (id, log-prob), or empty."""
        self.generated += len(ids)
        kept: list[tuple[int, float, tuple]] = []
        tops = top_logprobs or [()] * len(ids)
        for entry in zip(ids, logprobs, tops):
            if self._held_end is not None:
                kept.append(self._held_end)
                self._held_end = None
            if entry[0] in self.end_ids:
                self._held_end = entry
            else:
                kept.append(entry)
        if self.stopped:
            return Delta()
        self._keep(kept)
        ids = [entry[0] for entry in kept]
        if self.matcher.regexes:  # searched after each token, so the chunking does not matter
            text = ""
            for token in ids:
                text += self.matcher.push(self.decoder.push([token]))
                if self.stopped:
                    break
        else:
            text = self.matcher.push(self.decoder.push(ids))
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

    def _keep(self, kept: list[tuple[int, float, tuple]]) -> None:
        if self.want_logprobs:
            self._tokens += [TokenLogprob(self._decode([t]), lp,
                                          tuple((self._decode([a]), alp) for a, alp in top))
                             for t, lp, top in kept]

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
    """Content and tool calls from text deltas (module docstring). A block is read by
    ``tool_calls.BlockReader``, the reader of the non-streamed parse, on the text so far, and held
    until what has arrived decides it: a JSON block ends at the first new line followed by
    ``</tool_call>`` (so a ``</tool_call>`` inside a string argument does not end it), an XML one
    at the first ``</tool_call>``; a block never closed is decided at the end of the text. Its
    calls (names outside ``tools`` dropped, an array one call per item) are then sent, or its
    text as content when it gives none. Trailing whitespace is held and the first content after a
    call loses its leading whitespace, so that ``content`` is stripped around calls as in the
    non-streamed message; whitespace before content that precedes the first call is sent as it
    comes (it cannot be known yet whether a call follows), as SGLang's stream sends it."""

    def __init__(self, tools: Optional[Sequence[Mapping[str, Any]]],
                 new_call_id: Callable[[], str]) -> None:
        self.tools = tools
        self.new_call_id = new_call_id
        self.reader = tool_parser.BlockReader(tools)
        self.calls = 0
        self._text = ""  # all the text so far
        self._done = 0  # the text before this is sent (or held in _space)
        self._space = ""  # trailing whitespace held back
        self._said = False  # some content was sent

    def push(self, piece: str, *, final: bool = False) -> ToolDelta:
        out = ToolDelta()
        self._text += piece
        text = self._text
        while True:
            start = text.find(tool_parser.OPEN, self._done)
            if start < 0:
                stop = len(text) - (0 if final else _open_prefix(text, self._done))
                self._content(out, text[self._done:stop])
                self._done = stop
                break
            self._content(out, text[self._done:start])
            self._done = start
            block = self.reader.read(text, start, complete=final)
            if block is None:
                break
            for call in block.calls:
                out.calls.append({"index": self.calls, "id": self.new_call_id(), "type": "function",
                                  "function": {"name": call.name, "arguments": call.arguments_json()}})
                self.calls += 1
            if not block.calls:
                self._content(out, text[start:block.end])
            self._done = block.end
        if final:
            if not self.calls:  # no call: the text as written, trailing whitespace included
                out.content += self._space
            self._space = ""
        return out

    def _content(self, out: ToolDelta, text: str) -> None:
        if not text:
            return
        text = self._space + text
        body = text.rstrip()
        self._space = text[len(body):]
        if self.calls and not self._said:
            body = body.lstrip()
        if body:
            out.content += body
            self._said = True


def _open_prefix(text: str, begin: int) -> int:
    """How many trailing characters of ``text[begin:]`` could begin ``<tool_call>``."""
    for k in range(min(len(tool_parser.OPEN) - 1, len(text) - begin), 0, -1):
        if tool_parser.OPEN.startswith(text[-k:]):
            return k
    return 0


@dataclass
class ChatDelta:
    reasoning: str = ""
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)


class ChatChoiceStream:
    """One chat choice's text deltas as the parts of its streamed message: ``reasoning`` (when
    ``inside`` is not None: the server separates reasoning, and the reply starts inside it or
    not; ``spade.agent.reasoning.ReasoningStream``), then, from the answer only, ``content`` and,
    with ``parse_tools``, tool calls (``ToolCallStream``). The deltas add up to the non-streamed
    message of the same text (``protocol.chat_choice``)."""

    def __init__(self, *, inside: Optional[bool], parse_tools: bool,
                 tools: Optional[Sequence[Mapping[str, Any]]], new_call_id: Callable[[], str]) -> None:
        self.thoughts = None if inside is None else reasoning.ReasoningStream(inside=inside)
        self.tool_calls = ToolCallStream(tools, new_call_id) if parse_tools else None

    @property
    def called(self) -> bool:
        """Some tool call was sent (the finish reason becomes "tool_calls")."""
        return self.tool_calls is not None and self.tool_calls.calls > 0

    def push(self, piece: str, *, final: bool = False) -> ChatDelta:
        out = ChatDelta()
        answer = piece
        if self.thoughts is not None:
            parts = self.thoughts.push(piece, final=final)
            out.reasoning, answer = parts.reasoning, parts.answer
        if self.tool_calls is None:
            out.content = answer
        else:
            found = self.tool_calls.push(answer, final=final)
            out.content, out.calls = found.content, found.calls
        return out
