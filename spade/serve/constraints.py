"""A chat request's output constraint (``response_format``, ``tool_choice``) as an engine ``Constraint``.

What SGLang 0.5.23's ``serving_chat.py`` sends in ``sampling_params``, restated:

* ``response_format: {"type": "json_object"}`` -> ``json_schema`` ``{"type": "object"}``;
* ``response_format: {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`` ->
  ``json_schema`` with the schema (required: SGLang answers 400 without it);
* ``tool_choice: "required"`` or ``{"type": "function", "function": {"name"}}`` -> the structural
  tag SGLang builds for Qwen's tool-call syntax (``FunctionCallParser.get_structure_constraint``
  -> ``get_legacy_structural_tag(at_least_one=True)``, ``Qwen25Detector.structure_info``): a
  block per call that opens with ``<tool_call>\n{"name":"NAME", "arguments":`` and closes with
  ``}\n</tool_call>``, the arguments following the tool's ``parameters`` when the tool is
  ``strict`` (any JSON otherwise, "per OpenAI protocol semantics" as SGLang's comment says), as
  xgrammar's triggered tags (trigger ``<tool_call>``) with ``at_least_one``: the reply opens with
  a call. The text is then parsed by the ordinary tool-call path (``spade.agent.tool_calls``), so
  the calls come back as ``tool_calls`` with ``finish_reason: "tool_calls"``. Two choices beyond
  SGLang 0.5.23, which lists every tool and ignores ``parallel_tool_calls`` on this path: a named
  choice allows that function only, and ``parallel_tool_calls: false`` stops after the first call
  (xgrammar's ``stop_after_first``).

SGLang's own grammar fields, ``regex`` and ``ebnf`` (a request's extra fields, both endpoints), are
sent as they are: ``regex`` the whole reply matches, ``ebnf`` a grammar whose root rule is
``root``. At most one of them, ``response_format`` (other than text) and a constraining
``tool_choice`` per request.

A request's tool ``parameters`` are checked against JSON Schema's meta-schema, as SGLang's
``serving_chat.py`` checks them (``Draft202012Validator.check_schema``, after mapping DB-style type
names such as ``varchar`` or ``int``; here any type name outside JSON Schema's is let through
unchecked, so no schema SGLang takes is refused): a bad one is a 400 naming the tool.

Schemas and grammars are checked before anything is generated (``jsonschema``'s meta-schema check and
xgrammar's converter); a bad one is a 400 naming the field. The constraint applies from the first
generated token, so a reply that would start inside a thinking model's reasoning is refused
(turn thinking off with ``chat_template_kwargs``).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence

from spade.agent import tool_calls as tool_parser
from spade.rollout.engine import Constraint

from .protocol import APIError

JSON_OBJECT_SCHEMA = '{"type": "object"}'  # serving_chat's json_object


def response_format_constraint(format_: Optional[Mapping[str, Any]]) -> Optional[Constraint]:
    """The constraint of a parsed ``response_format`` (None for text)."""
    if format_ is None or format_.get("type") == "text":
        return None
    if format_["type"] == "json_object":
        return Constraint("json_schema", JSON_OBJECT_SCHEMA)
    spec = format_.get("json_schema")
    where = "response_format.json_schema"
    if not isinstance(spec, Mapping):
        raise APIError(f"{where} must be an object with a schema", where)
    if "schema" not in spec:
        raise APIError(f"{where}.schema is required", f"{where}.schema")
    schema = spec["schema"]
    if not isinstance(schema, (Mapping, bool)):
        raise APIError(f"{where}.schema must be a JSON schema object", f"{where}.schema")
    check_schema(schema, f"{where}.schema")
    return Constraint("json_schema", json.dumps(schema))


def grammar_constraint(grammar: Optional[tuple[str, str]]) -> Optional[Constraint]:
    """The constraint of a request's ``regex`` / ``ebnf`` field (None without one)."""
    if grammar is None:
        return None
    kind, spec = grammar
    xgrammar = _xgrammar(kind)
    try:
        xgrammar.Grammar.from_regex(spec) if kind == "regex" else xgrammar.Grammar.from_ebnf(spec)
    except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError for a grammar it cannot read
        raise APIError(f"{kind} cannot be used for constrained decoding: {_last_line(exc)}", kind) from None
    return Constraint(kind, spec)


_SCHEMA_TYPES = {"null", "boolean", "object", "array", "number", "string", "integer"}


def check_tool_parameters(tools: Optional[Sequence[Mapping[str, Any]]]) -> None:
    """A 400 naming the tool whose ``parameters`` is not a valid JSON schema (module docstring)."""
    try:
        import jsonschema
    except ImportError:  # the check needs requirements/constrained.txt; without it nothing is refused
        return
    for i, tool in enumerate(tools or ()):
        parameters = tool["function"].get("parameters")
        if parameters is None:
            continue
        where = f"tools[{i}].function.parameters"
        try:
            jsonschema.Draft202012Validator.check_schema(_standard_types(parameters))
        except jsonschema.SchemaError as exc:
            raise APIError(f"{where} is not a valid JSON schema: {exc.message}", where) from None
        except RecursionError:
            raise APIError(f"{where} is nested too deeply", where) from None


def _standard_types(schema: Any) -> Any:
    """``schema`` with every ``type`` name outside JSON Schema's replaced by ``string``."""
    if isinstance(schema, list):
        return [_standard_types(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {key: _standard_types(value) for key, value in schema.items()}
    kind = out.get("type")
    if isinstance(kind, str) and kind not in _SCHEMA_TYPES:
        out["type"] = "string"
    elif isinstance(kind, list):
        out["type"] = [k if not isinstance(k, str) or k in _SCHEMA_TYPES else "string" for k in kind]
    return out


def _xgrammar(param: str) -> Any:
    try:
        import xgrammar
    except ImportError:
        raise APIError("constrained decoding needs xgrammar on the server (requirements/constrained.txt)",
                       param, 501, "server_error") from None
    return xgrammar


def _last_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return lines[-1] if lines else type(exc).__name__


def tool_choice_constraint(choice: Any, tools: Optional[Sequence[Mapping[str, Any]]],
                           parallel: bool) -> Optional[Constraint]:
    """The constraint of ``tool_choice`` "required" or a named function (None otherwise)."""
    if choice in (None, "auto", "none"):
        return None
    if not tools:
        raise APIError("tool_choice requires tools", "tool_choice")
    if isinstance(choice, Mapping):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        names = [t["function"]["name"] for t in tools]
        if name not in names:
            raise APIError(f"tool_choice names function {json.dumps(name)}, which is not among the "
                           f"tools ({', '.join(names)})", "tool_choice.function.name")
    else:
        name = None
    tags = []
    for i, tool in enumerate(tools):
        function = tool["function"]
        if name is not None and function["name"] != name:
            continue
        schema: Any = {}
        if function.get("strict"):
            schema = function.get("parameters") or {"type": "object", "properties": {}}
            check_schema(schema, f"tools[{i}].function.parameters")
        tags.append({"type": "tag",
                     "begin": tool_parser.JSON_OPEN + '{"name":' + json.dumps(function["name"])
                     + ', "arguments":',
                     "content": {"type": "json_schema", "json_schema": schema},
                     "end": "}" + tool_parser.JSON_CLOSE})
    tag = {"type": "structural_tag",
           "format": {"type": "triggered_tags", "triggers": [tool_parser.OPEN], "tags": tags,
                      "at_least_one": True, "stop_after_first": not parallel}}
    return Constraint("structural_tag", json.dumps(tag))


def check_schema(schema: Any, param: str) -> None:
    """A 400 naming ``param`` unless ``schema`` is a valid JSON schema that xgrammar can follow."""
    try:
        import jsonschema
        import xgrammar
    except ImportError:
        raise APIError("constrained decoding needs xgrammar and jsonschema on the server "
                       "(requirements/constrained.txt)", param, 501, "server_error") from None
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise APIError(f"{param} is not a valid JSON schema: {exc.message}", param) from None
    try:
        xgrammar.Grammar.from_json_schema(json.dumps(schema))
    except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError for what it cannot convert
        raise APIError(f"{param} cannot be used for constrained decoding: "
                       f"{str(exc).strip().splitlines()[-1]}", param) from None
