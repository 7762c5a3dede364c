"""The tool-call parser: Qwen3's JSON form, the XML parameter form, several calls, malformed
blocks reported as errors (never raised), and text without calls."""

from __future__ import annotations

import json

from spade.agent.tool_calls import ParsedOutput, ToolCall, has_tool_call, parse

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"}}},
    },
}


def test_json_form_with_surrounding_content():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
            '"days": 3}}\n</tool_call>')
    result = parse(text)
    assert result.content == "Let me check."
    assert result.calls == (ToolCall("get_weather", {"city": "Paris", "days": 3}),)
    assert result.errors == ()
    content, calls = result
    assert content == "Let me check." and calls == [ToolCall("get_weather", {"city": "Paris", "days": 3})]
    assert json.loads(calls[0].arguments_json()) == {"city": "Paris", "days": 3}


def test_json_form_accepts_string_arguments_and_parameters_key():
    double = '<tool_call>{"name": "f", "arguments": "{\\"x\\": [1, 2]}"}</tool_call>'
    assert parse(double).calls == (ToolCall("f", {"x": [1, 2]}),)
    alias = '<tool_call>{"name": "g", "parameters": {"y": null}}</tool_call>'
    assert parse(alias).calls == (ToolCall("g", {"y": None}),)
    bare = '<tool_call>{"name": "h"}</tool_call>'
    assert parse(bare).calls == (ToolCall("h", {}),)


def test_xml_form_typed_by_schema_and_by_json():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
            "<parameter=days>\n2\n</parameter>\n<parameter=zip>\n10001\n</parameter>\n"
            "</function>\n</tool_call>")
    with_schema = parse(text, [WEATHER_TOOL])
    assert with_schema.errors == ()
    assert with_schema.calls == (ToolCall("get_weather", {"city": "New York", "days": 2, "zip": "10001"}),)
    assert with_schema.content == ""
    # without a schema, values that are JSON are read as JSON, others stay text
    assert parse(text).calls[0].arguments == {"city": "New York", "days": 2, "zip": 10001}
    multiline = "<tool_call><function=write><parameter=body>\nline 1\nline 2\n</parameter></function></tool_call>"
    assert parse(multiline).calls == (ToolCall("write", {"body": "line 1\nline 2"}),)


def test_several_calls_in_order_mixed_forms():
    text = ('<tool_call>{"name": "a", "arguments": {"i": 1}}</tool_call>\n'
            "between\n"
            "<tool_call><function=b><parameter=j>two</parameter></function></tool_call>"
            '<tool_call>{"name": "c", "arguments": {}}</tool_call>')
    result = parse(text)
    assert [c.name for c in result.calls] == ["a", "b", "c"]
    assert result.calls[1].arguments == {"j": "two"}
    assert result.content == "between"
    assert result.errors == ()


def test_malformed_blocks_are_errors_and_stay_in_content():
    cases = {
        '<tool_call>{"name": "f", "arguments": {"x": 1}</tool_call>': "not valid JSON",
        '<tool_call>{"arguments": {}}</tool_call>': "no \"name\"",
        '<tool_call>["f"]</tool_call>': "must be an object",
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>': "must be an object",
        "<tool_call>   </tool_call>": "empty",
        "<tool_call><function=f><parameter=x>1</function></tool_call>": "never closed by </parameter>",
        "<tool_call><function=f><parameter=x>1</parameter></tool_call>": "never closed by </function>",
        '<tool_call>{"name": "f", "arguments": {"x": ': "never closed",
    }
    for text, reason in cases.items():
        result = parse("before " + text)
        assert result.calls == (), text
        assert len(result.errors) == 1, text
        assert reason in result.errors[0].message, (text, result.errors[0].message)
        assert text.strip() in result.content, text  # nothing the model wrote is lost
        assert result.errors[0].raw.strip() == text.strip()


def test_good_calls_survive_a_bad_neighbour():
    text = ('<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
            "<tool_call>{broken}</tool_call>")
    result = parse(text)
    assert result.calls == (ToolCall("ok", {}),)
    assert len(result.errors) == 1 and result.content == "<tool_call>{broken}</tool_call>"


def test_no_call():
    for text in ("", "Just an answer.", "  mentions tool_call without markers  "):
        result = parse(text)
        assert result == ParsedOutput(text.strip())
        assert not has_tool_call(text)
    assert has_tool_call("x <tool_call>")
