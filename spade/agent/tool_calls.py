"""Tool calls in a model's own output syntax, parsed into typed records (pure functions).

Two forms are recognised inside ``<tool_call>...</tool_call>`` blocks (Qwen3's native markers):

* JSON (Qwen3, Hermes-style): ``<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>``.
  ``arguments`` may also be a JSON string holding an object (some models double-encode), or
  be called ``parameters``; a missing ``arguments`` means no arguments.
* XML parameters (Qwen3-Coder style)::

      <tool_call>
      <function=f>
      <parameter=x>
      1
      </parameter>
      </function>
      </tool_call>

  A parameter value loses one leading and one trailing newline. It is converted with the tool's
  JSON schema when ``tools`` is given (``"string"`` stays text; other types are read as JSON,
  falling back to the text), and without a schema it is read as JSON when it is valid JSON (so
  ``1`` is a number and ``"1"`` a string) and kept as text otherwise.

``parse(text)`` never raises on model output. It returns the text outside the well-formed blocks
(``content``, stripped), the calls in order, and one ``ToolCallError`` per malformed block (bad
JSON, no name, unclosed ``<tool_call>`` at the end of a truncated completion, ...). A malformed
block's text is left in ``content`` so that nothing the model wrote is lost.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

OPEN = "<tool_call>"
CLOSE = "</tool_call>"

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def arguments_json(self) -> str:
        """The arguments as the JSON string the OpenAI format carries."""
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class ToolCallError:
    """A block that looked like a tool call but could not be read; ``raw`` is its whole text."""

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


def parse(text: str, tools: Optional[Sequence[Mapping[str, Any]]] = None) -> ParsedOutput:
    """Split model output into content and tool calls (see the module docstring).

    ``tools``: the request's tool definitions (OpenAI function format or bare function objects);
    used only to type XML parameter values.
    """
    schemas = _parameter_types(tools or ())
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
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:
            raw = text[start:]
            errors.append(ToolCallError(f"{OPEN} is never closed by {CLOSE}", raw))
            kept.append(raw)
            break
        raw = text[start:end + len(CLOSE)]
        body = text[start + len(OPEN):end]
        result = _parse_body(body, schemas)
        if isinstance(result, ToolCall):
            calls.append(result)
        else:
            errors.append(ToolCallError(result, raw))
            kept.append(raw)
        position = end + len(CLOSE)
    return ParsedOutput("".join(kept).strip(), tuple(calls), tuple(errors))


def _parse_body(body: str, schemas: Mapping[str, Mapping[str, str]]) -> ToolCall | str:
    """A call, or the reason the block is malformed."""
    stripped = body.strip()
    if not stripped:
        return "empty tool call"
    if stripped.startswith("<function="):
        return _parse_xml(stripped, schemas)
    return _parse_json(stripped)


def _parse_json(body: str) -> ToolCall | str:
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        return f"tool call is not valid JSON: {exc.msg} at position {exc.pos}"
    if not isinstance(value, dict):
        return f"tool call JSON must be an object, got {type(value).__name__}"
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return "tool call has no \"name\" string"
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return f"tool call {name!r}: \"arguments\" is a string that is not JSON"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return f"tool call {name!r}: \"arguments\" must be an object, got {type(arguments).__name__}"
    return ToolCall(name.strip(), arguments)


def _parse_xml(body: str, schemas: Mapping[str, Mapping[str, str]]) -> ToolCall | str:
    match = _FUNCTION.fullmatch(body)
    if match is None:
        if "</function>" not in body:
            return "<function=...> is never closed by </function>"
        return "text outside <function=...>...</function> in the tool call"
    name = match.group(1).strip()
    if not name:
        return "<function=> has no name"
    inner = match.group(2)
    types = schemas.get(name, {})
    arguments: dict[str, Any] = {}
    position = 0
    for parameter in _PARAMETER.finditer(inner):
        between = inner[position:parameter.start()]
        if between.strip():
            return f"tool call {name!r}: unexpected text {between.strip()[:40]!r} between parameters"
        key = parameter.group(1).strip()
        if not key:
            return f"tool call {name!r}: <parameter=> has no name"
        arguments[key] = _xml_value(parameter.group(2), types.get(key))
        position = parameter.end()
    rest = inner[position:]
    if rest.strip():
        if "<parameter=" in rest:
            return f"tool call {name!r}: <parameter=...> is never closed by </parameter>"
        return f"tool call {name!r}: unexpected text {rest.strip()[:40]!r} after the parameters"
    return ToolCall(name, arguments)


def _xml_value(raw: str, json_type: Optional[str]) -> Any:
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    if json_type == "string":
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _parameter_types(tools: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """function name -> parameter name -> JSON schema type (only simple string types)."""
    types: dict[str, dict[str, str]] = {}
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function", tool)
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        properties = (function.get("parameters") or {}).get("properties") or {}
        if not isinstance(properties, Mapping):
            continue
        types[function["name"]] = {
            key: spec["type"] for key, spec in properties.items()
            if isinstance(spec, Mapping) and isinstance(spec.get("type"), str)
        }
    return types


# -- the agent's side: one parser per model family's tool-call syntax, chosen by chat format --------


class Qwen3ToolCallParser:
    """Qwen3's native syntax: ``<tool_call>`` blocks holding JSON (``{"name", "arguments"}``) or
    the XML parameter form (``<function=NAME><parameter=KEY>VALUE</parameter></function>``), any
    number per turn. The template's own rendering of a call is exactly the JSON form."""

    name = "qwen3"

    def parse(self, text: str, tools: Optional[Sequence[Mapping[str, Any]]] = None) -> ParsedOutput:
        return parse(text, tools)


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
