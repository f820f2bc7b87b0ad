import numpy as np
import pytest

from hf_msv.baselines import (
    best_of_n,
    deepconf_confidence,
    deepconf_streaming,
    fit_platt,
    platt,
    self_consistency,
    streaming_weighted_voting,
    token_confidence,
    token_prob_score,
    weighted_voting,
)


def test_best_of_n_ties_mask_nan():
    assert best_of_n([0.3, 0.9, 0.9, 0.1]) == 1
    assert best_of_n([0.3, 0.9, 0.9, 0.1], mask=[1, 0, 0, 1]) == 0
    assert best_of_n([np.nan, 0.2]) == 1
    assert best_of_n([0.5], mask=[False]) == -1


def test_self_consistency():
    assert self_consistency([7, 3, 7, 7]).tolist() == [0.75, 0.25, 0.75, 0.75]
    # an intermediate answer of class 3 gets class 3's share of the 2 terminal answers
    assert self_consistency([3, 3, 5], is_terminal=[0, 1, 1]).tolist() == [0.5, 0.5, 0.5]


def test_weighted_voting_terminal():
    # classes: A = {.8, .2} (mass 1.0), B = {.5} (.5), C = {.5} (.5); total 2.0
    wv = weighted_voting([0.8, 0.2, 0.5, 0.5], [0, 0, 1, 2])
    np.testing.assert_allclose(wv, [0.5, 0.5, 0.25, 0.25])
    assert weighted_voting([0, 0], [0, 1]).tolist() == [0, 0]


def test_streaming_weighted_voting_r_threshold():
    scores = np.array([0.6, 0.2, 0.4, 0.9, 0.1])
    klass = np.array([0, 1, 0, 1, 0])
    end = np.array([1, 2, 2, 5, 7])
    # available counts: 1, 3, 3, 4, 5
    # R=2: answers with > 2 available are re-scored
    #   t=2 (idx 1, 2): mass class0 = .6+.4 = 1.0, class1 = .2 -> idx1 = .2/1.2, idx2 = 1/1.2
    #   t=5 (idx 3): class1 = .2+.9 = 1.1 of 2.1;  t=7 (idx 4): class0 = 1.1 of 2.2
    got = streaming_weighted_voting(scores, klass, end, R=2)
    np.testing.assert_allclose(got, [0.6, 0.2 / 1.2, 1 / 1.2, 1.1 / 2.1, 1.1 / 2.2])
    got = streaming_weighted_voting(scores, klass, end, R=3)  # only 4 and 5 available exceed 3
    np.testing.assert_allclose(got, [0.6, 0.2, 0.4, 1.1 / 2.1, 1.1 / 2.2])
    np.testing.assert_allclose(streaming_weighted_voting(scores, klass, end), scores)  # R=16: untouched
    # R=0 with everything available at once is terminal WV
    np.testing.assert_allclose(
        streaming_weighted_voting(scores, klass, np.zeros(5), R=0), weighted_voting(scores, klass)
    )


def test_token_prob_score_geometric_mean():
    lp = np.log([0.5, 0.8, 0.9, 0.1])
    got = token_prob_score(lp, [0, 0, 1, 2])
    np.testing.assert_allclose(got, [np.sqrt(0.4), 0.9, 0.1])
    assert np.isnan(token_prob_score(lp, [0, 0, 1, 1], num_answers=3)[2])


def test_deepconf_definitions():
    # token confidence = -mean of top-k log-probs
    topk = np.log(np.array([[0.9, 0.05], [0.5, 0.5], [0.99, 0.001], [0.6, 0.3]]))
    c = token_confidence(topk)
    np.testing.assert_allclose(c, -topk.mean(1))
    # window 2: group means of (c0,c1), (c1,c2), (c2,c3)
    g = np.array([(c[0] + c[1]) / 2, (c[1] + c[2]) / 2, (c[2] + c[3]) / 2])
    assert deepconf_confidence(topk, window=2) == pytest.approx(g.min())
    assert deepconf_confidence(topk, window=2, stat="tail") == pytest.approx((c[2] + c[3]) / 2)
    assert deepconf_confidence(topk, window=2, stat="mean") == pytest.approx(c.mean())
    assert deepconf_confidence(topk, window=2, stat="bottom10") == pytest.approx(g.min())
    assert deepconf_confidence(topk, window=10) == pytest.approx(c.mean())  # shorter than a window: one group
    # streaming: answer at τ sees tokens [0, τ)
    got = deepconf_streaming([c], sequence=[0, 0, 0, 0], start=[0, 1, 3, 4], window=2)
    np.testing.assert_allclose(got, [0.0, c[0], g[:2].min(), g.min()])
    tail = deepconf_streaming([c], sequence=[0], start=[3], window=2, stat="tail")
    assert tail[0] == pytest.approx((c[1] + c[2]) / 2)


def test_platt_fit_is_monotone_probability():
    rng = np.random.default_rng(0)
    raw = rng.normal(size=400)
    y = rng.random(400) < 1 / (1 + np.exp(-(2 * raw - 0.5)))
    a, b = fit_platt(raw, y)
    assert a > 0
    p = platt(raw, a, b)
    assert np.all((p > 0) & (p < 1))
    assert abs(p.mean() - y.mean()) < 0.02  # logistic regression matches the base rate


def test_latest_answer_vote_uses_each_sequences_latest_available_answer():
    from hf_msv.baselines import latest_answer_vote

    # sequence 0 answers class 0 (available at 5), then class 1 (at 20); sequence 1 class 1 (at 10);
    # sequence 2 class 0 (at 30). Sequence 0's first answer stops counting once its second is available.
    klass, seq, step, end = [0, 1, 1, 0], [0, 1, 0, 2], [0, 0, 1, 0], [5, 10, 20, 30]
    np.testing.assert_allclose(latest_answer_vote(klass, seq, step, end), [1.0, 0.5, 1.0, 1 / 3])
    # streaming weighted voting with equal scores would still count the superseded class-0 answer at t = 20
    assert streaming_weighted_voting(np.ones(4), klass, end, R=0)[2] == pytest.approx(2 / 3)
    # availability is the end time: at t = 12 sequence 0's step 0 (a long answer, available at 50) is not out yet,
    # so its step 1 votes; at t = 50 both are out and step 1 (the latest) still votes, against a0's class
    v = latest_answer_vote([0, 1, 1], [0, 0, 1], [0, 1, 0], [50, 12, 12])
    np.testing.assert_allclose(v, [0.0, 1.0, 1.0])
    # a group of terminal answers: the vote share of self-consistency
    rng = np.random.default_rng(0)
    k = rng.integers(0, 3, 9)
    np.testing.assert_allclose(latest_answer_vote(k, np.arange(9), np.zeros(9), np.zeros(9)), self_consistency(k))


def test_latest_answer_vote_matches_the_msv_gamma():
    import torch

    from hf_msv.baselines import latest_answer_vote
    from hf_msv.modeling_msv import compute_gamma

    rng = np.random.default_rng(1)
    seq = np.repeat(np.arange(6), 3)
    step = np.tile(np.arange(3), 6)
    end = np.sort(rng.integers(0, 60, (6, 3)), axis=1).ravel() + rng.integers(0, 3, 18)
    klass = rng.integers(0, 3, 18)
    t = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.long)
    gamma = compute_gamma(t(np.zeros(18)), t(seq), t(step), t(end), t(klass), streaming=True).numpy()
    np.testing.assert_allclose(latest_answer_vote(klass, seq, step, end), gamma, rtol=1e-6)


@pytest.mark.parametrize("streaming", [False, True])
def test_weighted_voting_matches_the_msv_vote_share(streaming):
    """The weighted vote the MSV's vote pathway computes in torch gives the numbers of the numpy baseline (terminal:
    over every answer of the group; streaming: over the answers available, above R of them)."""
    import torch

    from hf_msv.modeling_msv import weighted_vote_share

    rng = np.random.default_rng(2)
    group = np.repeat(np.arange(3), 8)
    end = rng.integers(0, 40, 24)
    klass = rng.integers(0, 3, 24)
    scores = rng.random(24)
    scores[group == 2] = 0.0  # a group without mass
    t = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.long)
    share = weighted_vote_share(
        torch.as_tensor(scores, dtype=torch.float64), t(group), t(end), t(klass), streaming=streaming, threshold=3
    ).numpy()
    for g in range(3):
        at = group == g
        expected = (
            streaming_weighted_voting(scores[at], klass[at], end[at], R=3)
            if streaming
            else weighted_voting(scores[at], klass[at])
        )
        np.testing.assert_allclose(share[at], expected, rtol=1e-12, atol=1e-12)


def test_calibrated_self_consistency_beats_raw_brier_on_miscalibrated_votes():
    """Vote shares that overstate correctness (true P(correct) = share²): Platt scaling fitted on one half
    lowers the Brier score on the other half."""
    from hf_msv.metrics import brier

    rng = np.random.default_rng(0)
    share = rng.uniform(0.05, 1.0, 4000)
    y = rng.random(4000) < share**2
    fit, test = slice(0, 2000), slice(2000, None)
    a, b = fit_platt(share[fit], y[fit])
    calibrated = platt(share[test], a, b)
    assert brier(calibrated, y[test]) < brier(share[test], y[test]) - 0.01


def test_stacked_baseline_fits_and_scores():
    """Logistic regression on [vote share, Probe logit]: both features carry signal, so the stack beats each alone."""
    from hf_msv.baselines import fit_logistic, logistic, logit
    from hf_msv.metrics import brier

    rng = np.random.default_rng(0)
    m = 6000
    z_vote, z_probe = rng.normal(size=m), rng.normal(size=m)
    y = rng.random(m) < 1 / (1 + np.exp(-(1.5 * z_vote + 1.5 * z_probe)))
    vote, probe = 1 / (1 + np.exp(-z_vote)), 1 / (1 + np.exp(-z_probe))
    features = np.stack([vote, logit(probe)], axis=1)
    coef, intercept = fit_logistic(features[:3000], y[:3000])
    assert coef.shape == (2,) and (coef > 0).all()
    p = logistic(features[3000:], coef, intercept)
    assert p.shape == (3000,) and ((p > 0) & (p < 1)).all()
    for one in (vote, probe):
        a, b = fit_platt(one[:3000], y[:3000])
        assert brier(p, y[3000:]) < brier(platt(one[3000:], a, b), y[3000:])
    coef0, icpt0 = fit_logistic(features[:10], np.ones(10))  # one class: the base rate, no weights
    assert (coef0 == 0).all() and logistic(features[:2], coef0, icpt0) == pytest.approx(0.999)
