import numpy as np
import pytest

from hf_msv.baselines import (best_of_n, deepconf_confidence, deepconf_streaming, fit_platt, platt,
                              self_consistency, streaming_weighted_voting, token_confidence, token_prob_score,
                              weighted_voting)


def test_best_of_n_ties_mask_nan():
    assert best_of_n([.3, .9, .9, .1]) == 1
    assert best_of_n([.3, .9, .9, .1], mask=[1, 0, 0, 1]) == 0
    assert best_of_n([np.nan, .2]) == 1
    assert best_of_n([.5], mask=[False]) == -1


def test_self_consistency():
    assert self_consistency([7, 3, 7, 7]).tolist() == [.75, .25, .75, .75]
    # an intermediate answer of class 3 gets class 3's share of the 2 terminal answers
    assert self_consistency([3, 3, 5], is_terminal=[0, 1, 1]).tolist() == [.5, .5, .5]


def test_weighted_voting_terminal():
    # classes: A = {.8, .2} (mass 1.0), B = {.5} (.5), C = {.5} (.5); total 2.0
    wv = weighted_voting([.8, .2, .5, .5], [0, 0, 1, 2])
    np.testing.assert_allclose(wv, [.5, .5, .25, .25])
    assert weighted_voting([0, 0], [0, 1]).tolist() == [0, 0]


def test_streaming_weighted_voting_r_threshold():
    scores = np.array([.6, .2, .4, .9, .1])
    klass = np.array([0, 1, 0, 1, 0])
    end = np.array([1, 2, 2, 5, 7])
    # available counts: 1, 3, 3, 4, 5
    # R=2: answers with > 2 available are re-scored
    #   t=2 (idx 1, 2): mass class0 = .6+.4 = 1.0, class1 = .2 -> idx1 = .2/1.2, idx2 = 1/1.2
    #   t=5 (idx 3): class1 = .2+.9 = 1.1 of 2.1;  t=7 (idx 4): class0 = 1.1 of 2.2
    got = streaming_weighted_voting(scores, klass, end, R=2)
    np.testing.assert_allclose(got, [.6, .2 / 1.2, 1 / 1.2, 1.1 / 2.1, 1.1 / 2.2])
    got = streaming_weighted_voting(scores, klass, end, R=3)        # only 4 and 5 available exceed 3
    np.testing.assert_allclose(got, [.6, .2, .4, 1.1 / 2.1, 1.1 / 2.2])
    np.testing.assert_allclose(streaming_weighted_voting(scores, klass, end), scores)   # R=16: untouched
    # R=0 with everything available at once is terminal WV
    np.testing.assert_allclose(streaming_weighted_voting(scores, klass, np.zeros(5), R=0),
                               weighted_voting(scores, klass))


def test_token_prob_score_geometric_mean():
    lp = np.log([.5, .8, .9, .1])
    got = token_prob_score(lp, [0, 0, 1, 2])
    np.testing.assert_allclose(got, [np.sqrt(.4), .9, .1])
    assert np.isnan(token_prob_score(lp, [0, 0, 1, 1], num_answers=3)[2])


def test_deepconf_definitions():
    # token confidence = -mean of top-k log-probs
    topk = np.log(np.array([[.9, .05], [.5, .5], [.99, .001], [.6, .3]]))
    c = token_confidence(topk)
    np.testing.assert_allclose(c, -topk.mean(1))
    # window 2: group means of (c0,c1), (c1,c2), (c2,c3)
    g = np.array([(c[0] + c[1]) / 2, (c[1] + c[2]) / 2, (c[2] + c[3]) / 2])
    assert deepconf_confidence(topk, window=2) == pytest.approx(g.min())
    assert deepconf_confidence(topk, window=2, stat="tail") == pytest.approx((c[2] + c[3]) / 2)
    assert deepconf_confidence(topk, window=2, stat="mean") == pytest.approx(c.mean())
    assert deepconf_confidence(topk, window=2, stat="bottom10") == pytest.approx(g.min())
    assert deepconf_confidence(topk, window=10) == pytest.approx(c.mean())   # shorter than a window: one group
    # streaming: answer at τ sees tokens [0, τ)
    got = deepconf_streaming([c], sequence=[0, 0, 0, 0], start=[0, 1, 3, 4], window=2)
    np.testing.assert_allclose(got, [0.0, c[0], g[:2].min(), g.min()])
    tail = deepconf_streaming([c], sequence=[0], start=[3], window=2, stat="tail")
    assert tail[0] == pytest.approx((c[1] + c[2]) / 2)


def test_platt_fit_is_monotone_probability():
    rng = np.random.default_rng(0)
    raw = rng.normal(size=400)
    y = rng.random(400) < 1 / (1 + np.exp(-(2 * raw - .5)))
    a, b = fit_platt(raw, y)
    assert a > 0
    p = platt(raw, a, b)
    assert np.all((p > 0) & (p < 1))
    assert abs(p.mean() - y.mean()) < 0.02   # logistic regression matches the base rate
