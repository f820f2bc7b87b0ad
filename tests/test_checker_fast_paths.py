"""The symbolic checker's fast paths give Math-Verify's verdict: compared with ``fast_paths=False`` (every pair sent
to Math-Verify) over generated spellings of numbers."""

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_msv.equivalence.base import Verdict, answer_key
from hf_msv.equivalence.symbolic import SymbolicChecker

SIGNS = ("", "-", "+")
SEPARATORS = (",", " ", "{,}", "\\,", "\\ ")


@pytest.fixture(scope="module")
def checkers():
    return SymbolicChecker(), SymbolicChecker(fast_paths=False)


def _grouped(digits: str, separator: str) -> str:
    head = len(digits) % 3 or 3
    return separator.join([digits[:head]] + [digits[i : i + 3] for i in range(head, len(digits), 3)])


@st.composite
def spellings(draw, value: int | None = None):
    """A number as a person or an LM might write it: sign, leading zeros, a decimal point or comma, thousands
    separators or spaces, percent, a fraction or an exponent."""
    sign = draw(st.sampled_from(SIGNS))
    whole = str(draw(st.integers(0, 10**7)) if value is None else value)
    whole = draw(st.sampled_from(["", "0", "00"])) + whole if draw(st.booleans()) else whole
    form = draw(st.sampled_from(["int", "grouped", "decimal", "comma", "percent", "frac", "slash", "exp"]))
    decimals = str(draw(st.integers(0, 999))).rjust(draw(st.integers(1, 3)), "0")
    if form == "grouped":
        return sign + _grouped(whole, draw(st.sampled_from(SEPARATORS)))
    if form in ("decimal", "comma"):
        return sign + whole + ("." if form == "decimal" else ",") + decimals
    if form == "percent":
        return sign + whole + draw(st.sampled_from(["\\%", "%"]))
    if form in ("frac", "slash"):
        den = draw(st.integers(1, 12))
        return sign + (f"\\frac{{{whole}}}{{{den}}}" if form == "frac" else f"{whole}/{den}")
    if form == "exp":
        return sign + whole + draw(st.sampled_from(["e", "E", "\\times 10^"])) + str(draw(st.integers(-3, 3)))
    return sign + whole


@st.composite
def pairs(draw):
    """Two spellings, often of related values (the same digits, or a near one), so equal verdicts come up too."""
    value = draw(st.integers(0, 10**6))
    related = draw(st.sampled_from(["same", "near", "free"]))
    other = {"same": value, "near": value + draw(st.integers(-1, 1)), "free": None}[related]
    return draw(spellings(value)), draw(spellings(other if other is None else max(other, 0)))


def test_known_disagreements(checkers):
    fast, slow = checkers
    # "-0{,}100" parses to 0 and "-0,100" to -0.1, but both also to the string "-0,100", which verify matches
    for pred, gold in [
        ("0.111", "0,111"),
        ("111", "0,111"),
        ("12345", "012,345"),
        ("0.111", "0,111,222"),
        ("-0,100", "-0{,}100"),
        ("-0{,}100", "-0,100"),
    ]:
        assert fast.is_correct(pred, gold) == slow.is_correct(pred, gold), (pred, gold)


def _same_verdicts(checkers, pair):
    """Identical answers are the one exception: equal without parsing (Math-Verify fails to parse some, "-01%")."""
    fast, slow = checkers
    a, b = pair
    if answer_key(a) == answer_key(b):
        assert fast.compare_to_gold(a, b) == Verdict.EQUAL
        return
    assert fast.compare_to_gold(a, b) == slow.compare_to_gold(a, b), (a, b)
    assert fast.compare(a, b) == slow.compare(a, b), (a, b)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=pairs())
def test_fast_paths_give_math_verifys_verdict(checkers, pair):
    _same_verdicts(checkers, pair)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=pairs())
def test_fast_paths_give_math_verifys_verdict_long(checkers, pair):
    _same_verdicts(checkers, pair)


class _SlowPool:
    """A worker pool whose every task needs `need` wall seconds: it records the wall limits it is given."""

    def __init__(self, need: float):
        self.need, self.walls = need, []

    def run(self, task, cpu_budget, wall_limit):
        from hf_msv.equivalence.pool import TaskResult

        self.walls.append(wall_limit)
        if wall_limit < self.need:
            time.sleep(wall_limit)
            return TaskResult(None, wall_limit, "stalled")
        return TaskResult(None, cpu_budget, "timeout")


def test_a_pair_is_bounded_in_wall_time_whatever_the_load(monkeypatch):
    """The default checker gives no pair more than 2.25 × timeout of wall time in its workers (the machine's load
    slows a worker, not the bound): the worker is given what is left of it, and no retry starts after it."""
    checker = SymbolicChecker(timeout=0.2)
    pool = _SlowPool(need=10.0)
    monkeypatch.setattr(checker, "_pool", lambda: pool)
    assert checker.compare("\\binom{100000}{50000}", "\\binom{100000}{50001}") is Verdict.UNVERIFIABLE
    assert pool.walls and all(w <= 2.25 * 0.2 + 1e-9 for w in pool.walls), pool.walls
    assert len(pool.walls) == 1  # the limit ran out in the first task: nothing more was started
    assert checker.compare("\\binom{100000}{50000}", "\\binom{100000}{50001}") is Verdict.UNVERIFIABLE
    assert len(pool.walls) == 2  # not cached: the next check tries again


def test_explicit_limits_keep_their_meaning():
    assert SymbolicChecker().pair_wall_limit == 4.5
    assert SymbolicChecker(timeout=0.5, retry_timeout=30.0).pair_wall_limit == float("inf")
    assert SymbolicChecker(pair_wall_limit=1.0).pair_wall_limit == 1.0
