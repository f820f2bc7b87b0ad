"""The field's stopping statistics and the stop head (hf_msv.stop_rules) on hand-built answer streams."""

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_msv.baselines import latest_answer_vote
from hf_msv.stop_rules import (
    STOP_PENALTIES,
    StopHead,
    adaptive_consistency,
    chain_support,
    choose_stop_penalty,
    consensus_share,
    fit_stop_head,
    fit_stop_rule,
    leader_events,
    no_loss_labels,
    probe_stability,
    stop_events,
    stop_features,
    stop_statistic,
)

# Four chains. Chain 0 answers 7, 7, 7; chain 1 answers 3 then 7; chain 2 answers 7 once, late; chain 3 is silent.
#          idx:  0  1  2  3  4  5
KLASS = np.array([7, 3, 7, 7, 7, 3])
SEQUENCE = np.array([0, 1, 0, 1, 0, 2])
STEP = np.array([0, 0, 1, 1, 2, 0])
END = np.array([5, 6, 9, 12, 14, 20])
COLUMNS = (KLASS, SEQUENCE, STEP, END)


def test_chain_support_counts_each_chains_latest_answer_and_silent_chains():
    support, answered = chain_support(*COLUMNS)
    np.testing.assert_array_equal(support, [1, 1, 1, 2, 2, 1])
    np.testing.assert_array_equal(answered, [1, 2, 2, 2, 2, 3])
    # The latest-answer vote divides by the chains that have answered; consensus by all four.
    np.testing.assert_allclose(support / answered, latest_answer_vote(KLASS, SEQUENCE, STEP, END))
    np.testing.assert_allclose(consensus_share(*COLUMNS, num_chains=4), support / 4)


def test_a_lone_early_answer_is_no_consensus():
    """The latest-answer vote gives the first answer share 1; consensus over N = 4 chains gives it 1/4."""
    assert latest_answer_vote(KLASS, SEQUENCE, STEP, END)[0] == 1.0
    assert consensus_share(*COLUMNS, num_chains=4)[0] == 0.25


def test_probe_stability_needs_the_last_window_answers_to_agree():
    # window 2: chain 0 is steady on 7 from its second answer; chain 1 ([3, 7]) never is.
    np.testing.assert_allclose(probe_stability(*COLUMNS, num_chains=4, window=2), [0, 0, 0.25, 0.25, 0.25, 0])
    np.testing.assert_allclose(probe_stability(*COLUMNS, num_chains=4, window=3), [0, 0, 0, 0, 0.25, 0])
    with pytest.raises(ValueError, match="window"):
        chain_support(*COLUMNS, window=0)


def test_adaptive_consistency_is_the_beta_criterion_against_the_runner_up():
    from scipy.stats import beta

    got = adaptive_consistency(*COLUMNS)
    # idx 3: class 7 backed by chains 0 and 1 (2), runner-up none (0); idx 5: class 3 by chain 2 (1) vs 7 (2).
    assert got[3] == pytest.approx(beta.sf(0.5, 3, 1))
    assert got[5] == pytest.approx(beta.sf(0.5, 2, 3))
    assert got[1] == pytest.approx(0.5)  # 3 vs 7, one chain each


def test_stop_statistic_names_and_errors():
    np.testing.assert_allclose(stop_statistic("consensus", *COLUMNS, 4), consensus_share(*COLUMNS, num_chains=4))
    with pytest.raises(ValueError, match="unknown stop rule"):
        stop_statistic("vote", *COLUMNS, 4)


def test_the_stop_head_learns_to_distrust_a_high_score_without_support():
    """Synthetic validation groups whose correctness depends on support, not on the (noisy, high) score: the fitted
    head puts weight on support, so a lone high-scored answer gets less than a supported one."""
    rng = np.random.default_rng(0)
    m = 4000
    support = rng.integers(1, 17, m) / 16
    score = rng.uniform(0.7, 1.0, m)
    y = rng.random(m) < 0.1 + 0.85 * support
    z = np.log(score / (1 - score))
    x = np.stack([z, support, np.ones(m), np.full(m, -8.0), np.zeros(m), z], 1)
    head = fit_stop_head(x, y, group=np.arange(m) // 8, end=np.arange(m) % 8, num_chains=16)
    assert head.coef[1] > 2
    lone, backed = head.predict(
        np.array([[np.log(99), 1 / 16, 1, -8, 0, np.log(99)], [np.log(3), 12 / 16, 1, -8, 0, np.log(3)]])
    )
    assert lone < backed
    assert StopHead.from_dict(head.to_dict()) == head
    x = stop_features(np.full(6, 0.9), *COLUMNS, num_chains=4)
    np.testing.assert_allclose(head(np.full(6, 0.9), *COLUMNS, num_chains=4), head.predict(x))


def synthetic_answers(problems: int, support_matters: bool, seed: int):
    """Stop-head rows of `problems` groups of 24 answers each: correctness follows the class's mean logit, and (when
    `support_matters`) strongly the class's support too; otherwise support is noise."""
    rng = np.random.default_rng(seed)
    m = problems * 24
    z = rng.normal(0.0, 2.0, m)
    support = rng.integers(1, 17, m) / 16
    drive = 0.8 * z + (6.0 * (support - 0.5) if support_matters else 0.0)
    y = rng.random(m) < 1 / (1 + np.exp(-drive))
    x = np.stack([z, support, np.ones(m), np.full(m, -8.0), np.zeros(m), z + rng.normal(0, 0.3, m)], 1)
    group = np.arange(m) // 24
    return x, y, group, np.arange(m) % 24, group


def test_the_head_at_infinite_penalty_is_platt_scaling_of_the_class_mean_logit():
    """∞: only the class's mean logit and the intercept are fitted, so the head ranks answers by that mean."""
    x, y, group, end, _ = synthetic_answers(40, True, 0)
    head = fit_stop_head(x, y, group, end, num_chains=16, penalty=np.inf)
    assert head.coef[1:] == (0.0,) * 5 and head.coef[0] > 0
    stat = head.predict(x)
    assert (np.argsort(stat, kind="stable") == np.argsort(x[:, 0], kind="stable")).all()
    free = fit_stop_head(x, y, group, end, num_chains=16, penalty=0.0)
    middle = fit_stop_head(x, y, group, end, num_chains=16, penalty=256.0)
    assert abs(free.coef[1]) > abs(middle.coef[1]) > 0  # the ridge shrinks support's weight, not to zero


def test_cross_validation_keeps_what_the_data_support():
    """Many problems where support drives correctness: a small penalty, support weighted. Few problems where it is
    noise: mostly the largest penalties (the head keeps the raw score's ranking)."""
    x, y, group, end, problem = synthetic_answers(300, True, 1)
    rich = choose_stop_penalty(x, y, group, end, problem, num_chains=16)
    assert rich.penalty <= 64.0 and rich.folds == 4
    assert len(rich.losses) == len(STOP_PENALTIES) == len(rich.standard_errors)
    assert rich.losses[0] < rich.losses[-1]  # support helps out of fold
    assert fit_stop_head(x, y, group, end, 16, penalty=rich.penalty).coef[1] > 1.0
    chosen = []
    for seed in range(8):
        x, y, group, end, problem = synthetic_answers(32, False, 100 + seed)
        poor = choose_stop_penalty(x, y, group, end, problem, num_chains=16)
        j = STOP_PENALTIES.index(poor.penalty)
        assert poor.losses[j] - min(poor.losses) <= poor.standard_errors[j]  # the one-standard-error rule
        chosen.append(poor.penalty)
    assert np.median(chosen) >= 256.0, chosen
    one = choose_stop_penalty(x[:24], y[:24], group[:24], end[:24], problem[:24], num_chains=16)
    assert one.penalty == np.inf and one.folds == 1


def test_stop_features_by_hand():
    scores = np.array([0.5, 0.9, 0.8, 0.6, 0.7, 0.99])
    z = np.log(scores / (1 - scores))
    x = stop_features(scores, *COLUMNS, num_chains=4)
    # idx 3 (end 12): chains 0 and 1 both stand by 7 (latest answers 2 and 3); no runner-up.
    np.testing.assert_allclose(x[3], [(z[2] + z[3]) / 2, 2 / 4, 2 / 4, -8.0, 0.0, max(z[[0, 2, 3]])])
    # idx 5 (end 20): class 3 held by chain 2 alone; runner-up 7 held by chains 0 and 1 (answers 4 and 3).
    np.testing.assert_allclose(x[5], [z[5], 1 / 4, 3 / 4, (z[4] + z[3]) / 2, 2 / 4, max(z[[1, 5]])])


def test_leader_events_are_the_best_available_answer_at_each_arrival():
    stat = np.array([0.3, 0.9, 0.5, 0.95, 0.1])
    group = np.array([0, 0, 0, 0, 1])
    end = np.array([1, 2, 2, 5, 1])
    np.testing.assert_array_equal(leader_events(stat, group, end), [0, 1, 3, 4])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_statistics_are_causal(seed):
    """An answer's statistic depends only on the answers available by its end: dropping every later answer leaves
    it unchanged (what lets generate compute it live)."""
    rng = np.random.default_rng(seed)
    a = int(rng.integers(1, 25))
    sequence = rng.integers(0, 5, a)
    step = np.array([np.sum(sequence[:i] == sequence[i]) for i in range(a)])
    end = np.array([10 * s + int(rng.integers(0, 9)) for s in step]) + rng.integers(0, 3, a)
    klass = rng.integers(0, 3, a)
    cut = np.median(end)
    keep = end <= cut
    late = np.flatnonzero(~keep)
    for rule in ("consensus", "adaptive-consistency", "probe-stability"):
        full = stop_statistic(rule, klass, sequence, step, end, 5)
        part = stop_statistic(rule, klass[keep], sequence[keep], step[keep], end[keep], 5)
        np.testing.assert_allclose(full[keep], part)
        # `only` (what generate computes for the answers that just arrived) gives the same values for them
        np.testing.assert_allclose(stop_statistic(rule, klass, sequence, step, end, 5, only=late)[late], full[late])
    scores = rng.uniform(0.01, 0.99, a)
    x = stop_features(scores, klass, sequence, step, end, 5)
    np.testing.assert_allclose(
        x[keep], stop_features(scores[keep], klass[keep], sequence[keep], step[keep], end[keep], 5)
    )
    np.testing.assert_allclose(stop_features(scores, klass, sequence, step, end, 5, only=late)[late], x[late])


def test_no_loss_labels_mark_the_guarantees_loss():
    """0 exactly where full decoding (the best terminal answer by the statistic) is right and the answer is wrong."""
    #                 group 0: full decoding picks idx 2 (right)   group 1: it picks idx 5 (wrong)
    stat = np.array([0.9, 0.2, 0.7, 0.9, 0.1, 0.6])
    labels = np.array([0, 0, 1, 1, 1, 0])
    group = np.array([0, 0, 0, 1, 1, 1])
    terminal = np.array([False, True, True, False, True, True])
    got = no_loss_labels(stat, labels, group, terminal)
    assert got.tolist() == [False, False, True, True, True, True]
    # A group without terminal answers reads full decoding as its best answer overall.
    assert no_loss_labels(stat[:2], labels[:2], group[:2], np.zeros(2, bool)).tolist() == [True, True]


def test_the_two_part_head_reports_a_confidence_calibrated_where_its_statistic_leads():
    """`fit_stop_rule`: the statistic is fitted on the no-loss labels and the confidence on correctness, both
    calibrated in the mean on the statistic's leader events (the answers its stops output); the head survives the
    config round trip, and a one-part head's dict (without a confidence) still loads, reporting its statistic."""
    x, y, group, end, problem = synthetic_answers(120, True, 3)
    terminal = end >= 20
    fit = fit_stop_rule(x, y, group, end, terminal, problem, num_chains=16)
    head = fit.head
    assert head.confidence_coef is not None and fit.penalty.folds == fit.confidence_penalty.folds == 4
    stat, confidence = head.predict(x), head.confidence(x)
    rows = leader_events(stat, group, end, snapshots=True)  # the fit reads its rows as class snapshots
    assert confidence[rows].mean() == pytest.approx(y[rows].mean(), abs=2e-3)
    target = no_loss_labels(
        fit_stop_head(x, y, group, end, 16, penalty=fit.confidence_penalty.penalty).predict(x), y, group, terminal
    )
    assert target.mean() > y.mean()  # groups whose full decoding is wrong lose nothing by stopping
    # (fitted on the leaders of the previous round's head, so only near the mean on its own leaders)
    assert stat[rows].mean() == pytest.approx(target[rows].mean(), abs=0.01)
    assert not np.allclose(stat, confidence)
    assert StopHead.from_dict(head.to_dict()) == head
    one_part = StopHead(coef=head.coef, intercept=head.intercept, num_chains=16)
    assert "confidence_coef" not in one_part.to_dict()
    np.testing.assert_allclose(StopHead.from_dict(one_part.to_dict()).confidence(x), stat)
    correctness = fit_stop_rule(x, y, group, end, terminal, problem, 16, statistic="correctness")
    assert correctness.head.confidence_coef is None and correctness.penalty == fit.confidence_penalty
    with pytest.raises(ValueError, match="statistic must be one of"):
        fit_stop_rule(x, y, group, end, terminal, problem, 16, statistic="vote")


# Six chains, classes A = 0, B = 1, C = 2. A is backed by chains 0, 2, 4, B by chains 1, 3; at t = 6 chain 3 moves
# from B to C. No A answer arrives then, but A's runner-up drops from 2 chains to 1: A's Adaptive-Consistency value
# rises from P(Beta(4, 3) > ½) = 0.656 to P(Beta(4, 2) > ½) = 0.8125, which only a refreshed statistic records.
#                   idx: 0  1  2  3  4  5
CROSS_KLASS = np.array([0, 1, 0, 1, 0, 2])
CROSS_SEQUENCE = np.array([0, 1, 2, 3, 4, 3])
CROSS_STEP = np.array([0, 0, 0, 0, 0, 1])
CROSS_END = np.array([1, 2, 3, 4, 5, 6])
CROSS = (CROSS_KLASS, CROSS_SEQUENCE, CROSS_STEP, CROSS_END)


def test_a_refreshed_class_statistic_catches_the_crossing_the_stale_one_missed():
    from scipy.stats import beta

    from hf_msv.generation import decide_stop

    stale = adaptive_consistency(*CROSS)  # each answer's class at its own arrival
    assert stale[4] == pytest.approx(beta.sf(0.5, 4, 3)) and stale.max() == pytest.approx(0.75)  # A alone at t = 1
    events = stop_events("adaptive-consistency", *CROSS, 6)
    at_six = (events.time == 6) & (events.klass == 0)
    assert events.statistic[at_six] == pytest.approx(beta.sf(0.5, 4, 2))  # A, refreshed at C's arrival
    assert events.answer[at_six] == 4  # A's latest held answer: what a stop on it outputs
    # Every class held at t = 6 has its row; the per-answer view is the old statistic.
    assert events.klass[events.time == 6].tolist() == [0, 1, 2]
    np.testing.assert_allclose(events.at_answers(CROSS_KLASS, CROSS_END)[0], stale)
    fresh = decide_stop(events.time, events.statistic, np.zeros(events.size, bool), 0.8, snapshots=True)
    assert fresh.stopped[0] and fresh.stop_step[0] == 6 and events.answer[fresh.chosen[0]] == 4
    assert not decide_stop(CROSS_END, stale, np.zeros(6, bool), 0.8).stopped[0]


def test_the_crossing_is_caught_identically_live_and_in_the_replay():
    """The live path both engines drive (`StopRuleScorer` streams into `PromptGroup.apply_stop_rule`), fed the
    hand-built answers in arrival order, stops at t = 6 on A; so does the evaluation's replay of the recorded group."""
    from hf_msv.data import AnswerGroup
    from hf_msv.evaluation.early_stop import replay_many
    from hf_msv.generation import MSVAnswer, StopRuleScorer
    from hf_msv.generation.tracking import PromptGroup

    class Half:  # a base scorer whose scores the training-free rule does not read
        config = None

        def begin(self, num_sequences, streaming):
            return self

        def score(self, ready):
            return [0.5] * len(ready)

    def answer(i):
        return MSVAnswer(
            text=str(CROSS_KLASS[i]), raw_text="", token_ids=[], prompt=0, sequence=int(CROSS_SEQUENCE[i]),
            step=int(CROSS_STEP[i]), tau=int(CROSS_END[i]) - 1, length=1, end=int(CROSS_END[i]), trigger="delimiter",
            terminal=False, cot_tokens=0, elicitation_ids=[], class_id=int(CROSS_KLASS[i]),
        )  # fmt: skip

    stream = StopRuleScorer(Half(), "adaptive-consistency").begin(6, streaming=True)
    group, answers = PromptGroup(classes=None, live=6), [answer(i) for i in range(6)]
    for a in answers:  # one arrival per step, as the scoring queue releases them
        a.score = stream.score([a])[0]
        group.answers.append(a)
        decided = group.apply_stop_rule(0.8, pending=False)
        if decided:
            break
    assert decided and group.stop_step == 6 and group.chosen is answers[4]
    assert group.confidence == pytest.approx(0.8125)

    recorded = AnswerGroup(
        sequence=CROSS_SEQUENCE, end=CROSS_END, klass=CROSS_KLASS, correct=CROSS_KLASS == 0,
        is_terminal=np.zeros(6, bool), seq_len=np.full(6, 7), scores={"ac": adaptive_consistency(*CROSS)},
        events={"ac": stop_events("adaptive-consistency", *CROSS, 6)},
    )  # fmt: skip
    replayed = replay_many(recorded, "ac", [0.8])
    assert replayed.stopped[0] and replayed.steps[0] == 6 and replayed.chosen[0] == 4 and replayed.correct[0]


def test_the_stop_head_is_fitted_on_refreshed_rows():
    """Training reads the same snapshots: at t = 6 the row of A carries its refreshed runner-up (1 chain of 6), which
    the per-answer features of A's last arrival (2 chains) never saw."""
    from hf_msv.training.stopping_curve import stop_head_events, stop_head_features

    structure = {
        "group": np.zeros(6, np.int64), "klass": CROSS_KLASS, "sequence": CROSS_SEQUENCE, "step": CROSS_STEP,
        "end": CROSS_END, "terminal": np.zeros(6, bool),
    }  # fmt: skip
    p = np.full(6, 0.7)
    events = stop_head_events(p, structure, 6)
    row = (events.time == 6) & (events.answer == 4)
    assert events.features[row][0][4] == pytest.approx(1 / 6)
    assert stop_head_features(p, structure, 6)[4][4] == pytest.approx(2 / 6)


def test_support_floor_keeps_a_small_class_from_stopping_or_being_output():
    """A class held by less than `min_share` of the chains has its statistic and confidence scaled by
    `FLOOR_SCALE`: a lone late answer scored high no longer outranks a class two chains hold (scored lower)."""
    from hf_msv.generation import decide_stop
    from hf_msv.stop_rules import FLOOR_SCALE

    head = StopHead(coef=(1.0, 0, 0, 0, 0, 0), intercept=0.0, num_chains=4)  # σ(the class's mean logit)
    floored = StopHead(coef=head.coef, intercept=0.0, num_chains=4, min_share=0.5)
    scores = np.array([0.6, 0.3, 0.6, 0.6, 0.6, 0.99])  # the lone class 3 of chain 2 arrives last, scored 0.99
    plain = stop_events(head, *COLUMNS, 4, scores)
    low = stop_events(floored, *COLUMNS, 4, scores)

    def support(t, k):  # chains whose latest answer by t is of class k
        latest = {n: KLASS[i] for i in np.argsort(END) if END[i] <= t for n in [SEQUENCE[i]]}
        return sum(v == k for v in latest.values())

    small = np.array([support(t, k) < 2 for t, k in zip(plain.time, plain.klass)])
    assert small.any() and (~small).any()
    np.testing.assert_allclose(low.statistic[small], plain.statistic[small] * FLOOR_SCALE)
    np.testing.assert_allclose(low.confidence[~small], plain.confidence[~small])
    # At the last arrival (t = 20): class 3 (one chain, 0.99) against class 7 (two chains, 0.6).
    last = plain.time == 20
    final = np.ones(plain.answer.size, bool)
    outputs = []
    for ev in (plain, low):
        d = decide_stop(ev.time, ev.statistic, final, np.array([np.inf]), ev.confidence, snapshots=True)
        outputs.append(int(KLASS[ev.answer[d.chosen[0]]]))
    assert last.sum() == 2 and outputs == [3, 7]
    assert StopHead.from_dict(floored.to_dict()) == floored and "min_share" not in head.to_dict()


def test_a_floor_below_a_switch_holds_only_in_runs_below_it():
    """`StopHead.at` gives the head of a run at λ: the floor below `floor_below`, none at and above it or in full
    decoding; unresolved, the switching head reads as the plain one; the switch is written and read back."""
    plain = StopHead(coef=(1.0, 0, 0, 0, 0, 0), intercept=0.0, num_chains=4)
    floored = replace(plain, min_share=0.5)
    switching = replace(floored, floor_below=0.8)
    assert switching.switches and not floored.switches and not replace(plain, floor_below=0.8).switches
    assert switching.at(0.5) == floored and switching.at(0.79) == floored
    for lam in (0.8, 0.95, math.inf, None, math.nan):
        assert switching.at(lam) == plain
    assert floored.at(0.5) is floored and plain.at(None) is plain
    scores = np.array([0.6, 0.3, 0.6, 0.6, 0.6, 0.99])
    same, low = (stop_events(h, *COLUMNS, 4, scores) for h in (switching, floored))
    base = stop_events(plain, *COLUMNS, 4, scores)
    np.testing.assert_array_equal(same.statistic, base.statistic)
    assert not np.array_equal(low.statistic, base.statistic)
    assert StopHead.from_dict(switching.to_dict()) == switching and "floor_below" not in floored.to_dict()
