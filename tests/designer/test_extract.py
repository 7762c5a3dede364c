"""Tests for spade.designer.extract: code selection and f-string brace repair."""

import ast
import dataclasses
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spade.designer.extract import Extraction, extract_code, repair_fstring_braces

FENCE = "`" * 3


def fenced(code, tag="python"):
    return f"{FENCE}{tag}\n{code}\n{FENCE}"


def parses(code):
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


# ---------------------------------------------------------------- selection


def test_extraction_is_frozen():
    result = extract_code("x = 1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.code = "y = 2"


def test_fenced_python_block():
    result = extract_code("Here is the env:\n" + fenced("x = 1") + "\nEnjoy.")
    assert result == Extraction("x = 1", True, 0, None)


@pytest.mark.parametrize("tag", ["python", "py", "Python", "python3"])
def test_python_tags(tag):
    assert extract_code(fenced("x = 1", tag)).code == "x = 1"


def test_unfenced_response_is_whole_text():
    result = extract_code("\nclass GuessEnv:\n    pass\n")
    assert result.code == "class GuessEnv:\n    pass"
    assert not result.from_fence
    assert result.syntax_error is None


def test_first_python_block_wins():
    response = fenced("a = 1") + "\ntext\n" + fenced("b = 2")
    assert extract_code(response).code == "a = 1"


def test_python_block_preferred_over_bare_and_other_tags():
    response = fenced("not code", "") + "\n" + fenced("{}", "json") + "\n" + fenced("c = 3")
    assert extract_code(response).code == "c = 3"


def test_bare_fence_used_without_python_block():
    response = fenced('{"k": 1}', "json") + "\n" + fenced("d = 4", "")
    result = extract_code(response)
    assert result.code == "d = 4"
    assert result.from_fence


def test_other_language_only_means_whole_text():
    response = fenced("echo hi", "bash")
    result = extract_code(response)
    assert not result.from_fence
    assert result.code == response


def test_unterminated_fence_runs_to_end():
    response = "Sure!\n" + FENCE + "python\nclass A:\n    x = 1\n    def f(self):\n        return 2"
    result = extract_code(response)
    assert result.from_fence
    assert result.code == "class A:\n    x = 1\n    def f(self):\n        return 2"
    assert result.syntax_error is None


def test_truncated_code_reports_syntax_error():
    result = extract_code(FENCE + "python\ndef f(:\n")
    assert result.from_fence
    assert result.syntax_error is not None
    assert "line" in result.syntax_error


def test_fence_inside_string_at_line_middle_is_not_a_close():
    code = 'DOC = "use ' + FENCE + 'x' + FENCE + ' here"\ny = 2'
    assert extract_code(fenced(code)).code == code


def test_longer_fence_allows_inner_triple_backticks():
    code = f'HELP = """\n{FENCE}\nexample\n{FENCE}\n"""'
    response = "````python\n" + code + "\n````"
    assert extract_code(response).code == code


def test_indented_fence_is_dedented():
    response = "1. Code:\n   " + FENCE + "python\n   class A:\n       x = 1\n   " + FENCE
    result = extract_code(response)
    assert result.code == "class A:\n    x = 1"
    assert result.syntax_error is None


def test_crlf_line_endings():
    response = "intro\r\n" + FENCE + "python\r\nx = 1\r\ny = 2\r\n" + FENCE + "\r\n"
    result = extract_code(response)
    assert result.from_fence
    assert result.syntax_error is None
    assert ast.dump(ast.parse(result.code)) == ast.dump(ast.parse("x = 1\ny = 2"))


def test_think_block_is_skipped():
    response = "<think>Draft:\n" + fenced("draft = True") + "\n</think>\n" + fenced("final = True")
    assert extract_code(response).code == "final = True"


def test_unclosed_think_is_all_reasoning():
    """A reply cut inside its reasoning has no answer, so no code (SGLang's ``qwen3`` reading,
    ``spade.agent.reasoning``), even when the reasoning drafted some."""
    response = "<think>I will write it.\n" + fenced("z = 0")
    assert extract_code(response).code == ""
    assert extract_code("Plan: <think>draft\n</think>\n" + fenced("z = 0")).code == "z = 0"


def test_think_only_with_whitespace_before():
    response = "\n  <think>no</think>\nw = 1"
    result = extract_code(response)
    assert result.code == "w = 1"
    assert not result.from_fence


def test_empty_response():
    assert extract_code("") == Extraction("", False, 0, None)


# ---------------------------------------------------------------- repair


@pytest.mark.parametrize(
    ("broken", "fixed"),
    [
        ('msg = f"Pick a cell {1-indexed row}"', 'msg = f"Pick a cell {{1-indexed row}}"'),
        ('msg = f"Sets look like {}"', 'msg = f"Sets look like {{}}"'),
        ('msg = f"Enter {a b} now"', 'msg = f"Enter {{a b}} now"'),
        ("msg = f'Format: {row col: ints}'", "msg = f'Format: {{row col: ints}}'"),
        ('msg = F"{x} and {a b}"', 'msg = F"{x} and {{a b}}"'),
        ('msg = rf"\\d+ {a b}"', 'msg = rf"\\d+ {{a b}}"'),
        ('msg = fR"\\w {a b}"', 'msg = fR"\\w {{a b}}"'),
        ("msg = f'''Use {move x y}'''", "msg = f'''Use {{move x y}}'''"),
        ('msg = f"a } b"', 'msg = f"a }} b"'),
        ('msg = f"open { only"', 'msg = f"open {{ only"'),
        ('msg = f"{it\'s fine}"', 'msg = f"{{it\'s fine}}"'),
        ('msg = f"{value!q}"', 'msg = f"{{value!q}}"'),
        ('msg = f"{a\\nb}"', 'msg = f"{{a\\nb}}"'),
    ],
)
def test_bad_fields_are_escaped(broken, fixed):
    assert not parses(broken)
    code, repairs = repair_fstring_braces(broken)
    assert code == fixed
    assert repairs >= 1
    assert parses(code)


def test_one_indexed_expression_is_valid_and_untouched():
    # {1-indexed} is the expression 1 - indexed: it parses, so nothing changes.
    code = 'msg = f"cells are {1-indexed}"'
    assert repair_fstring_braces(code) == (code, 0)


def test_one_indexed_on_broken_line_is_kept_as_a_field():
    code = 'msg = f"{1-indexed} {one indexed}"'
    fixed, repairs = repair_fstring_braces(code)
    assert fixed == 'msg = f"{1-indexed} {{one indexed}}"'
    assert repairs == 1


def test_good_fields_and_escapes_left_intact():
    code = (
        'msg = f"{{literal}} {name!r:>10} {x=} {d[\'k\']} {v:{width}.{prec}f} '
        '{ {1: 2}[1] } {a b} {f(x, y)} {{}}"'
    )
    fixed, repairs = repair_fstring_braces(code)
    assert repairs == 1
    assert fixed == code.replace("{a b}", "{{a b}}")
    assert parses(fixed)


def test_triple_quoted_fstring_spanning_lines():
    code = 'def help():\n    return f"""\n    Rules:\n    Send {row col} or {{quit}}.\n    Score: {score}\n    """\n'
    fixed, repairs = repair_fstring_braces(code)
    assert repairs == 1
    assert fixed == code.replace("{row col}", "{{row col}}")
    assert parses(fixed)


def test_named_unicode_escape_is_not_a_field():
    code = 'msg = f"\\N{BULLET} {a b}"'
    fixed, _ = repair_fstring_braces(code)
    assert fixed == 'msg = f"\\N{BULLET} {{a b}}"'
    assert parses(fixed)


def test_raw_fstring_backslash_n_brace_is_a_field():
    code = 'msg = rf"\\N{x y}"'
    fixed, repairs = repair_fstring_braces(code)
    assert fixed == 'msg = rf"\\N{{x y}}"'
    assert repairs == 1


def test_plain_strings_and_other_code_untouched():
    code = textwrap.dedent(
        '''
        TEMPLATE = "{a b}"
        BYTES = b"{x y}"
        data = {"k": {1, 2}}
        msg = f"bad {a b}"
        '''
    )
    fixed, repairs = repair_fstring_braces(code)
    assert repairs == 1
    assert fixed == code.replace('f"bad {a b}"', 'f"bad {{a b}}"')


def test_several_lines_need_several_passes():
    code = textwrap.dedent(
        '''
        class GridEnv:
            def reset(self, seed=None):
                return f"Send {row col}", {}

            def step(self, action):
                hint = f"use {} for sets"
                return f"Moves are {1-indexed row}", 0.0, False, False, {}
        '''
    )
    for passes in (1, 2):
        partial, repairs = repair_fstring_braces(code, max_passes=passes)
        assert repairs == passes
        assert not parses(partial)
    fixed, repairs = repair_fstring_braces(code)
    assert repairs == 3
    assert parses(fixed)
    assert "{{row col}}" in fixed and "{{}}" in fixed and "{{1-indexed row}}" in fixed

    result = extract_code(fenced(code), max_repair_passes=2)
    assert result.repairs == 2
    assert result.syntax_error is not None


def test_extract_reports_repairs():
    result = extract_code(fenced('print(f"{a b}")'))
    assert result == Extraction('print(f"{{a b}}")', True, 1, None)


def test_non_fstring_syntax_error_stays():
    code = 'msg = f"ok {x}"\ndef broken(:\n    pass\n'
    result = extract_code(fenced(code))
    assert result.code == code.strip()
    assert result.repairs == 0
    assert result.syntax_error is not None
    assert "line 2" in result.syntax_error


def test_fstring_fix_then_other_error_is_reported():
    code = 'msg = f"{a b}"\nx = = 1\n'
    result = extract_code(code)
    assert result.repairs == 1
    assert 'f"{{a b}}"' in result.code
    assert "line 2" in result.syntax_error


def test_unrepairable_fstring_reports_error():
    # Reusing the enclosing quote is a 3.11 error the repair cannot undo.
    result = extract_code('x = f"{d["k"]}"')
    if parses('x = f"{d["k"]}"'):  # Python >= 3.12 accepts it (PEP 701): nothing to report there
        assert result.syntax_error is None and result.repairs == 0
    else:
        assert result.syntax_error is not None


def test_nul_byte_is_reported_not_raised():
    result = extract_code('x = "a\x00b"\n')
    assert result.syntax_error is not None
    assert result.repairs == 0


def test_nul_byte_with_bad_fstring_does_not_raise():
    result = extract_code('x = f"{a b}"\x00\n')
    assert result.syntax_error is not None


def test_deep_parentheses_do_not_crash():
    result = extract_code("x = " + "(" * 10_000 + "1" + ")" * 10_000)
    assert result.syntax_error is not None


def test_unclosed_deep_parentheses_do_not_crash():
    result = extract_code("x = f'{a b}' + " + "(" * 10_000)
    assert result.syntax_error is not None


def test_deep_unary_chain_does_not_crash():
    result = extract_code("x = " + "-" * 200_000 + "1")
    assert result.syntax_error is not None


def test_deeply_nested_fstring_field_does_not_crash():
    code = 'x = f"{' + "(" * 5_000 + "a b" + ")" * 5_000 + '}"'
    fixed, _ = repair_fstring_braces(code)
    assert isinstance(fixed, str)


def test_tokenize_errors_are_tolerated():
    code = 'if True:\n        x = f"{a b}"\n    y = 1\n'  # bad dedent
    fixed, repairs = repair_fstring_braces(code)
    assert isinstance(fixed, str) and repairs >= 0


def test_zero_passes_changes_nothing():
    assert repair_fstring_braces('f"{a b}"', max_passes=0) == ('f"{a b}"', 0)


# ---------------------------------------------------------------- properties

CODE_ALPHABET = st.sampled_from(list("abxy019 _:!=.,'\"{}()[]\\\n+-*rRfF") + ["f'", 'f"', "f'''", "\n    "])


@given(st.text())
def test_extract_never_raises_on_text(text):
    result = extract_code(text)
    assert isinstance(result, Extraction)


@settings(max_examples=300)
@given(st.lists(CODE_ALPHABET, max_size=40).map("".join))
def test_extract_never_raises_on_code_like_text(text):
    result = extract_code(text)
    if result.syntax_error is None:
        ast.parse(result.code)


def _braces(code: str) -> int:
    return code.count("{") + code.count("}")


def _without_braces(code: str) -> str:
    return code.replace("{", "").replace("}", "")


# f-strings whose fields are often broken, so that about a third of the examples need a repair
# (the code-like text alone almost never does)
BROKEN_FIELDS = st.lists(st.sampled_from(list("ab1 {}{}:!.()'") + ["{a b}", "{x}", "}", "{"]), max_size=12)
FSTRING_LINE = st.builds(lambda lead, quote, body: f"{lead}f{quote}{body}{quote}",
                         st.sampled_from(["", "x = ", "print(", "y = 1\nz = "]), st.sampled_from(['"', "'"]),
                         BROKEN_FIELDS.map("".join))


@given(st.one_of(st.lists(CODE_ALPHABET, max_size=30).map("".join), FSTRING_LINE))
def test_repair_result_parses_when_no_error_reported(text):
    result = extract_code(fenced(text))
    selected = extract_code(fenced(text), max_repair_passes=0).code  # the same code, nothing repaired
    if result.repairs == 0:
        assert result.code == selected
    else:  # only code that does not parse is repaired, and only by escaping braces: one or two per repair
        with pytest.raises((SyntaxError, ValueError)):
            ast.parse(selected)
        assert _without_braces(result.code) == _without_braces(selected)
        added = _braces(result.code) - _braces(selected)
        assert result.repairs <= added <= 2 * result.repairs
    if result.syntax_error is None:
        ast.parse(result.code)
    else:
        with pytest.raises((SyntaxError, ValueError)):
            ast.parse(result.code)


FIELD_TEXT = st.text(st.sampled_from(list("ab1 -,:!'()[]{}")), max_size=12)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.text("xyz .", max_size=5), FIELD_TEXT), min_size=1, max_size=4))
def test_fstring_with_random_fields_repairs_or_reports(parts):
    body = "".join(text + "{" + field + "}" for text, field in parts)
    code = f'msg = f"{body}"\n'
    fixed, repairs = repair_fstring_braces(code)
    if parses(fixed):
        # Only braces were doubled: the literal text is otherwise unchanged.
        assert fixed.replace("{", "").replace("}", "") == code.replace("{", "").replace("}", "")


VALID_SNIPPETS = st.sampled_from(
    [
        "x = 1",
        'msg = f"{x} {{y}}"',
        "d = {'a': {1, 2}}",
        "s = '{not a field}'",
        'r = rf"\\d{n}"',
        "def f(a, b=2):\n    return f'{a!r:>{b}}'",
        "class A:\n    t = f'''{1-indexed}\n{x=}'''",
        "",
    ]
)


@given(st.lists(VALID_SNIPPETS, max_size=6).map("\n".join))
def test_repair_is_identity_on_valid_code(code):
    assert parses(code)
    assert repair_fstring_braces(code) == (code, 0)
    result = extract_code(fenced(code))
    assert result.repairs == 0 and result.syntax_error is None
    assert result.code == code.strip()


@given(st.text())
def test_repair_is_identity_whenever_code_parses(text):
    if parses(text):
        assert repair_fstring_braces(text) == (text, 0)


# -- selfplay.code_extraction (issue 39): spade (default) against the released extraction -----------

FENCE = "`" * 3


@pytest.mark.parametrize(
    ("response", "spade_code", "released_code"),
    [
        # a block written inside the reasoning: set aside by spade, the first block for the release
        (f"<think>draft\n{FENCE}python\nx = 1\n{FENCE}\n</think>\nfinal\n{FENCE}python\ny = 2\n{FENCE}\n",
         "y = 2", "x = 1"),
        # only ```python followed by a newline counts for the release
        (f"{FENCE}py\nz = 3\n{FENCE}", "z = 3", f"{FENCE}py\nz = 3\n{FENCE}"),
        (f"{FENCE}python3\nz = 3\n{FENCE}", "z = 3", f"{FENCE}python3\nz = 3\n{FENCE}"),
        # an unclosed fence (cut by the token limit): spade reads to the end, the release takes the reply
        (f"intro\n{FENCE}python\nw = 4\n", "w = 4", f"intro\n{FENCE}python\nw = 4\n"),
        # the release keeps the block as written: no dedent, no strip
        (f"{FENCE}python\n  v = 5\n{FENCE}", "v = 5", "  v = 5"),
        (f"{FENCE}python\n\nu = 6\n\n{FENCE}", "u = 6", "\nu = 6\n"),
    ],
)
def test_code_extraction_selects_the_block_each_way(response, spade_code, released_code):
    assert extract_code(response).code == spade_code  # the default is unchanged
    assert extract_code(response, how="spade").code == spade_code
    released = extract_code(response, how="released")
    assert released.code == released_code
    assert released.from_fence == (released_code != response)  # no closed python block: the whole reply


def test_released_repair_escapes_every_bad_brace_pair_on_the_error_line_only():
    code = "x = {'a': 1}; print(f\"pick {a b}\")\nlabel = f\"{row col}\"\n"
    spade = extract_code(code)
    # spade: the f-string fields alone, first on the error line, then wherever they are
    assert spade.code == "x = {'a': 1}; print(f\"pick {{a b}}\")\nlabel = f\"{{row col}}\"" and spade.repairs == 2
    released = extract_code(code, how="released")
    # the release: the dict literal on the error line is escaped too (it parses, as a set holding a dict),
    # then the next pass reaches line 2
    assert released.code == "x = {{'a': 1}}; print(f\"pick {{a b}}\")\nlabel = f\"{{row col}}\"\n"
    assert released.repairs == 3 and released.syntax_error is None


def test_released_repair_stops_when_the_error_line_has_nothing_to_escape():
    code = "def f(:\n    return f\"{a b}\"\n"
    released = extract_code(code, how="released")
    assert released.code == code and released.repairs == 0 and "line 1" in released.syntax_error
    # an empty field on the error line is escaped as well (ast reads an empty expression as an error)
    assert extract_code("s = f\"{}\"\n", how="released").code == "s = f\"{{}}\"\n"
    # while the line still fails, each pass escapes the innermost pair again (the released loop does):
    # one more pair per pass, up to the pass limit
    grown = extract_code("s = f\"{}\" + {\n", how="released", max_repair_passes=3)
    assert grown.code == "s = f\"{{{{}}}}\" + {\n" and grown.repairs == 3


def test_unknown_code_extraction_is_refused():
    from spade.config import ConfigError, from_mapping
    from spade.selfplay.settings import SelfPlaySettings

    with pytest.raises(ValueError, match="selfplay.code_extraction: 'first'.*spade, released"):
        extract_code("x = 1", how="first")
    assert SelfPlaySettings().code_extraction == "spade"
    with pytest.raises(ConfigError, match="selfplay.code_extraction: 'first' is not allowed; choose one of"):
        from_mapping(SelfPlaySettings, {"code_extraction": "first"}, where="selfplay")
