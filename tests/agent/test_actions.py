r"""Tests for spade.agent.actions: the \boxed{} action protocol (SPEC section 4)."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from spade.agent.actions import boxed_contents, parse_action


@pytest.mark.parametrize(
    ("response", "action"),
    [
        (r"I move left. \boxed{left}", r"\boxed{left}"),
        (r"\boxed{  up  }", r"\boxed{up}"),
        (r"first \boxed{a} then \boxed{b}", r"\boxed{b}"),
        (r"The answer is \boxed{\frac{1}{2}}.", r"\boxed{\frac{1}{2}}"),
        (r"\boxed{{a}{b{c}}}", r"\boxed{{a}{b{c}}}"),
        (r"\boxed {7}", r"\boxed{7}"),
        ("\\boxed\n{7}", r"\boxed{7}"),
        (r"\boxed{}", r"\boxed{}"),
        (r"\boxed{ok} and then \boxed{unfinished", r"\boxed{ok}"),
        (r"\boxed{outer \boxed{inner}} tail", r"\boxed{outer \boxed{inner}}"),
        (r"\boxed{never closed \boxed{inner} tail", r"\boxed{inner}"),
        (r"stray } braces { \boxed{x}", r"\boxed{x}"),
        (r"\boxed{x} stray }", r"\boxed{x}"),
        ("  just words  \n", "just words"),
        ("", ""),
        (r"\boxed without brace", r"\boxed without brace"),
        (r"\boxed{unbalanced", r"\boxed{unbalanced"),
        (r"\boxed{$x^{2}$}", r"\boxed{$x^{2}$}"),
    ],
)
def test_parse_action(response, action):
    assert parse_action(response) == action


@pytest.mark.parametrize(
    ("response", "action"),
    [
        (r"<think>maybe \boxed{a}</think> final \boxed{b}", r"\boxed{b}"),
        (r"  <think>\boxed{a}</think>  plain answer ", "plain answer"),
        (r"<think>still thinking \boxed{a}", ""),  # cut inside its reasoning: no action (SGLang's qwen3)
        ("<think>  still thinking, no box", ""),
        ("\n<think>\\boxed{a}</think> \\boxed{b}", r"\boxed{b}"),  # the block need not open the reply
        ("<think></think>", ""),
        (r"not leading <think>\boxed{a}</think> \boxed{b}", r"\boxed{b}"),
        (r"text <think>x</think> \boxed{c}", r"\boxed{c}"),
    ],
)
def test_parse_action_think_block(response, action):
    assert parse_action(response) == action


def test_boxed_contents_order_and_nesting():
    text = r"\boxed{1} x \boxed{\frac{a}{b}} \boxed {3} \boxed{open"
    assert boxed_contents(text) == ["1", r"\frac{a}{b}", "3"]


def test_boxed_contents_keeps_whitespace():
    assert boxed_contents(r"\boxed{ a }") == [" a "]


def test_boxed_contents_none():
    assert boxed_contents("no boxes {here}") == []


def test_many_unclosed_boxes_are_fast():
    text = r"\boxed{" * 50_000 + r"\boxed{x}"
    assert parse_action(text) == r"\boxed{x}"


def test_deep_nesting():
    inner = "{" * 10_000 + "}" * 10_000
    assert parse_action(r"\boxed{" + inner + "}") == r"\boxed{" + inner + "}"


# ---------------------------------------------------------------- properties


@st.composite
def balanced(draw, depth=0):
    """Text whose braces balance."""
    plain = st.text(st.characters(blacklist_characters="{}"), max_size=8)
    parts = [draw(plain)]
    if depth < 4:
        for _ in range(draw(st.integers(0, 3))):
            parts.append("{" + draw(balanced(depth + 1)) + "}")
            parts.append(draw(plain))
    return "".join(parts)


@given(st.text())
def test_parse_action_never_raises(text):
    assert isinstance(parse_action(text), str)


@given(st.text(alphabet=st.sampled_from("\\boxed{} <think>/ \nab")))
def test_parse_action_never_raises_on_box_like_text(text):
    result = parse_action(text)
    assert isinstance(result, str)
    if boxed_contents(text) and "think>" not in text:
        assert result.startswith("\\boxed{") and result.endswith("}")


@settings(max_examples=300)
@given(prefix=st.text(), content=balanced())
def test_last_box_is_recovered(prefix, content):
    assume("\\b" not in content)
    assume("think>" not in prefix)
    response = prefix + "\\boxed{" + content + "}"
    assert parse_action(response) == "\\boxed{" + content.strip() + "}"


@given(content=balanced(), suffix=st.text(st.characters(blacklist_characters="{}\\")))
def test_box_followed_by_plain_text(content, suffix):
    response = "\\boxed{" + content + "}" + suffix
    assert boxed_contents(response)[-1] == content


# -- selfplay.action_extraction (issue 39): last_box (default) against the released first_flat_box --

@pytest.mark.parametrize(
    ("response", "last_box", "first_flat_box"),
    [
        # the released parser takes the first brace-free box anywhere, spade the last box
        (r"first \boxed{a} then \boxed{b}", r"\boxed{b}", r"\boxed{a}"),
        (r"\boxed{x} or \boxed{\frac{1}{2}}", r"\boxed{\frac{1}{2}}", r"\boxed{x}"),
        # a flat box later in the reply beats an earlier nested one
        (r"\boxed{\frac{1}{2}} or \boxed{x}", r"\boxed{x}", r"\boxed{x}"),
        (r"\boxed{{a}} then \boxed{b}", r"\boxed{b}", r"\boxed{b}"),
        # double and triple braces around a flat content are peeled
        (r"say \boxed{{go}} now", r"\boxed{{go}}", r"\boxed{go}"),
        (r"say \boxed{{{go}}} now", r"\boxed{{{go}}}", r"\boxed{go}"),
        # no flat box: the last \boxed by brace depth, outer pairs peeled (at most two)
        (r"\boxed{\frac{1}{2}}", r"\boxed{\frac{1}{2}}", r"\boxed{\frac{1}{2}}"),
        (r"\boxed{{{{a}{b}}}}", r"\boxed{{{{a}{b}}}}", r"\boxed{{a}{b}}"),
        # the released fallback takes the first brace after \boxed, wherever it is
        (r"\boxed is {x{y}}", r"\boxed is {x{y}}", r"\boxed{x{y}}"),
        # empty content: the stripped text in both readings
        (r" \boxed{} ", r"\boxed{}", r"\boxed{}"),
        (r" \boxed{   } ", r"\boxed{}", r"\boxed{   }"),
        (r"\boxed{never closed", r"\boxed{never closed", r"\boxed{never closed"),
        ("no box at all ", "no box at all", "no box at all"),
        # \boxed followed by a space: a box for spade, the released regexes need \boxed{ at once
        (r"\boxed {7} and \boxed{8}", r"\boxed{8}", r"\boxed{8}"),
        # reasoning is set aside first in both
        (r"<think>\boxed{a}</think> \boxed{b} \boxed{c}", r"\boxed{c}", r"\boxed{b}"),
    ],
)
def test_action_extraction_both_readings(response, last_box, first_flat_box):
    assert parse_action(response) == last_box  # the default is unchanged
    assert parse_action(response, "last_box") == last_box
    assert parse_action(response, "first_flat_box") == first_flat_box


def test_action_extraction_refuses_an_unknown_reading():
    with pytest.raises(ValueError, match="selfplay.action_extraction: 'first'.*last_box, first_flat_box"):
        parse_action(r"\boxed{a}", "first")
