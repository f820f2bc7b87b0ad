import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_msv.evaluation.early_stop import (
    AnswerGroup,
    LatencyCosts,
    TradeoffCurve,
    autc,
    choose_budget_lambda,
    choose_on_groups,
    early_stop_token_fraction,
    replay,
    replay_at,
    replay_many,
    tradeoff_curve,
)

#                 idx:  0    1    2    3    4    5
SCORES = np.array([0.3, 0.6, 0.7, 0.5, 0.9, 0.4])
GROUP = AnswerGroup(
    sequence=[0, 1, 1, 0, 0, 2],
    end=[4, 5, 8, 9, 12, 14],  # terminal answers: 2 (τ=6), 4 (τ=10), 5 (τ=12), L = 2
    klass=[0, 1, 1, 1, 0, 2],
    correct=[0, 1, 1, 1, 0, 0],
    is_terminal=[0, 0, 1, 0, 1, 1],
    seq_len=[10, 6, 12],
    scores={"v": SCORES},
)
COSTS = LatencyCosts(decode_step_s=0.1, elicit_s=0.5, verify_s=0.25)


@pytest.mark.parametrize(
    "lam, chosen, steps, tokens, n_avail, stopped",
    [
        (0.0, 0, 4, 12, 1, True),  # λ = 0 stops at the first answer
        (0.5, 1, 5, 15, 2, True),  # running max .6 at t=5
        (0.65, 2, 8, 8 + 6 + 8, 3, True),  # sequence 1 ended at 6: it contributes 6, not 8
        (0.8, 4, 12, 10 + 6 + 12, 5, True),
        (0.95, 4, 14, 28, 6, False),  # never reached: best terminal (.9 beats .7, .4), full decoding
        (1.5, 4, 14, 28, 6, False),  # λ > 1 never stops
    ],
)
def test_replay_hand_built(lam, chosen, steps, tokens, n_avail, stopped):
    r = replay(GROUP, SCORES, lam, COSTS)
    assert (r["chosen"], r["steps"], r["tokens"], r["n_available"], r["stopped"]) == (
        chosen,
        steps,
        tokens,
        n_avail,
        stopped,
    )
    assert r["correct"] == bool(GROUP.correct[chosen])
    assert r["latency"] == pytest.approx(steps * 0.1 + n_avail * 0.75)


def test_replay_ties_go_to_earliest_arrival_then_lowest_index():
    g = AnswerGroup(
        sequence=[0, 1, 2], end=[5, 3, 3], klass=[0, 1, 2], correct=[1, 0, 0], is_terminal=[1, 1, 1], seq_len=[3, 1, 1]
    )
    assert replay(g, [0.8, 0.8, 0.8], 0.8)["chosen"] == 1  # 1 and 2 arrive first (t=3); lower index wins
    assert replay(g, [0.8, 0.2, 0.8], 0.8)["chosen"] == 2  # 2 arrives before 0 with the same score


def test_curve_and_metrics_over_groups():
    g2 = AnswerGroup(
        sequence=[0, 1],
        end=[2, 6],
        klass=[0, 1],
        correct=[0, 1],
        is_terminal=[1, 1],
        seq_len=[1, 4],
        scores={"v": [0.2, 0.95]},
    )
    curve = tradeoff_curve([GROUP, g2], "v", lambdas=[0.0, 0.9, np.inf], costs=COSTS)
    # λ=0: group1 idx0 (wrong, 12 tok, t=4), group2 idx0 (wrong, 1+2=3 tok, t=2)
    # λ=.9: group1 idx4 at 12 (wrong, 28 tok), group2 idx1 at 6 (right, 1+4=5 tok)
    # λ=∞: group1 idx4 (wrong, 28), group2 idx1 (right, 5)
    np.testing.assert_allclose(curve.accuracy, [0, 0.5, 0.5])
    np.testing.assert_allclose(curve.tokens, [7.5, 16.5, 16.5])
    np.testing.assert_allclose(curve.steps, [3, 9, 10])
    np.testing.assert_allclose(curve.stop_rate, [1, 1, 0])
    # AUTC: points (0,0), (7.5,0), (16.5,.5): trapezoid = 9 * .25
    assert autc(curve) == pytest.approx(9 * 0.25)
    assert autc(curve, normalize=True) == pytest.approx(9 * 0.25 / 16.5)


def _curve(acc, tokens, lambdas=None):
    acc, tokens = np.asarray(acc, float), np.asarray(tokens, float)
    lam = np.linspace(0, 1, acc.size) if lambdas is None else np.asarray(lambdas, float)
    return TradeoffCurve(lam, acc, tokens, tokens, tokens, np.zeros_like(acc))


def test_autc_merges_equal_budgets():
    c = _curve([0.2, 0.5, 0.3, 0.6], [2, 4, 4, 8])
    # (0,0) (2,.2) (4,.5) (8,.6): .2 + .7 + 2.2
    assert autc(c) == pytest.approx(3.1)
    assert autc(c, normalize=True) == pytest.approx(3.1 / 8)


def test_early_stop_token_fraction():
    base = _curve([0.2, 0.5, 0.4], [10, 20, 30])
    assert early_stop_token_fraction(_curve([0.3, 0.5, 0.6], [5, 8, 30]), base) == pytest.approx(8 / 20)
    with pytest.warns(RuntimeWarning, match="never reaches"):
        assert math.isinf(early_stop_token_fraction(_curve([0.3, 0.45], [5, 30]), base))


def test_choose_budget_lambda_on_a_validation_curve():
    c = _curve([0.1, 0.5, 0.7, 0.7, 0.65], [1, 2, 3, 4, 5], lambdas=[0, 0.2, 0.4, 0.6, np.inf])
    assert choose_budget_lambda(c, 1.0).lam == 0.4  # most accurate, cheapest
    assert choose_budget_lambda(c, 0.5).lam == 0.2  # the most accurate within half of full decoding's tokens
    none_fits = choose_budget_lambda(c, 0.1)
    assert none_fits.lam == 0 and not none_fits.fits  # the cheapest


def _synthetic_groups(rng, n_groups, n_seq=4, k=4):
    """Calibrated streams: answer k of a sequence has score p ~ Beta(1 + 5k/(K-1), 2) and is correct w.p. p."""
    groups = []
    for _ in range(n_groups):
        gaps = rng.integers(5, 40, size=(n_seq, k))
        tau = np.cumsum(gaps, axis=1)  # (N, K) delimiter / end times
        p = rng.beta(1 + 5 * np.arange(k) / (k - 1), 2, size=(n_seq, k))
        y = rng.random((n_seq, k)) < p
        groups.append(
            AnswerGroup(
                sequence=np.repeat(np.arange(n_seq), k),
                end=(tau + 3).ravel(),
                klass=np.arange(n_seq * k),
                correct=y.ravel(),
                is_terminal=np.tile(np.arange(k) == k - 1, n_seq),
                seq_len=tau[:, -1],
                start=tau.ravel(),
                scores={"v": p.ravel()},
            )
        )
    return groups


def _paired_loss(groups, lambdas) -> np.ndarray:
    """(Λ,) the population paired loss P(full decoding right ∧ stopped answer wrong) per λ."""
    res = [replay_many(g, g.scores["v"], lambdas) for g in groups]
    correct = np.stack([r.correct for r in res])
    return (correct[:, [-1]] & ~correct).mean(0)


def test_the_guaranteed_lambda_loses_at_most_epsilon_on_fresh_data():
    """Learn-then-Test on the paired loss: over repeated validation draws, the chosen λ's population loss exceeds ε
    in at most δ of them (with slack for 20 draws), and it still stops early; too few problems certify nothing."""
    rng = np.random.default_rng(1234)
    epsilon, delta, lambdas = 0.05, 0.1, np.r_[np.linspace(0, 1, 41), np.inf]
    population = _synthetic_groups(rng, 3000)
    loss, tokens = _paired_loss(population, lambdas), tradeoff_curve(population, "v", lambdas).tokens
    assert loss[0] > epsilon > loss[-2]
    misses, chosen = 0, []
    for _ in range(20):
        res = choose_on_groups(_synthetic_groups(rng, 300), "v", lambdas, epsilon=epsilon, delta=delta)
        assert res.reached and res.rule == "guarantee"
        chosen.append(res.lam)
        misses += loss[np.flatnonzero(lambdas == res.lam)[0]] > epsilon
    assert misses <= 3
    assert max(chosen) < np.inf and np.mean([tokens[lambdas == c][0] for c in chosen]) < tokens[-1]
    val = _synthetic_groups(rng, 300)
    res = choose_on_groups(val, "v", lambdas, epsilon=epsilon, delta=delta)
    ev = replay_at(_synthetic_groups(rng, 500), "v", res.lam)
    full = tradeoff_curve(population, "v", [np.inf]).accuracy[0]
    assert ev.correct.mean() >= full - epsilon - 0.05 and ev.tokens.mean() < tokens[-1]
    small = choose_on_groups(val[:20], "v", lambdas, epsilon=epsilon, delta=delta)
    assert not small.reached and math.isinf(small.lam) and small.problems_needed == 45
    target = choose_on_groups(val, "v", lambdas, target_fraction=0.9)
    assert target.rule == "target" and target.reached and target.accuracy >= 0.9 * target.full_accuracy - 1e-12


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_stopping_time_and_tokens_monotone_in_lambda(seed):
    g = _synthetic_groups(np.random.default_rng(seed), 1, n_seq=3, k=3)[0]
    r = replay_many(g, g.scores["v"], np.r_[np.linspace(0, 1, 21), np.inf])
    assert np.all(np.diff(r.steps) >= 0) and np.all(np.diff(r.tokens) >= 0)
    assert r.tokens[-1] == g.seq_len.sum() and not r.stopped[-1]
    assert g.end[r.chosen[0]] == g.end.min()  # λ = 0 stops at the first available answer
