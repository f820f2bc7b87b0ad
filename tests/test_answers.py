"""Elicitation prompt and boxed-answer extraction."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_msv.answers import (
    ELICITATION_PROMPT,
    MAX_ANSWER_TOKENS,
    extract_boxed,
    extract_last_boxed,
    find_box_end,
    normalize_answer,
)


def test_constants():
    assert ELICITATION_PROMPT == "### Final Answer ### \\boxed"
    assert MAX_ANSWER_TOKENS == 40


@pytest.mark.parametrize(
    "continuation, end",
    [
        ("{5}", 3),
        ("{5} and more", 3),
        ("  {42}\n", 6),
        ("{\\frac{a}{b}}xyz", 13),
        ("{\\{1,2\\}} tail", 9),  # escaped braces do not count
        ("{a\\\\}b}", 5),  # "\\" is a line break, then "}" closes
        ("{\\frac{1}{2}", None),
        ("{", None),
        ("", None),
        ("5}", None),
        ("x{5}", None),
        ("}{5}", None),
    ],
)
def test_find_box_end(continuation, end):
    assert find_box_end(continuation) == end


@pytest.mark.parametrize(
    "continuation, answer",
    [
        ("{5}", "5"),
        (" { \\frac{1}{2} } ###", "\\frac{1}{2}"),
        ("{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("{}", None),
        ("{   }", None),
        ("{12", None),
        ("no box", None),
    ],
)
def test_extract_boxed(continuation, answer):
    assert extract_boxed(continuation) == answer


@pytest.mark.parametrize(
    "text, answer",
    [
        ("So $x=2$, and the answer is $\\boxed{2}$.", "2"),
        ("\\boxed{1} then \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        ("\\boxed{1} then \\boxed{\\frac{3}{4}", "1"),  # last box unclosed: the previous one
        ("\\boxed {7}", "7"),
        ("\\boxed{} \\boxed{8}", "8"),
        ("\\boxed{8} \\boxed{}", "8"),
        ("\\boxeda{3}", None),
        ("no answer", None),
        ("} { \\boxed{\\{x\\}} {", "\\{x\\}"),
    ],
)
def test_extract_last_boxed(text, answer):
    assert extract_last_boxed(text) == answer


@pytest.mark.parametrize(
    "a, b",
    [
        ("$\\frac12$", "\\frac12"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        (" 5. ", "5"),
        ("3\\,000", "3000"),
        ("x + 1", "x+1"),
    ],
)
def test_normalize_answer_merges(a, b):
    assert normalize_answer(a) == normalize_answer(b)


def test_normalize_answer_keeps_control_word_separation():
    assert normalize_answer("\\pi r") != normalize_answer("\\pir")
    assert normalize_answer("12") != normalize_answer("1 2 3")


def test_linear_time_on_hostile_text():
    n = 10**6
    for text in ["{" * n, "\\boxed{" * (n // 7), "\\" * n, "{" + "}" * n]:
        start = time.perf_counter()
        find_box_end(text)
        extract_boxed(text)
        extract_last_boxed(text)
        normalize_answer(text)
        assert time.perf_counter() - start < 5.0


balanced = st.recursive(
    st.text(alphabet="abc123+-^\\ ", max_size=5).map(lambda s: s.replace("\\", "\\\\")),
    lambda inner: st.lists(inner, max_size=3).map(lambda xs: "{" + "".join(xs) + "}"),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(balanced, st.text(max_size=20))
def test_box_end_of_balanced_content(content, tail):
    box = "{" + content + "}"
    assert find_box_end(box + tail) == len(box)
    got = extract_boxed(box + tail)
    assert got == (content.strip() or None)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_extraction_never_raises(text):
    end = find_box_end(text)
    assert end is None or 0 < end <= len(text)
    for value in (extract_boxed(text), extract_last_boxed(text)):
        assert value is None or (value and value == value.strip())
    normalize_answer(text)
