"""Budgets in reports: λ chosen on validation and scored on evaluation (`choose_budget_lambda`, `chosen_budget`, the
study's ``budgets`` entry), and the interpolated curve (`interpolated_curve`, an upper concave hull)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from hf_msv.evaluation.early_stop import (
    BUDGET_FRACTIONS,
    LatencyCosts,
    TradeoffCurve,
    choose_budget_lambda,
    interpolated_curve,
)
from hf_msv.evaluation.intervals import ProblemCurves, chosen_budget, interpolated_interval
from hf_msv.evaluation.report import _budget_lines
from hf_msv.evaluation.results import Budgets, EarlyStopSummary
from hf_msv.evaluation.study import _budgets, _mean_curve, _PerN
from hf_msv.utils import json_safe

LAMBDAS = np.array([0.0, 0.5, 0.8, 0.9, np.inf])


def _curve(accuracy, tokens, lambdas=LAMBDAS) -> TradeoffCurve:
    acc, tok = np.asarray(accuracy, float), np.asarray(tokens, float)
    return TradeoffCurve(np.asarray(lambdas, float), acc, tok, tok, tok, np.zeros_like(acc))


def _best_mix(fraction, accuracy, budget: float) -> float:
    """Brute force: the best expected accuracy of a mix p·i + (1 − p)·j of two points (answering nothing, (0, 0),
    among them) whose expected budget is ≤ `budget`."""
    xs, ys = np.r_[0.0, fraction], np.r_[0.0, accuracy]
    best = max(y for x, y in zip(xs, ys) if x <= budget)
    for i, j in itertools.permutations(range(xs.size), 2):
        if xs[i] <= budget < xs[j]:
            p = (xs[j] - budget) / (xs[j] - xs[i])  # the mix that spends the whole budget
            best = max(best, p * ys[i] + (1 - p) * ys[j])
    return best


# ----------------------------------------------------------------------------------------------------------------
# The interpolated curve
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_the_hull_is_the_best_mix_of_two_operating_points(seed):
    rng = np.random.default_rng(seed)
    tokens = np.r_[np.sort(rng.uniform(5, 100, 11)), 100.0]
    accuracy = rng.uniform(0, 1, 12)
    hull = interpolated_curve(_curve(accuracy, tokens, np.r_[np.linspace(0, 1, 11), np.inf]))
    for budget in np.linspace(0, 1.2, 49):
        assert hull.at(budget) == pytest.approx(_best_mix(tokens / 100, accuracy, budget), abs=1e-12)


def test_a_mix_of_two_points_lies_on_the_hull():
    hull = interpolated_curve(_curve([0.2, 0.5, 0.55, 0.7, 0.72], [10, 20, 40, 60, 100]))
    # half λ = 0.5 (20 % of the tokens, 0.5), half λ = 0.9 (60 %, 0.7): 40 % of the tokens at 0.6 on average,
    # more than λ = 0.8 realises there (0.55)
    assert hull.at(0.4) == pytest.approx(0.6)
    assert hull.at(0.3) == pytest.approx(0.55)  # the same two points, mixed 3 : 1
    # λ = 0.5 a quarter of the time, answering nothing (0, 0) otherwise: more than λ = 0 (10 %, 0.2) mixed so
    assert hull.at(0.05) == pytest.approx(0.125)


def test_a_point_under_the_hull_does_not_raise_it():
    hull = interpolated_curve(_curve([0.2, 0.5, 0.7, 0.55, 0.72], [10, 20, 60, 80, 100]))
    six = [0.0, 0.5, 0.7, 0.8, 0.9, np.inf]
    under = interpolated_curve(_curve([0.2, 0.5, 0.59, 0.7, 0.55, 0.72], [10, 20, 40, 60, 80, 100], six))
    above = interpolated_curve(_curve([0.2, 0.5, 0.61, 0.7, 0.55, 0.72], [10, 20, 40, 60, 80, 100], six))
    np.testing.assert_array_equal(under.fraction, hull.fraction)  # (0.4, 0.59) lies under the chord's 0.6
    np.testing.assert_array_equal(under.accuracy, hull.accuracy)
    assert hull.at(0.4) == pytest.approx(0.6) and above.at(0.4) == pytest.approx(0.61)
    assert 0.55 < hull.at(0.8) == pytest.approx(0.71)  # (0.8, 0.55) lies under the chord to full decoding


def test_the_hull_is_non_decreasing_and_peaks_at_the_curve_peak():
    rng = np.random.default_rng(7)
    tokens, accuracy = np.r_[np.sort(rng.uniform(1, 50, 20)), 50.0], rng.uniform(0, 1, 21)
    hull = interpolated_curve(_curve(accuracy, tokens, np.r_[np.linspace(0, 1, 20), np.inf]))
    values = np.array([hull.at(b) for b in np.linspace(0, 1.5, 151)])
    assert np.all(np.diff(values) >= -1e-15)
    assert values[-1] == pytest.approx(accuracy.max())
    assert np.all(np.diff(hull.fraction) > 0) and hull.fraction[0] == 0.0


# ----------------------------------------------------------------------------------------------------------------
# λ chosen on validation
# ----------------------------------------------------------------------------------------------------------------


def test_the_budget_lambda_is_the_most_accurate_within_the_budget():
    val = _curve([0.3, 0.6, 0.6, 0.8, 0.82], [10, 25, 25, 60, 100], [0.0, 0.5, 0.7, 0.9, np.inf])
    at30 = choose_budget_lambda(val, 0.3)
    assert (at30.lam, at30.accuracy, at30.used_fraction, at30.fits) == (0.7, 0.6, 0.25, True)  # tie: larger λ
    assert choose_budget_lambda(val, 0.6).lam == 0.9  # exactly at the budget fits
    assert choose_budget_lambda(val, 1.0).lam == np.inf
    cheaper = _curve([0.3, 0.6, 0.6, 0.8, 0.82], [10, 20, 25, 60, 100], [0.0, 0.5, 0.7, 0.9, np.inf])
    assert choose_budget_lambda(cheaper, 0.3).lam == 0.5  # tie: cheaper first
    none = choose_budget_lambda(val, 0.05)
    assert not none.fits and none.lam == 0.0 and none.used_fraction == 0.1  # the cheapest, flagged


def _problem_curves(correct, tokens) -> ProblemCurves:
    correct, tokens = np.asarray(correct, float), np.asarray(tokens, float)
    return ProblemCurves(LAMBDAS, correct, tokens, tokens, tokens, np.zeros_like(correct))


# 4 evaluation problems × 5 λ; tokens per problem, full decoding = 100
EVAL_TOKENS = np.tile([10.0, 25.0, 45.0, 70.0, 100.0], (4, 1))
EVAL_CORRECT = np.array([[0, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 1, 1], [0, 0, 0, 0, 1]], float)
VAL = _curve([0.1, 0.5, 0.55, 0.8, 0.8], [10, 25, 45, 70, 100])  # chooses λ = 0.5 at 30 %, 0.8 at 50 %


def _best_of_evaluation_curve(correct, tokens, fraction) -> float:
    """The number reports used to show: the best evaluation accuracy within the budget (λ picked on evaluation)."""
    acc, tok = correct.mean(0), tokens.mean(0)
    return float(acc[tok <= fraction * tok[-1] + 1e-9].max())


def test_the_evaluation_curve_is_never_consulted_to_choose_lambda():
    before = chosen_budget([VAL], [_problem_curves(EVAL_CORRECT, EVAL_TOKENS)], 0.3)
    assert before.choices[0].lam == 0.5 and before.eval_accuracy[0] == 0.25 and before.eval_fraction[0] == 0.25
    changed = EVAL_CORRECT.copy()
    changed[:, 0] = 1  # on evaluation, λ = 0 becomes right everywhere at 10 % of the tokens
    after = chosen_budget([VAL], [_problem_curves(changed, EVAL_TOKENS)], 0.3)
    assert after.choices == before.choices
    np.testing.assert_array_equal(after.problem_accuracy, before.problem_accuracy)
    assert after.eval_accuracy[0] == 0.25
    # ... where the best point of the evaluation curve moves with it
    assert _best_of_evaluation_curve(EVAL_CORRECT, EVAL_TOKENS, 0.3) == 0.25
    assert _best_of_evaluation_curve(changed, EVAL_TOKENS, 0.3) == 1.0


def test_the_realised_fraction_is_the_evaluation_one():
    heavier = EVAL_TOKENS.copy()
    heavier[:, 1] = 40.0  # on evaluation λ = 0.5 costs more than the 30 % budget it fit on validation
    c = chosen_budget(
        [VAL, VAL], [_problem_curves(EVAL_CORRECT, EVAL_TOKENS), _problem_curves(EVAL_CORRECT, heavier)], 0.3
    )
    np.testing.assert_allclose(c.eval_fraction, [0.25, 0.40])
    assert all(ch.used_fraction == 0.25 for ch in c.choices)


# ----------------------------------------------------------------------------------------------------------------
# The study's budgets entry and its report
# ----------------------------------------------------------------------------------------------------------------


def _accumulator(eval_correct, with_validation: bool) -> _PerN:
    """A one-seed accumulator of two methods: "A" (the reference) and "B", whose evaluation is A's shifted."""
    acc = _PerN(LatencyCosts(), [])
    other = np.roll(eval_correct, 1, axis=0)
    for m, correct in (("A", eval_correct), ("B", other)):
        pc = _problem_curves(correct, EVAL_TOKENS)
        acc.problem_curves[m] = [pc]
        acc.curves[m] = [pc.curve()]
        if with_validation:
            acc.val_curves[m] = [VAL]
    return acc


def _study_budgets(eval_correct, with_validation=True, n_boot=50) -> Budgets:
    acc = _accumulator(eval_correct, with_validation)
    mean = {m: _mean_curve(c) for m, c in acc.curves.items()}
    return Budgets.from_dict(json_safe(_budgets(acc, mean, "A", ["B"], n_boot)))


def test_study_budgets_do_not_move_with_evaluation_outcomes_at_other_lambdas():
    before = _study_budgets(EVAL_CORRECT)
    changed = EVAL_CORRECT.copy()
    changed[:, 0] = 1  # λ = 0, chosen at no budget (0.5 at 30 %, 0.8 at 50 %, 0.9 at 70 %; full decoding: all 1)
    after = _study_budgets(changed)
    chosen = before.validation_chosen
    assert chosen is not None and after.validation_chosen is not None
    assert [b.lam.values for b in chosen["A"]] == [[0.5], [0.8], [0.9]]
    for m in ("A", "B"):
        for b0, b1 in zip(chosen[m], after.validation_chosen[m]):
            assert b1.to_dict() == b0.to_dict()
    assert chosen["A"][0].interval is None and chosen["B"][0].interval is not None
    # the interpolated curves are curve summaries: they do see the new evaluation points
    assert after.interpolated["A"][0].accuracy == 1.0 > before.interpolated["A"][0].accuracy


def test_without_validation_no_budget_is_chosen_and_the_report_says_so():
    budgets = _study_budgets(EVAL_CORRECT, with_validation=False)
    assert budgets.validation_chosen is None and set(budgets.interpolated) == {"A", "B"}
    assert Budgets.from_dict(json.loads(json.dumps(budgets.to_dict()))).to_dict() == budgets.to_dict()
    text = "\n".join(_budget_lines(EarlyStopSummary(curves={}, budgets=budgets)))
    assert "without a validation split no λ can be chosen" in text and "Budgets chosen on validation" not in text
    assert "Interpolated curves (a curve summary, not a budgeted accuracy" in text
    with_val = "\n".join(_budget_lines(EarlyStopSummary(curves={}, budgets=_study_budgets(EVAL_CORRECT))))
    assert "Budgets chosen on validation" in with_val and "| B | 0.250 ± 0.000 at 0.25 ± 0.00 (" in with_val


def test_the_interpolated_interval_recomputes_both_hulls_per_resample():
    a = [_problem_curves(EVAL_CORRECT, EVAL_TOKENS)]
    b = [_problem_curves(np.roll(EVAL_CORRECT, 1, axis=1), EVAL_TOKENS)]
    iv = interpolated_interval(a, b, BUDGET_FRACTIONS[0], n_boot=200)
    expected = interpolated_curve(a[0].curve()).at(0.3) - interpolated_curve(b[0].curve()).at(0.3)
    assert iv.estimate == pytest.approx(expected)
    assert iv.low <= iv.estimate <= iv.high and iv.n_boot == 200
