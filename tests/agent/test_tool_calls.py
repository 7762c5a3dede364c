"""The tool-call parser (SGLang's qwen25 / qwen3_coder rules; tests/agent/test_tool_call_parity.py has the
case table against the detectors): Qwen3's JSON form, the XML parameter form, several calls, malformed
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


def test_json_form_keeps_arguments_as_written_and_prefers_parameters():
    # Qwen25Detector hands parse_base_json the body; it JSON-encodes `parameters or arguments`
    # as it stands, so a double-encoded string stays a string (not decoded into an object)
    double = '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": [1, 2]}"}\n</tool_call>'
    assert parse(double).calls == (ToolCall("f", '{"x": [1, 2]}'),)
    alias = '<tool_call>\n{"name": "g", "parameters": {"y": null}}\n</tool_call>'
    assert parse(alias).calls == (ToolCall("g", {"y": None}),)
    bare = '<tool_call>\n{"name": "h"}\n</tool_call>'
    assert parse(bare).calls == (ToolCall("h", {}),)


def test_xml_form_typed_by_schema():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
            "<parameter=days>\n2\n</parameter>\n<parameter=zip>\n10001\n</parameter>\n"
            "</function>\n</tool_call>")
    with_schema = parse(text, [WEATHER_TOOL])
    assert with_schema.errors == ()
    assert with_schema.calls == (ToolCall("get_weather", {"city": "New York", "days": 2, "zip": "10001"}),)
    assert with_schema.content == ""
    # without a schema every value stays text (Qwen3CoderDetector._convert_param_value)
    assert parse(text).calls[0].arguments == {"city": "New York", "days": "2", "zip": "10001"}
    multiline = "<tool_call><function=write><parameter=body>\nline 1\nline 2\n</parameter></function></tool_call>"
    assert parse(multiline).calls == (ToolCall("write", {"body": "line 1\nline 2"}),)


def test_several_calls_in_order_mixed_forms():
    text = ('<tool_call>\n{"name": "a", "arguments": {"i": 1}}\n</tool_call>\n'
            "between\n"
            "<tool_call><function=b><parameter=j>two</parameter></function></tool_call>"
            '<tool_call>\n{"name": "c", "arguments": {}}\n</tool_call>')
    result = parse(text)
    assert [c.name for c in result.calls] == ["a", "b", "c"]
    assert result.calls[1].arguments == {"j": "two"}
    assert result.content == "between"
    assert result.errors == ()


def test_malformed_blocks_are_errors_and_stay_in_content():
    cases = {
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}\n</tool_call>': "not valid JSON",
        '<tool_call>\n{"arguments": {}}\n</tool_call>': "no \"name\"",
        '<tool_call>\n["f"]\n</tool_call>': "must be an object",
        "<tool_call>\n   \n</tool_call>": "not valid JSON",
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>': "followed by a newline",
        "<tool_call><function=f</function></tool_call>": "no <function=NAME>",
        '<tool_call>\n{"name": "f", "arguments": {"x": ': "never closed",
    }
    for text, reason in cases.items():
        result = parse("before " + text)
        assert result.calls == (), text
        assert len(result.errors) == 1, text
        assert reason in result.errors[0].message, (text, result.errors[0].message)
        assert text.strip() in result.content, text  # nothing the model wrote is lost
        assert result.errors[0].raw.strip() == text.strip()


def test_good_calls_survive_a_bad_neighbour():
    text = ('<tool_call>\n{"name": "ok", "arguments": {}}\n</tool_call>'
            "<tool_call>\n{broken}\n</tool_call>")
    result = parse(text)
    assert result.calls == (ToolCall("ok", {}),)
    assert len(result.errors) == 1 and result.content == "<tool_call>\n{broken}\n</tool_call>"


def test_no_call():
    for text in ("", "Just an answer.", "  mentions tool_call without markers  "):
        result = parse(text)
        assert result == ParsedOutput(text.strip())
        assert not has_tool_call(text)
    assert has_tool_call("x <tool_call>")
