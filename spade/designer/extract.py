"""Pull the environment code out of a designer response and fix f-string braces.

Designers answer in markdown: the code sits in a fenced block, sometimes after a
``<think>`` reasoning block, sometimes cut off by the token limit.  A frequent
bug in generated code is a literal brace inside an f-string, e.g.
``f"Pick a cell {1-indexed row col}"``: Python reads ``{...}`` as a replacement
field and the module fails to parse.  :func:`repair_fstring_braces` escapes such
fields (``{{...}}``) and nothing else.

Standard library only.  Targets the Python 3.11 f-string grammar, where a
literal is a single ``STRING`` token; the 3.12 ``FSTRING_*`` tokens are handled
too.

How is ``selfplay.code_extraction`` (:data:`CODE_EXTRACTIONS`):

- ``spade`` (the default): the reasoning set aside, the first python-tagged fenced block (any
  tag spelling, an unclosed last fence included), else the first untagged one, else the whole
  text, dedented and stripped; f-string fields repaired on the error line, then anywhere.
- ``released``: the released ``extract_game_code`` (``spade/core/utils/parsing.py:111-113`` of
  spade-rl/spade at 9b2b813) read on the whole reply, reasoning included: the first closed
  `````python`` block (the fence followed by a newline, the body ending in a newline and three
  backticks), else the reply unchanged; then :func:`repair_error_line` (``parsing.py:82-108``).
"""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
import warnings
from dataclasses import dataclass

from ..agent.reasoning import drop_leading_block

__all__ = ["CODE_EXTRACTIONS", "Extraction", "extract_code", "repair_error_line", "repair_fstring_braces"]

CODE_EXTRACTIONS: tuple[str, ...] = ("spade", "released")
_RELEASED_BLOCK = re.compile(r"```python\n(.*?)\n```", re.DOTALL)
_FLAT_FIELD = re.compile(r"\{([^{}]*)\}")

_PYTHON_TAGS = frozenset({"python", "py", "python3", "py3"})
_OPEN_FENCE = re.compile(r"[ \t]*(?P<ticks>`{3,})[ \t]*(?P<lang>[^\s`]*)[^`]*")
_STRING_HEAD = re.compile(r"(?P<prefix>[A-Za-z]*)(?P<quote>'''|\"\"\"|'|\")")


@dataclass(frozen=True)
class Extraction:
    """Code taken from a response.

    ``repairs`` counts the f-string braces escaped; ``syntax_error`` is None when
    ``code`` parses, else the final error message with its line number.
    """

    code: str
    from_fence: bool
    repairs: int
    syntax_error: str | None = None


def extract_code(response: str, *, max_repair_passes: int = 20, how: str = "spade") -> Extraction:
    """Select the code in ``response``, repair f-string braces, report syntax (``how``: see the module doc)."""
    if how == "released":
        found = _RELEASED_BLOCK.search(response)
        code, repairs = repair_error_line(found.group(1) if found else response, max_repair_passes)
        return Extraction(code, found is not None, repairs, _describe(_parse_error(code)))
    if how != "spade":
        raise ValueError(f"selfplay.code_extraction: {how!r} is not allowed; choose one of: {', '.join(CODE_EXTRACTIONS)}")
    code, from_fence = _select_code(drop_leading_block(response))
    code, repairs = repair_fstring_braces(code, max_repair_passes)
    return Extraction(code, from_fence, repairs, _describe(_parse_error(code)))


def repair_error_line(code: str, max_passes: int = 20) -> tuple[str, int]:
    """The released repair: while ``code`` fails to parse, every brace-free ``{...}`` on the
    reported line whose inside is not an expression (an empty one included) becomes ``{{...}}``,
    f-string or not; it stops when a pass changes nothing. Returns the code and the number of
    fields escaped. Never raises (the released loop would on a null byte; here it stops)."""
    total = 0
    for _ in range(max_passes):
        error = _parse_error(code)
        if not isinstance(error, SyntaxError) or not error.lineno:
            break
        lines = code.split("\n")
        if error.lineno > len(lines):
            break
        escaped = 0

        def escape(field: re.Match) -> str:
            nonlocal escaped
            if _parse_expression(field.group(1)):
                return field.group(0)
            escaped += 1
            return "{{" + field.group(1) + "}}"

        line = _FLAT_FIELD.sub(escape, lines[error.lineno - 1])
        if line == lines[error.lineno - 1]:
            break
        lines[error.lineno - 1] = line
        code, total = "\n".join(lines), total + escaped
    return code, total


# --------------------------------------------------------------------------
# Selecting the code


@dataclass(frozen=True)
class _Block:
    lang: str
    body: str


def _fenced_blocks(text: str) -> list[_Block]:
    """Fenced blocks in order; an unclosed final fence runs to the end."""
    lines = text.split("\n")
    blocks: list[_Block] = []
    i = 0
    while i < len(lines):
        opening = _OPEN_FENCE.fullmatch(lines[i].rstrip())
        if opening is None:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not _closes(lines[j], len(opening["ticks"])):
            j += 1
        blocks.append(_Block(opening["lang"].lower(), "\n".join(lines[i + 1:j])))
        i = j + 1
    return blocks


def _closes(line: str, ticks: int) -> bool:
    """A closing fence: only backticks, at least as many as the opening."""
    stripped = line.strip()
    return len(stripped) >= ticks and set(stripped) == {"`"}


def _select_code(text: str) -> tuple[str, bool]:
    """First python block, else first untagged block, else the whole text."""
    blocks = _fenced_blocks(text)
    for wanted in (lambda lang: lang in _PYTHON_TAGS, lambda lang: lang == ""):
        for block in blocks:
            if wanted(block.lang):
                return _tidy(block.body), True
    return _tidy(text), False


def _tidy(code: str) -> str:
    """Remove indentation shared by every line (indented fences) and outer blanks."""
    first = next((line for line in code.split("\n") if line.strip()), "")
    if first[:1].isspace():
        code = textwrap.dedent(code)
    return code.strip()


# --------------------------------------------------------------------------
# Parsing


def _parse_error(code: str) -> Exception | None:
    """The exception ``ast.parse`` raises on ``code``, or None if it parses."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(code)
    except Exception as exc:  # SyntaxError, ValueError (NUL), Memory/RecursionError
        return exc
    return None


def _describe(exc: Exception | None) -> str | None:
    if exc is None:
        return None
    if isinstance(exc, SyntaxError):
        return f"{exc.msg} (line {exc.lineno})"
    detail = str(exc)
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


# --------------------------------------------------------------------------
# f-string brace repair


def repair_fstring_braces(code: str, max_passes: int = 20) -> tuple[str, int]:
    """Escape f-string fields that cannot parse until ``code`` parses.

    Each pass handles the f-strings at the reported error line (all f-strings
    if none there needs fixing).  Returns the new code and the number of braces
    or fields escaped.  Never raises.
    """
    total = 0
    for _ in range(max_passes):
        error = _parse_error(code)
        if not isinstance(error, SyntaxError):
            break
        try:
            code, count = _repair_pass(code, error.lineno)
        except Exception:  # tokenizer or resource trouble: stop repairing
            break
        if count == 0:
            break
        total += count
    return code, total


def _repair_pass(code: str, error_line: int | None) -> tuple[str, int]:
    spans = _fstring_spans(code)
    on_line = [s for s in spans if error_line is not None and s[0] <= error_line <= s[1]]
    code_out, count = _rewrite_spans(code, on_line)
    if count == 0:
        code_out, count = _rewrite_spans(code, spans)
    return code_out, count


def _rewrite_spans(code: str, spans: list[tuple[int, int, int, int]]) -> tuple[str, int]:
    """Repair the f-string literals at ``spans`` (first line, last line, start, end)."""
    total = 0
    for _, _, start, end in sorted(spans, key=lambda s: s[2], reverse=True):
        literal, count = _repair_literal(code[start:end])
        if count:
            code = code[:start] + literal + code[end:]
            total += count
    return code, total


def _fstring_spans(code: str) -> list[tuple[int, int, int, int]]:
    """Outermost f-string literals as (first line, last line, start offset, end offset)."""
    line_starts = _line_offsets(code)

    def offset(pos: tuple[int, int]) -> int:
        return line_starts[pos[0] - 1] + pos[1]

    spans = []
    fstring_start = getattr(tokenize, "FSTRING_START", None)  # Python >= 3.12
    fstring_end = getattr(tokenize, "FSTRING_END", None)
    opened: list[tokenize.TokenInfo] = []
    for tok in _tokens(code):
        if tok.type == tokenize.STRING and not opened and _is_fstring(tok.string):
            spans.append((tok.start[0], tok.end[0], offset(tok.start), offset(tok.end)))
        elif tok.type == fstring_start:
            opened.append(tok)
        elif tok.type == fstring_end and opened:
            first = opened.pop()
            if not opened:
                spans.append((first.start[0], tok.end[0], offset(first.start), offset(tok.end)))
    return spans


def _tokens(code: str) -> list[tokenize.TokenInfo]:
    """Tokens up to the first tokenizer error."""
    tokens = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            tokens.append(tok)
    except Exception:
        pass
    return tokens


def _line_offsets(code: str) -> list[int]:
    """Start offset of each line as the tokenizer numbers them."""
    offsets, total = [], 0
    for line in io.StringIO(code):
        offsets.append(total)
        total += len(line)
    offsets.append(total)
    return offsets


def _is_fstring(literal: str) -> bool:
    head = _STRING_HEAD.match(literal)
    return head is not None and "f" in head["prefix"].lower()


def _repair_literal(literal: str) -> tuple[str, int]:
    """Escape bad fields and stray braces in one f-string literal."""
    head = _STRING_HEAD.match(literal)
    if head is None:
        return literal, 0
    prefix, quote = head["prefix"], head["quote"]
    if len(literal) < head.end() + len(quote) or not literal.endswith(quote):
        return literal, 0
    body = literal[head.end():len(literal) - len(quote)]
    new_body, count = _repair_body(body, prefix, quote)
    return prefix + quote + new_body + quote, count


def _repair_body(body: str, prefix: str, quote: str) -> tuple[str, int]:
    raw = "r" in prefix.lower()
    out: list[str] = []
    count = 0
    i = 0
    while i < len(body):
        char = body[i]
        if char == "\\" and not raw:
            step = _escape_length(body, i)
            out.append(body[i:i + step])
            i += step
        elif body.startswith("{{", i) or body.startswith("}}", i):
            out.append(body[i:i + 2])
            i += 2
        elif char == "{":
            end = _field_end(body, i)
            if end is None:  # never closed: a literal brace
                out.append("{{")
                count += 1
                i += 1
                continue
            field = body[i + 1:end]
            if _field_parses(field, prefix, quote):
                out.append(body[i:end + 1])
            else:
                out.append("{{" + field + "}}")
                count += 1
            i = end + 1
        elif char == "}":  # stray closing brace
            out.append("}}")
            count += 1
            i += 1
        else:
            out.append(char)
            i += 1
    return "".join(out), count


def _escape_length(body: str, i: int) -> int:
    """Length of the backslash escape at ``i`` in a non-raw literal part."""
    if body.startswith("\\N{", i):
        close = body.find("}", i + 3)
        if close != -1:
            return close + 1 - i
    if body[i + 1:i + 2] in ("{", "}", ""):
        return 1  # the brace is still a field delimiter
    return 2


def _field_end(body: str, start: int) -> int | None:
    """Index of the ``}`` closing the field opened at ``start``, or None.

    Tracks brackets and quoted strings in the expression, and nested fields in
    the format spec, much as CPython 3.11 scans a field.
    """
    depth = spec_depth = 0
    in_spec = False
    quote: str | None = None
    i = start + 1
    while i < len(body):
        char = body[i]
        if quote is not None:
            if body.startswith(quote, i):
                i += len(quote)
                quote = None
            else:
                i += 1
            continue
        if in_spec:
            if char == "}" and spec_depth == 0:
                return i
            spec_depth += {"{": 1, "}": -1}.get(char, 0)
        elif char in "'\"":
            quote = body[i:i + 3] if body[i:i + 3] in ("'''", '"""') else char
            i += len(quote)
            continue
        elif char == "}" and depth == 0:
            return i
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(depth - 1, 0)
        elif char == ":" and depth == 0:
            in_spec = True
        i += 1
    return None


def _field_parses(field: str, prefix: str, quote: str) -> bool:
    """Whether ``{field}`` is a valid field in an f-string with this prefix and quote."""
    return _parse_expression(prefix + quote + "{" + field + "}" + quote)


def _parse_expression(source: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(source, mode="eval")
    except Exception:
        return False
    return True
