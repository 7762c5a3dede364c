"""Our tool-call parser against SGLang 0.5.23's Qwen detectors, case by case (issue 29).

Each case is a model output, the tools of the request, and the calls SGLang returns for it, written
out by hand from the detector's rules (the citation names the file and function in the
``sglang==0.5.23`` wheel, ``sglang/srt/function_call/``). The first test checks our parser against
those expectations. The second runs the same outputs through SGLang's own detector classes, from
the wheel ``make sglang-src`` installs (``tests/sglang_source.py``; its import chain's packages are
pinned in requirements/sglang-test.txt). ``tests/serve/test_tool_call_differential.py`` compares the two
on generated replies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

import sglang_source
from spade.agent.tool_calls import parse

Q25 = "qwen25_detector.py Qwen25Detector.detect_and_parse"
BASE = "base_format_detector.py BaseFormatDetector.parse_base_json"
COD = "qwen3_coder_detector.py Qwen3CoderDetector.detect_and_parse"
CONV = "qwen3_coder_detector.py Qwen3CoderDetector._convert_param_value"

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "ratio": {"type": "number"}, "tags": {"type": "array"}, "filter": {"type": "object"},
    "unit": {"enum": ["c", "f"]}, "note": {"type": ["null", "string"]}}}}}
LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {
    "q": {"type": "string"}}}}}
TOOLS = [WEATHER, LOOKUP]


@dataclass(frozen=True)
class Case:
    id: str
    detector: str  # "qwen25" or "qwen3_coder"
    text: str
    calls: tuple[tuple[str, Any], ...]  # (name, arguments) as SGLang returns them, arguments decoded
    why: str


def j(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


CASES = [
    Case("json-template-layout", "qwen25", "Checking.\n" + j('{"name": "lookup", "arguments": {"q": "x"}}'),
         (("lookup", {"q": "x"}),), f"{Q25}: bot_token '<tool_call>\\n', eot_token '\\n</tool_call>'"),
    Case("json-no-newlines", "qwen25", '<tool_call>{"name": "lookup", "arguments": {"q": "x"}}</tool_call>', (),
         f"{Q25}: the text has no '<tool_call>\\n', so no call"),
    Case("json-extra-blank-lines", "qwen25", '<tool_call>\n\n  {"name": "lookup", "arguments": {}}  \n\n</tool_call>',
         (("lookup", {}),), f"{Q25}: the body between the markers is stripped before json.loads"),
    Case("json-close-tag-in-string", "qwen25", j('{"name": "lookup", "arguments": {"q": "a</tool_call>b"}}'),
         (("lookup", {"q": "a</tool_call>b"}),), f"{Q25}: the block ends at '\\n</tool_call>', never inside a JSON string"),
    Case("json-array-of-calls", "qwen25",
         j('[{"name": "lookup", "arguments": {"q": "1"}}, {"name": "get_weather", "arguments": {"city": "P"}}]'),
         (("lookup", {"q": "1"}), ("get_weather", {"city": "P"})), f"{BASE}: a list is one call per item"),
    Case("json-list-arguments", "qwen25", j('{"name": "lookup", "arguments": [1, 2]}'),
         (("lookup", [1, 2]),), f"{BASE}: arguments are JSON-encoded as they stand"),
    Case("json-string-arguments", "qwen25", j('{"name": "lookup", "arguments": "{\\"q\\": 1}"}'),
         (("lookup", '{"q": 1}'),), f"{BASE}: a string is encoded as a string, not decoded"),
    Case("json-parameters-key", "qwen25", j('{"name": "lookup", "parameters": {"q": "p"}, "arguments": {"q": "a"}}'),
         (("lookup", {"q": "p"}),), f"{BASE}: `parameters or arguments`"),
    Case("json-no-arguments", "qwen25", j('{"name": "lookup"}'), (("lookup", {}),), f"{BASE}: default {{}}"),
    Case("json-unknown-name", "qwen25", j('{"name": "delete_all", "arguments": {}}') + "\n" +
         j('{"name": "lookup", "arguments": {}}'),
         (("lookup", {}),), f"{BASE}: a name not among the tools is skipped (SGLANG_FORWARD_UNKNOWN_TOOLS off)"),
    Case("json-missing-name", "qwen25", j('{"arguments": {"q": 1}}'), (), f"{BASE}: no name, skipped"),
    Case("json-bad-beside-good", "qwen25", j('{"name": "lookup", "arguments": {') + "\n" +
         j('{"name": "lookup", "arguments": {"q": "ok"}}'),
         (("lookup", {"q": "ok"}),), f"{Q25}: a block that is not JSON is skipped, the others kept"),
    Case("json-unclosed", "qwen25", '<tool_call>\n{"name": "lookup", "arguments": {}}', (),
         f"{Q25}: only complete blocks match"),
    Case("xml-typed-by-schema", "qwen3_coder",
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
         "<parameter=metric>\nTrue\n</parameter>\n<parameter=ratio>\n2\n</parameter>\n<parameter=tags>\n[\"a\"]\n"
         "</parameter>\n<parameter=filter>\n{'k': True}\n</parameter>\n<parameter=unit>\nc\n</parameter>\n"
         "<parameter=note>\nnull\n</parameter>\n</function>\n</tool_call>",
         (("get_weather", {"city": "Paris", "days": 3, "metric": True, "ratio": 2, "tags": ["a"], "filter": {"k": True},
                           "unit": "c", "note": None}),),
         f"{CONV}: int(), float() kept int without '.', 'true' in any case, json.loads then literal_eval, null"),
    Case("xml-bad-values-degrade", "qwen3_coder",
         "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n<parameter=metric>\nyes\n"
         "</parameter>\n<parameter=ratio>\n1.0\n</parameter>\n<parameter=extra>\n5\n</parameter>\n</function>\n</tool_call>",
         (("get_weather", {"days": "three", "metric": False, "ratio": 1.0, "extra": "5"}),),
         f"{CONV}: a failed int stays text, a non-true boolean is False, an unknown parameter stays text"),
    Case("xml-missing-close-parameter", "qwen3_coder",
         "<tool_call>\n<function=lookup>\n<parameter=q>\nfirst\n<parameter=days>\n2\n</function>\n</tool_call>",
         (("lookup", {"q": "first", "days": "2"}),),
         f"{COD}: a parameter runs to the next <parameter=, </function> or the end"),
    Case("xml-two-functions-one-block", "qwen3_coder",
         "<tool_call>\n<function=lookup>\n<parameter=q>\na\n</parameter>\n</function>\n<function=unknown_fn>\n"
         "<parameter=q>\n1\n</parameter>\n</function>\n</tool_call>",
         (("lookup", {"q": "a"}), ("unknown_fn", {"q": "1"})),
         f"{COD}: every function in a block; names are not checked against the tools"),
    Case("xml-unclosed-block", "qwen3_coder",
         "Sure.\n<tool_call>\n<function=lookup>\n<parameter=q>\nz\n</parameter>\n</function>",
         (("lookup", {"q": "z"}),), f"{COD}: with no complete block the whole text is searched for functions"),
    Case("json-tag-in-prose", "qwen25", "Use the <tool_call> tag.\n" + j('{"name": "lookup", "arguments": {}}'),
         (("lookup", {}),), f"{Q25}: a '<tool_call>' without its newline is not a bot_token"),
    Case("json-doubled-tag", "qwen25", "<tool_call>" + j('{"name": "lookup", "arguments": {}}'),
         (("lookup", {}),), f"{Q25}: the block starts at the tag that has the newline"),
    Case("json-doubled-tag-with-newline", "qwen25", "<tool_call>\n" + j('{"name": "lookup", "arguments": {}}'), (),
         f"{Q25}: the first '<tool_call>\n' starts the block, whose body is then not JSON"),
    Case("json-list-name-voids-reply", "qwen25",
         j('{"name": "lookup", "arguments": {}}') + "\n" + j('{"name": ["lookup"], "arguments": {}}'), (),
         f"{BASE}: `name in tool_indices` raises TypeError; serving_chat.py then returns no call"),
    Case("json-non-object-voids-reply", "qwen25",
         j('{"name": "lookup", "arguments": {}}') + "\n" + j('[{"name": "lookup"}, 3]'), (),
         f"{BASE}: `act.get` raises AttributeError; serving_chat.py then returns no call"),
    Case("xml-text-before-function", "qwen3_coder",
         "<tool_call>\nCalling:\n<function=lookup>\n<parameter=q>\na\n</parameter>\n</function>\n</tool_call>",
         (("lookup", {"q": "a"}),), f"{COD}: functions are searched anywhere in the block"),
    Case("xml-tag-in-prose", "qwen3_coder",
         "Use <tool_call> tags.\n<tool_call>\n<function=lookup>\n<parameter=q>\na\n</parameter>\n</function>\n"
         "</tool_call>", (("lookup", {"q": "a"}),), f"{COD}: the block runs from the prose's tag to </tool_call>"),
    Case("xml-function-before-unclosed-block", "qwen3_coder",
         "<function=lookup>\n<parameter=q>\na\n</parameter>\n</function>\n<tool_call>\n<function=lookup>\n"
         "<parameter=q>\nb", (("lookup", {"q": "a"}), ("lookup", {"q": "b"})),
         f"{COD}: with no closed block the whole text is searched, also before the first tag"),
    Case("xml-set-voids-reply", "qwen3_coder",
         "<tool_call>\n<function=lookup>\n<parameter=q>\na\n</parameter>\n</function>\n</tool_call>\n"
         "<tool_call>\n<function=get_weather>\n<parameter=tags>\n{1, 2}\n</parameter>\n</function>\n</tool_call>",
         (), f"{CONV}: literal_eval gives a set; json.dumps raises in detect_and_parse, which then returns no call"),
    Case("xml-null-untyped", "qwen3_coder",
         "<tool_call>\n<function=lookup>\n<parameter=q>\nNULL\n</parameter>\n</function>\n</tool_call>",
         (("lookup", {"q": None}),), f"{CONV}: 'null' in any case is None, whatever the type"),
]


def ours(case: Case) -> list[tuple[str, Any]]:
    return [(c.name, c.arguments) for c in parse(case.text, TOOLS).calls]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_our_parser_returns_what_the_detector_rules_return(case):
    assert ours(case) == list(case.calls), case.why


_DETECTORS: list = []


def _sglang_detectors():
    """SGLang 0.5.23's ``Tool`` and detector classes (``sglang_source.tool_call_detectors``, from
    ``make sglang-src``), imported once; its modules leave ``sys.modules`` again at once (the
    classes keep working), so the rest of the test process sees no ``sglang``."""
    if not _DETECTORS:
        found = sglang_source.tool_call_detectors()
        sglang_source.unload()
        _DETECTORS.append((found.tool, {"qwen25": found.qwen25, "qwen3_coder": found.qwen3_coder}))
    return _DETECTORS[0]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_sglang_detectors_agree(case):
    Tool, detectors = _sglang_detectors()
    try:
        result = detectors[case.detector]().detect_and_parse(case.text, [Tool(**t) for t in TOOLS])
        theirs = [(c.name, json.loads(c.parameters)) for c in result.calls]
    except Exception:  # noqa: BLE001 - serving_chat.py _process_tool_calls: no call for the reply
        theirs = []
    assert theirs == list(case.calls), case.why
    assert ours(case) == theirs
