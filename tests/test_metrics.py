import math

import numpy as np
import pytest
import torch
from sklearn.exceptions import UndefinedMetricWarning
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

from hf_msv.data import AnswerGroup
from hf_msv.metric_modules import MSV_CALIBRATION_PATH
from hf_msv.metrics import (
    auroc,
    bce_with_logits,
    best_of_n_accuracy,
    best_of_n_metrics,
    best_of_n_pairs,
    brier,
    calibration_metrics,
    difficulty_scores,
    ece,
    fold_by_problem,
    format_mean_std,
    mean_std,
    nll,
    per_problem_auroc,
    reliability_bins,
    seed_stat,
    within_problem_auroc,
)

P = np.array([0.9, 0.8, 0.3, 0.3, 0.05, 0.65])
Y = np.array([1, 0, 1, 0, 0, 1])


def test_auroc_hand_and_sklearn():
    # positives {0.9, 0.3, 0.65} vs negatives {0.8, 0.3, 0.05}: wins 3+1+2 = 6, one tie (0.3, 0.3) -> (6 + .5) / 9
    assert auroc(P, Y) == pytest.approx(6.5 / 9)
    rng = np.random.default_rng(0)
    p, y = rng.random(200), rng.random(200) < 0.4
    assert auroc(p, y) == pytest.approx(roc_auc_score(y, p))


def test_auroc_one_class_is_nan_with_reason():
    with pytest.warns(UndefinedMetricWarning, match="all 3 labels are positive"):
        assert math.isnan(auroc([0.1, 0.5, 0.9], [1, 1, 1]))


def test_brier_nll_hand_and_sklearn():
    assert brier(P, Y) == pytest.approx(np.mean([0.01, 0.64, 0.49, 0.09, 0.0025, 0.1225]))
    assert brier(P, Y) == pytest.approx(brier_score_loss(Y, P))
    hand = -np.mean([np.log(0.9), np.log(0.2), np.log(0.3), np.log(0.7), np.log(0.95), np.log(0.65)])
    assert nll(P, Y) == pytest.approx(hand)
    assert nll(P, Y) == pytest.approx(log_loss(Y, P))
    assert nll([1.0, 0.0], [0, 1]) == pytest.approx(-np.log(1e-7))  # clipped, finite


def test_ece_hand():
    # bins: [0.9]->9 (acc 1, conf .9), [0.8]->8 (0 vs .8), [.3,.3]->3 (.5 vs .3), [.05]->0 (0 vs .05), [.65]->6 (1 vs
    # .65)
    hand = (0.1 + 0.8 + 2 * 0.2 + 0.05 + 0.35) / 6
    assert ece(P, Y) == pytest.approx(hand)
    conf, acc, count = reliability_bins(P, Y)
    assert count.tolist() == [1, 0, 0, 2, 0, 0, 1, 0, 1, 1] and np.isnan(acc[1]) and conf[3] == pytest.approx(0.3)
    assert ece([1.0, 0.0], [1, 0]) == 0.0  # p = 1 lands in the last bin
    assert ece(np.full(10, 0.7), np.r_[np.ones(7), np.zeros(3)]) == pytest.approx(0.0)


def test_input_validation():
    with pytest.raises(ValueError, match="must lie in"):
        brier([1.2], [1])
    with pytest.raises(ValueError, match="differ in shape"):
        brier([0.2, 0.3], [1])


def _terminal_group(scores, correct, klass=None):
    n = len(scores)
    return AnswerGroup(
        sequence=np.arange(n),
        end=np.full(n, 10),
        klass=np.arange(n) if klass is None else klass,
        correct=correct,
        is_terminal=np.ones(n, bool),
        seq_len=np.full(n, 8),
        scores={"v": scores},
    )


def test_best_of_n_pairs_accuracy_ece_brier():
    groups = [
        _terminal_group([0.2, 0.9, 0.9], [0, 1, 0]),  # tie .9/.9 -> lowest index 1 (correct)
        _terminal_group([0.7, 0.1], [0, 1]),  # picks 0 (wrong)
        _terminal_group([0.4, 0.6], [0, 1]),
    ]  # picks 1 (correct)
    p, y = best_of_n_pairs(groups, "v")
    assert p.tolist() == [0.9, 0.7, 0.6] and y.tolist() == [True, False, True]
    assert best_of_n_accuracy(groups, "v") == pytest.approx(2 / 3)
    m = best_of_n_metrics(groups, [g.scores["v"] for g in groups])
    assert m["brier"] == pytest.approx((0.01 + 0.49 + 0.16) / 3)
    assert m["ece"] == pytest.approx((0.1 + 0.7 + 0.4) / 3)


def test_best_of_n_ignores_non_terminal():
    g = AnswerGroup(
        sequence=[0, 0, 1],
        end=[3, 9, 9],
        klass=[0, 1, 1],
        correct=[1, 0, 0],
        is_terminal=[0, 1, 1],
        seq_len=[7, 7],
        scores={"v": [0.99, 0.5, 0.4]},
    )
    p, y = best_of_n_pairs([g], "v")
    assert p[0] == 0.5 and not y[0]


def test_answer_group_validates_shapes():
    with pytest.raises(ValueError, match="shape"):
        AnswerGroup(sequence=[0, 1], end=[1], klass=[0, 0], correct=[1, 0], is_terminal=[1, 1], seq_len=[1, 1])


def test_mean_std():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert mean_std([4.0]) == (4.0, 0.0)
    assert format_mean_std([0.3, 0.4], digits=2) == "0.35 ± 0.07"


def test_format_mean_std_reads_results_json_stats():
    """The one formatter of reports: per-seed values, a `seed_stat` dict (as stored in results JSON, NaN -> null),
    a single number, or nothing."""
    stat = seed_stat([0.3, 0.4, float("nan")])
    assert stat["values"][:2] == [0.3, 0.4] and format_mean_std(stat, 2) == "0.35 ± 0.07"
    assert format_mean_std({"mean": 0.5, "std": None}) == "0.500 ± 0.000"
    assert format_mean_std({"mean": None, "std": None}) == "—" and format_mean_std({}) == "—"
    assert format_mean_std(None) == "—" and format_mean_std(float("nan")) == "—"
    assert format_mean_std(0.25, 1) == "0.2" and format_mean_std(3) == "3.000"


def test_evaluate_module_loads_offline_and_matches(monkeypatch, tmp_path):
    evaluate = pytest.importorskip("evaluate")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for path in (MSV_CALIBRATION_PATH, MSV_CALIBRATION_PATH + "/msv_calibration.py"):
        metric = evaluate.load(path, cache_dir=str(tmp_path))
        got = metric.compute(predictions=P.tolist(), references=Y.tolist())
        want = calibration_metrics(P, Y)
        assert got.keys() == want.keys()
        assert all(got[k] == pytest.approx(want[k]) for k in want)


def test_paired_bootstrap_known_answers():
    from hf_msv.metrics import bootstrap_interval, paired_bootstrap

    rng = np.random.default_rng(0)
    # a constant per-problem gap is recovered exactly, whatever the spread of the problems themselves
    base = rng.random(50)
    iv = paired_bootstrap(base - 0.03, base, n_boot=300)
    assert iv["estimate"] == pytest.approx(-0.03) and iv["low"] == pytest.approx(-0.03)
    assert iv["high"] == pytest.approx(-0.03)
    # i.i.d. normal differences: the interval is mean ± 1.96 σ/√P (σ = 1, P = 400 → half-width ≈ 0.098)
    d = rng.normal(0.5, 1.0, 400)
    iv = paired_bootstrap(d, np.zeros(400), n_boot=4000, seed=1)
    assert iv["estimate"] == pytest.approx(d.mean())
    assert (iv["high"] - iv["low"]) / 2 == pytest.approx(1.96 * d.std() / 20, rel=0.1)
    assert iv["low"] < d.mean() < iv["high"]
    # pairing: shared problem difficulty cancels, so the paired interval is far narrower than unpaired noise
    hard = rng.normal(0, 5, 200)
    paired = paired_bootstrap(hard + 0.1 + rng.normal(0, 0.1, 200), hard, n_boot=1000)
    assert paired["low"] > 0
    # weights make the mean a pooled mean; ratio statistic
    iv = paired_bootstrap([2.0, 4.0], [1.0, 1.0], weights=[1, 3], statistic="ratio", n_boot=10)
    assert iv["estimate"] == pytest.approx(3.5)
    # a statistic that can be infinite (never reaches a target) gives an unbounded interval, not nan
    iv = bootstrap_interval(lambda idx: np.inf if 0 in idx else 1.0, 5, n_boot=200)
    assert iv["high"] == np.inf and iv["estimate"] == np.inf
    with pytest.raises(ValueError, match="one value per problem"):
        paired_bootstrap([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="statistic must be"):
        paired_bootstrap([1.0], [1.0], statistic="median")


def test_bce_with_logits_matches_torch_and_stays_finite():
    z = np.array([-40.0, -2.0, 0.0, 3.0, 40.0])
    y = np.array([1.0, 0.0, 1.0, 1.0, 0.0])
    expected = torch.nn.functional.binary_cross_entropy_with_logits(
        torch.tensor(z), torch.tensor(y), reduction="none"
    ).numpy()
    np.testing.assert_allclose(bce_with_logits(z, y), expected, rtol=1e-12)
    assert np.isfinite(bce_with_logits(z, y)).all() and bce_with_logits(z, y)[0] == pytest.approx(40.0)


def test_fold_by_problem_keeps_problems_whole_and_alternates_by_first_appearance():
    problems = np.array(["b", "a", "b", "c", "a", "d", "c"], dtype=object)
    fold = fold_by_problem(problems, 2)
    assert fold.tolist() == [0, 1, 0, 0, 1, 1, 0]  # b→0, a→1, c→0, d→1 in order of first appearance
    for q in set(problems):
        assert len(set(fold[problems == q])) == 1
    assert sorted(set(fold_by_problem(np.arange(7), 3))) == [0, 1, 2]


def test_difficulty_scores_reach_the_best_auroc_of_any_per_problem_score():
    """Ranking problems by accuracy is the best any scorer that gives a problem's answers one score can do: check it
    against every ordering of four problems (ties included) on random labels."""
    import itertools

    rng = np.random.default_rng(3)
    labels = [rng.integers(0, 2, size) for size in (5, 8, 3, 6)]
    labels[2] = np.ones(3)  # an all-right problem and an all-wrong one are part of difficulty too
    labels[3] = np.zeros(6)
    y = np.concatenate(labels)
    best = max(
        auroc(np.concatenate([np.full(len(group), r) for group, r in zip(labels, ranks)]), y)
        for ranks in itertools.product(range(4), repeat=4)
    )
    oracle = auroc(np.concatenate(difficulty_scores(labels)), y)
    assert oracle == pytest.approx(best)
    assert [s.tolist() for s in difficulty_scores([[1, 0, 0, 1], []])] == [[0.5] * 4, []]
    # a problem's answers tie: within a problem the oracle tells nothing
    assert within_problem_auroc(difficulty_scores(labels), labels) == 0.5


def test_within_problem_auroc_ignores_difficulty():
    """A scorer that orders each problem's answers perfectly but puts the hard problem's answers above the easy
    one's: within-problem AUROC 1, pooled well below; problems with one class are skipped."""
    labels = [np.array([1, 1, 1, 0]), np.array([1, 0, 0, 0]), np.array([1, 1])]
    scores = [np.array([0.3, 0.3, 0.3, 0.2]), np.array([0.9, 0.8, 0.8, 0.8]), np.array([0.0, 0.1])]
    assert within_problem_auroc(scores, labels) == 1.0
    assert auroc(np.concatenate(scores), np.concatenate(labels)) < 0.6
    scores[1] = np.array([0.7, 0.8, 0.9, 0.6])  # the hard problem's right answer ranks 2nd of 4
    assert within_problem_auroc(scores, labels) == pytest.approx((1.0 + 1 / 3) / 2)
    assert math.isnan(within_problem_auroc([np.array([0.5])], [np.array([1])]))
    per = per_problem_auroc(scores, labels)  # what a bootstrap over problems resamples
    assert per[:2].tolist() == pytest.approx([1.0, 1 / 3]) and math.isnan(per[2])
    idx = np.array([1, 1, 2, 0])
    resampled = within_problem_auroc([scores[i] for i in idx], [labels[i] for i in idx])
    assert resampled == pytest.approx(np.nanmean(per[idx])) == pytest.approx((1.0 + 2 / 3) / 3)
