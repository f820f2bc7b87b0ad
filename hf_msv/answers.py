"""Answer elicitation and boxed-answer extraction (stdlib only).

At every delimiter (and at the end of a sequence) the LM is made to continue ``ELICITATION_PROMPT``; its greedy
continuation starts right after ``\\boxed`` and should open a brace, write the answer and close the brace. The
functions here find where that box closes (so generation can stop there) and read its content.
"""

from __future__ import annotations

import re

from .elicitation import ELICITATION_PROMPT, MAX_ANSWER_TOKENS

_BOXED_RE = re.compile(r"\\boxed(?![A-Za-z])")


def find_box_end(continuation: str) -> int | None:
    """Index just past the brace that closes the box opened at the start of ``continuation``.

    ``continuation`` is the text generated right after ``\\boxed``: optional whitespace, then ``{``. Nested braces
    (``\\frac{a}{b}``) are balanced; escaped braces ``\\{``, ``\\}`` (and any other ``\\x`` pair) are skipped. One
    pass,
    O(len(continuation)).

    Args:
        continuation: the text generated after ``\\boxed``.

    Returns:
        The end index (``continuation[:end]`` is the whole box), or ``None`` if there is no opening brace or the box
        is not closed yet.
    """
    n = len(continuation)
    i = 0
    while i < n and continuation[i].isspace():
        i += 1
    if i >= n or continuation[i] != "{":
        return None
    depth = 0
    while i < n:
        c = continuation[i]
        if c == "\\":
            i += 2  # an escaped character (``\{``, ``\}``, ``\\``) never opens or closes the box
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def extract_boxed(continuation: str) -> str | None:
    """Content of the box opened at the start of ``continuation`` (see `find_box_end`), stripped.

    Args:
        continuation: the text generated after ``\\boxed``.

    Returns:
        The stripped content, or ``None`` for an unclosed or empty box, or no box at all: the explicit "no answer".
    """
    end = find_box_end(continuation)
    if end is None:
        return None
    content = continuation[continuation.index("{") + 1 : end - 1].strip()
    return content or None


def extract_last_boxed(text: str) -> str | None:
    """Content of the last closed, non-empty ``\\boxed{...}`` anywhere in ``text`` (a full solution), else ``None``.

    A single pass matches every brace pair (escape-aware, as in `find_box_end`), so the whole search is O(len(text))
    however many ``\\boxed`` occurrences are unclosed.

    Args:
        text: a full solution.

    Returns:
        The stripped content of the last closed, non-empty box, or ``None``.
    """
    starts = [m.end() for m in _BOXED_RE.finditer(text)]
    if not starts:
        return None
    closing: dict[int, int] = {}  # position of "{" -> position of its "}"
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            closing[stack.pop()] = i
        i += 1
    for s in reversed(starts):
        j = s
        while j < n and text[j].isspace():
            j += 1
        if j < n and j in closing:
            content = text[j + 1 : closing[j]].strip()
            if content:
                return content
    return None


_SPACING_RE = re.compile(r"\\[,;:!> ]|\\q?quad(?![A-Za-z])|\\(?:left|right)(?![A-Za-z])\.?")
_FRAC_RE = re.compile(r"\\[dt]frac(?![A-Za-z])")
# Keeps the one space that separates a control word from a following letter (``\pi r`` is not ``\pir``) and drops
# every other whitespace run: LaTeX math ignores them.
_WS_RE = re.compile(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])|\s+")


def normalize_answer(answer: str) -> str:
    """Canonical string of an answer for exact matching and dictionary look-ups (cheap, O(n), never raises).

    Strips surrounding ``$``, LaTeX spacing commands, ``\\left``/``\\right``, ``\\dfrac``/``\\tfrac`` (-> ``\\frac``),
    insignificant whitespace and a trailing period. Two answers with the same normal form are the same answer for
    every checker.

    Args:
        answer: an extracted answer.

    Returns:
        Its normal form.
    """
    s = answer.strip()
    if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
        s = s.strip("$")
    s = _SPACING_RE.sub(" ", s)
    s = _FRAC_RE.sub(r"\\frac", s)
    s = _WS_RE.sub(lambda m: m.group(1) + " " if m.group(1) else "", s)
    return s.rstrip(".") if not s.endswith("\\.") else s


__all__ = [
    "ELICITATION_PROMPT",
    "MAX_ANSWER_TOKENS",
    "extract_boxed",
    "extract_last_boxed",
    "find_box_end",
    "normalize_answer",
]
