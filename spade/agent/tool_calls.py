"""Tool calls in a model's own output syntax, parsed into typed records (pure functions).

The rules are those of SGLang 0.5.23's Qwen tool-call detectors (``sglang/srt/function_call/``),
restated here; the released SPADE launchers serve with ``--tool-call-parser qwen``, which is
``Qwen25Detector``. Two forms are recognised inside ``<tool_call>`` blocks (Qwen3's markers):

* JSON (``qwen25_detector.py``, ``Qwen25Detector.detect_and_parse``)::

      <tool_call>
      {"name": "f", "arguments": {"x": 1}}
      </tool_call>

  A block opens with ``<tool_call>`` followed by a newline and ends at the first newline followed
  by ``</tool_call>`` (so ``</tool_call>`` inside a JSON string, where a newline is always escaped,
  does not end it; a block written without those newlines is not a call). The body is one JSON
  object or an array of them (``base_format_detector.py``, ``parse_base_json``). Each needs a
  non-empty ``name`` that is one of the request's tools (when ``tools`` is given; SGLang drops any
  other name unless ``SGLANG_FORWARD_UNKNOWN_TOOLS`` is set; ``drop_unknown_names=False`` keeps
  them, for training, where the released orchestrator runs them); its arguments are
  ``parameters`` when that is truthy, else ``arguments``, else ``{}``, kept as written: a list or
  a string is passed on as such (SGLang JSON-encodes whatever value is there), not decoded.
* XML parameters (``qwen3_coder_detector.py``, ``Qwen3CoderDetector.detect_and_parse``)::

      <tool_call>
      <function=f>
      <parameter=x>
      1
      </parameter>
      </function>
      </tool_call>

  A block runs to the first ``</tool_call>``; one left open runs to the end of the text when the
  text has no closed block. A block may hold several functions; a function missing
  ``</function>`` runs to the end of the block, a parameter missing ``</parameter>`` runs to the
  next ``<parameter=``, ``</function>`` or the end. Text between parameters is ignored. A value
  loses one leading and one trailing newline and is typed by ``_xml_value`` (the rules of
  ``Qwen3CoderDetector._convert_param_value``). Function names are not checked against the tools.

``parse(text)`` never raises on model output. It returns the text outside the calls
(``content``, stripped), the calls in order, and one ``ToolCallError`` per block (or array item)
that SGLang would not return as a call: bad JSON, no or unknown name, a block without the newline
layout, an unclosed block. A block that yields no call is left in ``content``. ``BlockReader`` reads
one block; ``spade serve``'s stream (``spade.serve.streaming.ToolCallStream``) uses it on text that
is still arriving, so a stream yields the calls ``parse`` finds in the whole text.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
JSON_OPEN = OPEN + "\n"   # Qwen25Detector.bot_token
JSON_CLOSE = "\n" + CLOSE  # Qwen25Detector.eot_token
FUNCTION = "<function="

_FUNCTION = re.compile(r"<function=(.*?)</function>|<function=(.*)$", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.DOTALL)
_NON_SPACE = re.compile(r"\S")
_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
_INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's name and its arguments (a JSON object, or whatever JSON value
    the model wrote there: SGLang passes a list or string on unchanged)."""

    name: str
    arguments: Any = field(default_factory=dict)

    def arguments_json(self) -> str:
        """The arguments as the JSON string the OpenAI format carries."""
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class ToolCallError:
    """A block that looked like a tool call but gave no call; ``raw`` is its whole text."""

    message: str
    raw: str


@dataclass(frozen=True)
class ParsedOutput:
    """What ``parse`` found: ``content`` (text outside the calls), ``calls`` and ``errors``."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[ToolCallError, ...] = ()

    def __iter__(self):
        """``content, calls = parse(text)`` (errors are on the object)."""
        return iter((self.content, list(self.calls)))


def has_tool_call(text: str) -> bool:
    """Whether ``text`` contains the opening marker of a tool call."""
    return OPEN in text


def parse(text: str, tools: Optional[Sequence[Mapping[str, Any]]] = None, *,
          drop_unknown_names: bool = True) -> ParsedOutput:
    """Split model output into content and tool calls (see the module docstring).

    ``tools``: the request's tool definitions (OpenAI function format or bare function objects):
    the names a JSON call may use, and the types of XML parameter values. Without it any name is
    accepted and XML values stay text (except ``null``). ``drop_unknown_names=False`` keeps a JSON
    call whose name is not among ``tools`` (like SGLang's ``SGLANG_FORWARD_UNKNOWN_TOOLS``, except
    that a call without a name is still none).
    """
    reader = BlockReader(tools, drop_unknown_names=drop_unknown_names)
    kept: list[str] = []
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    position = 0
    while True:
        start = text.find(OPEN, position)
        if start < 0:
            kept.append(text[position:])
            break
        kept.append(text[position:start])
        block = reader.read(text, start, complete=True)
        assert block is not None  # a complete text always decides
        calls.extend(block.calls)
        errors.extend(block.errors)
        if not block.calls:
            kept.append(text[start:block.end])
        position = block.end
    return ParsedOutput("".join(kept).strip(), tuple(calls), tuple(errors))


@dataclass(frozen=True)
class Block:
    """One ``<tool_call>`` block as ``parse`` reads it: it ends at ``end`` (exclusive; the end of
    the text for a block that is never closed, whose text is then content to the end); ``calls``
    are its calls (none: the block's text is content), ``errors`` why items gave no call."""

    end: int
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[ToolCallError, ...] = ()


class BlockReader:
    """Reads the block that opens at a given ``<tool_call>``, with the rules of the module
    docstring, in a whole text or in the beginning of one that is still arriving (a stream)."""

    def __init__(self, tools: Optional[Sequence[Mapping[str, Any]]] = None, *,
                 drop_unknown_names: bool = True) -> None:
        self.schemas = _parameter_schemas(tools or ())
        self.known = set(self.schemas) if tools is not None and drop_unknown_names else None

    def read(self, text: str, start: int, *, complete: bool) -> Optional[Block]:
        """The block opening at ``text[start:]`` (which begins with ``<tool_call>``). With
        ``complete`` false ``text`` may go on: ``None`` until what is there decides the block the
        same way whatever follows (every end below is the first occurrence of a marker, which
        later text cannot move)."""
        inner = start + len(OPEN)
        first = _NON_SPACE.search(text, inner)  # the block's first character after whitespace
        rest = "" if first is None else text[first.start():first.start() + len(FUNCTION)]
        if not complete and len(rest) < len(FUNCTION) and FUNCTION.startswith(rest):
            return None  # may still become "<function="
        if rest.startswith(FUNCTION):
            end = text.find(CLOSE, inner)
            if end < 0:
                if not complete:
                    return None
                if CLOSE in text:  # SGLang reads an open block to the end only when none is closed
                    return self._text_to_end(text, start, f"{OPEN} is never closed by {CLOSE}")
                found, problems = _parse_xml(text[inner:], self.schemas)
                return self._block(text, start, len(text), found, problems)
            found, problems = _parse_xml(text[inner:end], self.schemas)
            return self._block(text, start, end + len(CLOSE), found, problems)
        if text.startswith(JSON_OPEN, start):
            end = text.find(JSON_CLOSE, start + len(JSON_OPEN))
            if end < 0:
                if not complete:
                    return None
                return self._text_to_end(text, start, f"{OPEN} is never closed by a line {CLOSE}")
            found, problems = _parse_json(text[start + len(JSON_OPEN):end], self.known)
            return self._block(text, start, end + len(JSON_CLOSE), found, problems)
        end = text.find(CLOSE, inner)
        if end < 0 and not complete:
            return None
        return self._block(text, start, len(text) if end < 0 else end + len(CLOSE), [],
                           [f"{OPEN} must be followed by a newline and {CLOSE} start its own line"])

    @staticmethod
    def _block(text: str, start: int, end: int, found: list[ToolCall], problems: list[str]) -> Block:
        raw = text[start:end]
        return Block(end, tuple(found), tuple(ToolCallError(message, raw) for message in problems))

    @staticmethod
    def _text_to_end(text: str, start: int, message: str) -> Block:
        return Block(len(text), (), (ToolCallError(message, text[start:]),))


def _parse_json(body: str, known: Optional[set[str]]) -> tuple[list[ToolCall], list[str]]:
    """The calls of one JSON block and the reasons for the items that give none."""
    try:
        value = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        return [], [f"tool call is not valid JSON: {exc.msg} at position {exc.pos}"]
    calls: list[ToolCall] = []
    problems: list[str] = []
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, dict):
            # SGLang's parse_base_json fails on this (AttributeError) and returns no call at all
            problems.append(f"tool call JSON must be an object, got {type(item).__name__}")
            continue
        name = item.get("name")
        if not name or not isinstance(name, str):
            problems.append("tool call has no \"name\" string")
            continue
        if known is not None and name not in known:
            problems.append(f"tool call names {name!r}, which is not one of the tools")
            continue
        calls.append(ToolCall(name, item.get("parameters") or item.get("arguments", {})))
    return calls, problems


def _parse_xml(block: str, schemas: Mapping[str, Mapping[str, Any]]) -> tuple[list[ToolCall], list[str]]:
    """The calls of one XML block (every ``<function=NAME>`` in it)."""
    calls: list[ToolCall] = []
    for match in _FUNCTION.finditer(block):
        body = match.group(1) if match.group(1) is not None else match.group(2)
        if ">" not in body:
            continue
        name, _, params = body.partition(">")
        properties = schemas.get(name, {})
        arguments: dict[str, Any] = {}
        for parameter in _PARAMETER.finditer(params):
            if ">" not in parameter.group(1):
                continue
            key, _, raw = parameter.group(1).partition(">")
            raw = raw[1:] if raw.startswith("\n") else raw
            raw = raw[:-1] if raw.endswith("\n") else raw
            arguments[key] = _xml_value(raw, properties[key] if key in properties else _MISSING)
        calls.append(ToolCall(name, arguments))
    return calls, ([] if calls else ["no <function=NAME> in the tool call"])


_MISSING = object()


def _xml_value(raw: str, schema: Any) -> Any:
    """One parameter's value typed by its schema (``Qwen3CoderDetector._convert_param_value``):
    ``null`` in any case is None; a parameter the schema does not name stays text; string types
    stay text; integer types go through ``int``, number types through ``float`` (kept an int when
    written without ``.`` or ``e``), booleans are ``true`` in any case (anything else is False);
    objects and arrays are read as JSON, then (like every other type) as a Python literal, else
    stay text. A failed conversion keeps the text."""
    if raw.lower() == "null":
        return None
    if schema is _MISSING:
        return raw
    kind = str(_schema_type(schema) or "string").strip().lower()
    if kind in _STRING_TYPES:
        return raw
    if kind.startswith(_INT_PREFIXES):
        try:
            return int(raw)
        except ValueError:
            return raw
    if kind.startswith(("num", "float")):
        try:
            number = float(raw)
        except ValueError:
            return raw
        whole = "." not in raw and "e" not in raw.lower()
        return int(number) if whole and number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        return raw.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        try:
            return json.loads(raw)
        except ValueError:
            pass
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw


def _schema_type(schema: Any) -> Optional[str]:
    """A parameter schema's main type (``function_call/utils.py``, ``infer_type_from_json_schema``)."""
    if not isinstance(schema, Mapping):
        return None
    if "type" in schema:
        kind = schema["type"]
        if isinstance(kind, str):
            return kind
        if isinstance(kind, list) and kind:
            rest = [k for k in kind if k != "null"]
            return rest[0] if rest else "string"
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list):
        kinds = [k for k in (_schema_type(o) for o in options) if k]
        if kinds:
            distinct = set(kinds)
            if len(distinct) == 1:
                return kinds[0]
            if len(distinct) == 2 and "null" in distinct:
                return [k for k in kinds if k != "null"][0]
            return "string" if "string" in distinct else kinds[0]
    if isinstance(schema.get("enum"), list):
        kinds = {_value_type(v) for v in schema["enum"]}
        return kinds.pop() if len(kinds) == 1 else "string"
    if isinstance(schema.get("allOf"), list):
        for part in schema["allOf"]:
            kind = _schema_type(part)
            if kind and kind != "string":
                return kind
        return "string"
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return None


def _value_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    for kind, name in ((int, "integer"), (float, "number"), (list, "array"), (dict, "object")):
        if isinstance(value, kind):
            return name
    return "string"


def _schema_properties(schema: Any) -> dict[str, Any]:
    """A ``parameters`` schema's top-level properties, merged from its ``anyOf``/``oneOf``/``allOf``
    branches when it names none (``function_call/utils.py``, ``get_schema_properties``)."""
    if not isinstance(schema, Mapping):
        return {}
    if isinstance(schema.get("properties"), Mapping):
        return dict(schema["properties"])
    merged: dict[str, Any] = {}
    for keyword in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(keyword), list):
            for branch in schema[keyword]:
                for key, value in _schema_properties(branch).items():
                    merged.setdefault(key, value)
    return merged


def _parameter_schemas(tools: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """function name -> parameter name -> that parameter's schema."""
    schemas: dict[str, dict[str, Any]] = {}
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function", tool)
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        schemas.setdefault(function["name"], _schema_properties(function.get("parameters")))
    return schemas


# -- the agent's side: one parser per model family's tool-call syntax, chosen by chat format --------


class Qwen3ToolCallParser:
    """Qwen3's native syntax: ``<tool_call>`` blocks holding JSON (``{"name", "arguments"}``) or
    the XML parameter form (``<function=NAME><parameter=KEY>VALUE</parameter></function>``), any
    number per turn. The template's own rendering of a call is exactly the JSON form."""

    name = "qwen3"

    def parse(self, text: str, tools: Optional[Sequence[Mapping[str, Any]]] = None, *,
              drop_unknown_names: bool = True) -> ParsedOutput:
        return parse(text, tools, drop_unknown_names=drop_unknown_names)


PARSERS = {"qwen3": Qwen3ToolCallParser}


class UnknownToolFormat(ValueError):
    """The chat template shows no tool-call syntax this project can parse."""


def parser_for_template(chat_template: Optional[str]) -> Qwen3ToolCallParser:
    """The parser for a tokenizer's chat template: templates that render calls inside
    ``<tool_call>`` tags (Qwen3, Qwen3-MoE, Qwen3-Coder) get :class:`Qwen3ToolCallParser`."""
    if chat_template and OPEN in chat_template and CLOSE in chat_template:
        return Qwen3ToolCallParser()
    raise UnknownToolFormat("the chat template renders no <tool_call> blocks: no native tool-call parser "
                            "is known for it (tool use needs a Qwen3-family template)")
