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
  does not end it). The body is one JSON object or an array of them (``base_format_detector.py``,
  ``parse_base_json``). Each needs a non-empty ``name`` that is one of the request's tools (when
  ``tools`` is given; SGLang drops any other name unless ``SGLANG_FORWARD_UNKNOWN_TOOLS`` is set;
  ``drop_unknown_names=False`` keeps them, for training, where the released orchestrator runs
  them); its arguments are ``parameters`` when that is truthy, else ``arguments``, else ``{}``,
  kept as written: a list or a string is passed on as such (SGLang JSON-encodes whatever value is
  there), not decoded.
* XML parameters (``qwen3_coder_detector.py``, ``Qwen3CoderDetector.detect_and_parse``)::

      <tool_call>
      <function=f>
      <parameter=x>
      1
      </parameter>
      </function>
      </tool_call>

  A block runs to the first ``</tool_call>``, and every ``<function=NAME>`` in it is a call, also
  after other text (a ``<tool_call>`` in prose before a real block starts the block there). When
  the text has no closed block at all, the whole text (also before the first ``<tool_call>``) is
  searched for functions. A function missing ``</function>`` runs to the end of the block, a
  parameter missing ``</parameter>`` runs to the next ``<parameter=``, ``</function>`` or the end.
  Text between parameters is ignored. A value loses one leading and one trailing newline and is
  typed by ``_xml_value`` (the rules of ``Qwen3CoderDetector._convert_param_value``). Function
  names are not checked against the tools.

Which form a ``<tool_call>`` opens (``BlockReader.read``): a JSON block whose body is valid JSON;
else an XML block when its part up to the first ``</tool_call>`` holds ``<function=``; else a
JSON block that is not JSON (an error, like SGLang's warning); else the tag is prose (SGLang's
JSON detector does not see a ``<tool_call>`` without its newline) and reading goes on after it.
A reply in one form is so read as that form's detector reads it; a reply mixing the forms gets
the calls of both.

Where SGLang raises instead of skipping, it returns no call for the whole reply (its chat server
catches the error and sends the text as content): a JSON body, or array item, that is not an
object; a name that is a list or an object; XML values the Python-literal fallback turns into
something JSON cannot encode (a set, bytes, ``...``). ``parse`` does the same: no calls, the
reason among the errors. Arguments holding a number JSON cannot write (``NaN``, ``Infinity``, from
JSON or an XML number or literal) are one place where spade differs: SGLang sends them as the
non-JSON ``NaN``; here that call is an error and gives no call (``docs/fidelity.md``).

``parse(text)`` never raises on model output. It returns the text outside the calls
(``content``, stripped), the calls in order (arguments as SGLang sends them, JSON-decoded: an XML
tuple becomes a list, a non-string key a string), and one ``ToolCallError`` per block (or array
item) that gave no call. A block that yields no call is left in ``content``. ``BlockReader``
reads one block; ``spade serve``'s stream (``spade.serve.streaming.ToolCallStream``) uses it on
text that is still arriving, so a stream yields the calls ``parse`` finds in the whole text
(except that it cannot take back calls it sent before a block that voids the reply).
"""

from __future__ import annotations

import ast
import json
import re
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
JSON_OPEN = OPEN + "\n"   # Qwen25Detector.bot_token
JSON_CLOSE = "\n" + CLOSE  # Qwen25Detector.eot_token
FUNCTION = "<function="

_FUNCTION = re.compile(r"<function=(.*?)</function>|<function=(.*)$", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.DOTALL)
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
    void = False
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
        void = void or block.voids_reply
        if not block.calls:
            kept.append(text[start:block.end])
        position = block.end
    if void:  # SGLang raised while reading the reply: no call, the text as written
        return ParsedOutput(text.strip(), (), tuple(errors))
    return ParsedOutput("".join(kept).strip(), tuple(calls), tuple(errors))


@dataclass(frozen=True)
class Block:
    """One ``<tool_call>`` block as ``parse`` reads it: it ends at ``end`` (exclusive; the end of
    the text for a block that is never closed, whose text is then content to the end); ``calls``
    are its calls (none: the block's text is content), ``errors`` why items gave no call.
    ``voids_reply``: SGLang raises on this block, so the whole reply has no call."""

    end: int
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[ToolCallError, ...] = ()
    voids_reply: bool = False


class _Void(Exception):
    """An item on which SGLang raises: no call for the whole reply."""


_NOT_JSON = object()


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
        same way whatever follows (every end below is the first occurrence of a marker after the
        tag, which later text cannot move)."""
        inner = start + len(OPEN)
        if not complete and len(text) < start + len(JSON_OPEN):
            return None  # the newline that makes a JSON block may still come
        close = text.find(CLOSE, inner)  # the XML block's end
        json_close = text.find(JSON_CLOSE, start + len(JSON_OPEN)) if text.startswith(JSON_OPEN, start) else -1
        if json_close < 0 and text.startswith(JSON_OPEN, start) and not complete:
            return None  # a JSON block that may still close (and then be read before the XML one)
        if json_close >= 0:
            end = json_close + len(JSON_CLOSE)
            try:
                value = _json_value(text[start + len(JSON_OPEN):json_close])
            except _Void as void:
                return _voided(text, start, end, void)
            if value is not _NOT_JSON:
                return self._calls(text, start, end, self._json_calls, value)
        if close >= 0 and FUNCTION in text[inner:close]:
            nested = _nested_json(text, inner, close, complete)
            if nested is None:
                return None
            if not nested:
                return self._calls(text, start, close + len(CLOSE), self._xml_calls, text[inner:close])
        if json_close >= 0:
            return _block(text, start, json_close + len(JSON_CLOSE), [], ["tool call is not valid JSON"])
        if close >= 0:  # prose mentioning the tag, or a tag without the JSON layout: read on after it
            return Block(inner, (), (ToolCallError(
                f"{OPEN} must be followed by a newline and {CLOSE} start its own line",
                text[start:close + len(CLOSE)]),))
        if not complete:
            return None
        first = text.find(OPEN)
        if text.find(CLOSE, first + len(OPEN)) < 0 and FUNCTION in text:
            # no block is closed anywhere: Qwen3CoderDetector searches the whole text
            return self._calls(text, start, len(text), self._xml_calls, text)
        return _block(text, start, len(text), [], [f"{OPEN} is never closed by {CLOSE}"])

    @staticmethod
    def _calls(text: str, start: int, end: int, read: Any, payload: Any) -> Block:
        try:
            found, problems = read(payload)
        except _Void as void:
            return _voided(text, start, end, void)
        return _block(text, start, end, found, problems)

    def _json_calls(self, value: Any) -> tuple[list[ToolCall], list[str]]:
        """The calls of one JSON block's value (``parse_base_json``'s rules)."""
        calls: list[ToolCall] = []
        problems: list[str] = []
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, dict):
                raise _Void(f"tool call JSON must be an object, got {type(item).__name__}")
            name = item.get("name")
            if isinstance(name, (list, dict)):
                raise _Void(f"tool call name is a {type(name).__name__}")
            if not name or not isinstance(name, str):
                problems.append("tool call has no \"name\" string")
            elif self.known is not None and name not in self.known:
                problems.append(f"tool call names {name!r}, which is not one of the tools")
            else:
                _add_call(calls, problems, name, item.get("parameters") or item.get("arguments", {}))
        return calls, problems

    def _xml_calls(self, block: str) -> tuple[list[ToolCall], list[str]]:
        """The calls of one XML block (every ``<function=NAME>`` in it)."""
        calls: list[ToolCall] = []
        problems: list[str] = []
        seen = False
        for match in _FUNCTION.finditer(block):
            body = match.group(1) if match.group(1) is not None else match.group(2)
            if ">" not in body:
                continue
            seen = True
            name, _, params = body.partition(">")
            properties = self.schemas.get(name, {})
            arguments: dict[str, Any] = {}
            for parameter in _PARAMETER.finditer(params):
                if ">" not in parameter.group(1):
                    continue
                key, _, raw = parameter.group(1).partition(">")
                raw = raw[1:] if raw.startswith("\n") else raw
                raw = raw[:-1] if raw.endswith("\n") else raw
                arguments[key] = _xml_value(raw, properties[key] if key in properties else _MISSING)
            _add_call(calls, problems, name, arguments)
        return calls, ([] if seen else ["no <function=NAME> in the tool call"]) + problems


def _block(text: str, start: int, end: int, found: list[ToolCall], problems: list[str]) -> Block:
    raw = text[start:end]
    return Block(end, tuple(found), tuple(ToolCallError(message, raw) for message in problems))


def _voided(text: str, start: int, end: int, void: _Void) -> Block:
    return Block(end, (), (ToolCallError(f"{void}; SGLang returns no call for the whole reply", text[start:end]),),
                 voids_reply=True)


def _nested_json(text: str, inner: int, close: int, complete: bool) -> Optional[bool]:
    """Whether a ``<tool_call>`` + newline before ``close`` opens a JSON block whose body is JSON
    (then the outer tag is prose and that block is read: ``Qwen25Detector`` does not see a tag
    without its newline); None while a stream has not shown where that block ends."""
    at = text.find(JSON_OPEN, inner)
    while 0 <= at < close:
        end = text.find(JSON_CLOSE, at + len(JSON_OPEN))
        if end < 0:
            return False if complete else None
        try:
            if _json_value(text[at + len(JSON_OPEN):end]) is not _NOT_JSON:
                return True
        except _Void:
            return True
        at = text.find(JSON_OPEN, end + len(JSON_CLOSE))  # that detector reads on after the block
    return False


def _json_value(body: str) -> Any:
    """A JSON block's body decoded (as ``json.loads``, ``NaN`` included), or ``_NOT_JSON``."""
    try:
        return json.loads(body.strip())
    except json.JSONDecodeError:
        return _NOT_JSON
    except RecursionError:  # SGLang does not catch it
        raise _Void("tool call JSON is nested too deeply") from None


def _add_call(calls: list[ToolCall], problems: list[str], name: str, arguments: Any) -> None:
    """Adds the call with its arguments as SGLang sends them (``json.dumps``, decoded again):
    a value it cannot encode voids the reply; a number JSON cannot write makes this call an error."""
    try:
        sent = json.loads(json.dumps(arguments, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError) as exc:
        raise _Void(f"the arguments of {name!r} cannot be JSON-encoded ({type(exc).__name__}: {exc})") from None
    try:
        json.dumps(sent, allow_nan=False)
    except ValueError:
        problems.append(f"the arguments of {name!r} hold NaN or an infinite number, which JSON cannot write")
        return
    calls.append(ToolCall(name, sent))


_MISSING = object()
_LITERAL_LOCK = threading.Lock()  # warnings.catch_warnings changes process-wide state


def _literal(raw: str) -> Any:
    """``ast.literal_eval`` without the warnings an invalid escape such as ``"\\d"`` raises while
    compiling (the value keeps the backslash, as it does without the filter)."""
    with _LITERAL_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.literal_eval(raw)


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
        except (ValueError, RecursionError):
            pass
    try:
        return _literal(raw)
    except Exception:  # noqa: BLE001 - any failure keeps the text, as SGLang's does
        return raw


_JSON_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})
# database-style type names SGLang's chat server rewrites in a request's tool schemas before it
# reads any call (``serving_chat.py`` calls ``utils.py`` ``normalize_json_schema_types``)
_TYPE_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum", "uuid", "date", "datetime", "time", "timestamp",
                     "binary", "blob", "bytea", "bytes", "varbinary"), "string"),
    "bool": "boolean", "bigint": "integer", "smallint": "integer", "tinyint": "integer",
    **dict.fromkeys(("double", "decimal", "real", "numeric"), "number"),
    "arr": "array", "tuple": "array", "set": "array", "map": "object",
}
_TYPE_PREFIXES = ((("int", "uint", "long", "short", "unsigned"), "integer"), (("num", "float"), "number"),
                  (("list",), "array"), (("dict",), "object"))
_AFTER_PREFIX = frozenset("0123456789[<( \t")


def _json_schema_type(kind: Any) -> Any:
    """A ``type`` as SGLang rewrites it: ``varchar(255)`` is "string", ``int32`` "integer", ``Double``
    "number"; a name that only begins like one must go on with a digit, ``[``, ``<``, ``(`` or a
    space (``internal`` stays as it is); anything else is left alone."""
    if not isinstance(kind, str) or kind in _JSON_TYPES:
        return kind
    base = kind.split("(", 1)[0].strip().lower()
    if base in _JSON_TYPES:
        return base
    if base in _TYPE_ALIASES:
        return _TYPE_ALIASES[base]
    for prefixes, target in _TYPE_PREFIXES:
        if any(base == p or (base.startswith(p) and len(base) > len(p) and base[len(p)] in _AFTER_PREFIX)
               for p in prefixes):
            return target
    return kind


def _schema_type(schema: Any) -> Optional[str]:
    """A parameter schema's main type (``function_call/utils.py``, ``infer_type_from_json_schema``,
    on the types as the server rewrote them)."""
    if not isinstance(schema, Mapping):
        return None
    if "type" in schema:
        kind = schema["type"]
        if isinstance(kind, str):
            return _json_schema_type(kind)
        if isinstance(kind, list) and kind:
            rest = [k for k in (_json_schema_type(k) for k in kind) if k != "null"]
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
        parameters = function.get("parameters")
        properties = _schema_properties(parameters)
        if not properties and isinstance(parameters, Mapping) and "properties" not in parameters:
            properties = dict(parameters)  # as _get_arguments_config: the schema itself stands in
        schemas.setdefault(function["name"], properties)
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
