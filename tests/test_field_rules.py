"""The field's rules (`hf_msv.evaluation.field_rules`) on a hand-built group whose cuts and outputs are worked out
by hand below, and the choice of their settings on validation groups only."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from hf_msv.data import AnswerGroup
from hf_msv.evaluation.field_rules import (
    ESC,
    AdaptiveConsistency,
    ChainRecord,
    Consensus,
    DeepConf,
    Dynasor,
    RuleCurve,
    SlimSC,
    SpeculativeRejection,
    all_tokens,
    chain_steps,
    choose_on_validation,
    choose_settings,
    field_rules,
    rule_curve,
    schedules,
)
from hf_msv.schedules import NEVER

# Four chains (seq_len 100, 80, 120, 110); every elicitation takes 5 steps (end = start + 5); class 1 is right.
#   chain 0: class 1 @25, 1 @55, 1 @105 (final)
#   chain 1: class 2 @35, 1 @85 (final)
#   chain 2: class 2 @45, 2 @65, 2 @95, 3 @125 (final)
#   chain 3: class 2 @35, 2 @60, 2 @115 (final)
#          a:  0    1    2    3    4    5    6    7    8    9   10   11
SEQUENCE = [0, 1, 3, 2, 0, 3, 2, 1, 2, 0, 3, 2]
START = [20, 30, 30, 40, 50, 55, 60, 80, 90, 100, 110, 120]
KLASS = [1, 2, 2, 2, 1, 2, 2, 1, 2, 1, 2, 3]
TERMINAL = [0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1, 1]
PROBE = [0.9, 0.2, 0.6, 0.3, 0.8, 0.65, 0.4, 0.7, 0.5, 0.9, 0.6, 0.1]
SEQ_LEN = [100, 80, 120, 110]


def group(problem_id: str = "p0", correct_class: int = 1) -> AnswerGroup:
    start = np.array(START)
    return AnswerGroup(
        sequence=SEQUENCE,
        end=start + 5,
        klass=KLASS,
        correct=np.array(KLASS) == correct_class,
        is_terminal=np.array(TERMINAL, bool),
        seq_len=SEQ_LEN,
        start=start,
        scores={"probe": PROBE},
        problem_id=problem_id,
    )


def confidences() -> tuple[np.ndarray, ...]:
    """Token confidences: chain 0 all 5, chain 1 a dip to 1 at tokens 40–43, chain 2 at 10–13, chain 3 all 4.
    With a window of 4 the lowest-group confidences are 5, 1, 1, 4."""
    c = [np.full(n, 5.0) for n in SEQ_LEN]
    c[1][40:44] = 1.0
    c[2][10:14] = 1.0
    c[3][:] = 4.0
    return tuple(c)


def test_steps_follow_each_chains_order():
    assert chain_steps(group()).tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 3]


def test_consensus_k_of_n():
    s = schedules(Consensus(), group(), None)  # k = 2, 3, 4, full
    # two chains hold class 2 at 35 (chains 1 and 3), three at 45 (chain 2 joins): both stops output class 2
    assert [x.stop_step for x in s[:2]] == [35, 45]
    assert [KLASS[x.chosen] for x in s[:2]] == [2, 2]
    assert s[0].cot_tokens(SEQ_LEN) == 4 * 35 and not s[0].pruned.any()
    # four never agree: full decoding, the latest answers' majority (chains 0 and 1: class 1)
    assert not s[2].stopped and s[2].cut.tolist() == [NEVER] * 4 and KLASS[s[2].chosen] == 1
    assert s[3].cot_tokens(SEQ_LEN) == sum(SEQ_LEN)


def test_adaptive_consistency():
    # P(p > ½), p ~ Beta(support + 1, runner-up + 1): 0.75 at 25 (one chain), 0.6875 at 35, 0.8125 at 45
    s = schedules(AdaptiveConsistency(thresholds=(0.7, 0.8)), group(), None)
    assert (s[0].stop_step, KLASS[s[0].chosen]) == (25, 1)
    assert (s[1].stop_step, KLASS[s[1].chosen]) == (45, 2)
    assert s[1].confidence == pytest.approx(0.8125)
    assert not s[2].stopped and KLASS[s[2].chosen] == 1


def test_esc_windows():
    s = schedules(ESC(windows=(2, 3)), group(), None)
    # w = 2: chains 0 and 1 both end on class 1, so chains 2 and 3 are never decoded
    assert s[0].cut.tolist() == [NEVER, NEVER, 0, 0] and s[0].pruned.tolist() == [False, False, True, True]
    assert KLASS[s[0].chosen] == 1 and s[0].cot_tokens(SEQ_LEN) == 180 and s[0].stop_step == 105
    # w = 3: classes 1, 1, 3 disagree and the last window is short: everything decoded, majority class 1
    assert s[1].cut.tolist() == [NEVER] * 4 and KLASS[s[1].chosen] == 1 and s[1].confidence == 0.5


def test_dynasor_cot():
    g = group()
    s = schedules(Dynasor(windows=(2, 3)), g, None)
    # w = 2: chain 0 agrees at 55, chain 2 at 65, chain 3 at 60; chain 1 (2 then 1) never
    assert s[0].cut.tolist() == [55, NEVER, 65, 60] and s[0].pruned.tolist() == [True, False, True, True]
    # latest answers: 1, 1, 2, 2; the tie goes to the class whose first vote arrived first (class 1 at 55)
    assert s[0].chosen == 4 and s[0].confidence == 0.5
    assert s[0].cot_tokens(SEQ_LEN) == 260
    # elicitations started before each cut: a0, a4 | a1, a7 | a3, a6 | a2, a5, five tokens each
    assert all_tokens(s[0], g) == 260 + 8 * 5
    # w = 3: chain 0 agrees only on its final answer (105 ≥ 100: no cut), chain 3 likewise; chain 2 at 95
    assert s[1].cut.tolist() == [NEVER, NEVER, 95, NEVER]
    assert all_tokens(s[2], g) == sum(SEQ_LEN) + 12 * 5
    best = schedules(Dynasor(windows=(2,), output="probe"), g, None)[0]
    assert best.chosen == 7 and best.confidence == 0.7  # the only final answer available: chain 1's


def test_speculative_rejection():
    s = schedules(SpeculativeRejection(scorer="probe", intervals=(32,), fractions=(0.5,)), group(), None)
    # t=32: only chain 0 has an answer (nothing rejected of one); t=64: latest 0.8, 0.2, 0.3, 0.65: chains 1 and 2
    # go; t=96: chains 0 (0.8) and 3 (0.65) still running: chain 3 goes; chain 0 ends at 100 and outputs 0.9
    assert s[0].cut.tolist() == [NEVER, 64, 64, 96]
    assert s[0].chosen == 9 and s[0].confidence == 0.9
    assert s[0].cot_tokens(SEQ_LEN) == 100 + 64 + 64 + 96
    # elicitation: chain 0 all three (15), chain 1 a1 (5), chain 2 a3 (5) and 4 of a6's 5 (60 → 64), chain 3 a2, a5
    assert all_tokens(s[0], group()) == 324 + 15 + 5 + 9 + 10
    assert s[1].cut.tolist() == [NEVER] * 4 and s[1].chosen == 9  # full decoding: the best final answer


def test_slim_sc():
    s = schedules(SlimSC(thresholds=(0.9,), interval=32), group(), None)
    # t=96: chains 2 ({2: 3}) and 3 ({2: 2}) are identical (cosine 1); both have mean similarity ½, the later goes
    assert s[0].cut.tolist() == [NEVER, NEVER, NEVER, 96] and s[0].pruned.tolist() == [False, False, False, True]
    # survivors' final answers: 1, 1, 3
    assert KLASS[s[0].chosen] == 1 and s[0].confidence == pytest.approx(2 / 3)


def test_deepconf_validation_warmup():
    g, x = group(), ChainRecord(token_confidence=confidences())
    rule = DeepConf(percentile=50, window=4, consensus=(0.6,))
    with pytest.raises(ValueError, match="fit"):
        schedules(rule, g, x)
    fitted = rule.fit([g], [x])
    assert fitted.threshold == 2.5  # the median of 5, 1, 1, 4
    s = schedules(fitted, g, x)  # tau = 0.6, inf, full
    # s = 2.5: chain 1's window [39, 43) has mean 2 (terminated at 43), chain 2's [9, 13) (at 13); chain 0 finishes
    # at 105 with all the finished weight: share 1 ≥ 0.6 stops the group there (chain 3 cut at 105)
    assert s[0].cut.tolist() == [NEVER, 43, 13, 105] and s[0].pruned.tolist() == [False, True, True, False]
    assert s[0].stopped and s[0].stop_step == 105 and s[0].chosen == 9 and s[0].confidence == 1.0
    # τ = ∞: chains 0 (weight 5, class 1) and 3 (weight 4, class 2) vote at the end
    assert s[1].cut.tolist() == [NEVER, 43, 13, NEVER] and s[1].chosen == 9
    assert s[1].confidence == pytest.approx(5 / 9)
    # full decoding: every chain votes: class 1 holds 5 + 1 of 11
    assert s[2].cut.tolist() == [NEVER] * 4 and s[2].confidence == pytest.approx(6 / 11)


def test_deepconf_first_chains_warmup():
    g, x = group(), ChainRecord(token_confidence=confidences())
    s = schedules(DeepConf(percentile=50, window=4, warmup="first_k", warmup_chains=2, consensus=(0.6,)), g, x)
    # warm-up: chains 0 and 1 (lowest groups 5 and 1: s = 3), decoded in full; they agree on class 1 before the
    # others start, so τ = 0.6 stops at once: chains 2 and 3 are never decoded
    assert s[0].stopped and s[0].stop_step == 0 and s[0].cut.tolist() == [NEVER, NEVER, 0, 0]
    assert KLASS[s[0].chosen] == 1 and s[0].cot_tokens(SEQ_LEN) == 180
    # τ = ∞: chain 2 is terminated at 13 (window [9, 13) has mean 2 < 3), chain 3 (4 ≥ 3) runs on; warm-up chains
    # are never terminated (chain 1's own dip is below s)
    assert s[1].cut.tolist() == [NEVER, NEVER, 13, NEVER] and s[1].pruned.tolist() == [False, False, True, False]
    assert s[1].confidence == pytest.approx(6 / 10)


def test_deepconf_short_chains_are_not_judged():
    rule = DeepConf(window=200, threshold=10.0, consensus=())  # every window is below s, but no chain fills one
    s = schedules(rule, group(), ChainRecord(token_confidence=confidences()))
    assert all((x.cut == NEVER).all() for x in s)


def test_every_rule_has_its_grid_and_full_decoding_last():
    g = replace(group(), scores={"probe": PROBE, "msv": PROBE})
    x = ChainRecord(token_confidence=confidences())
    for name, rule in field_rules().items():
        rule = (
            DeepConf(percentile=rule.percentile, threshold=3.0)
            if name.startswith("deepconf-") and (rule.warmup == "validation")
            else rule
        )
        s = schedules(rule, g, x)
        assert len(s) == len(rule.grid(4)), name
        assert s[-1].cot_tokens(SEQ_LEN) == sum(SEQ_LEN), name
        assert all(0 <= t.chosen < g.num_answers for t in s), name


def test_choose_settings_tolerance_and_budgets():
    # settings: cheap and wrong, 0.5 tokens 1 pp below full, 0.8 tokens level, full
    correct = np.zeros((100, 4), bool)
    correct[:50, 0], correct[:69, 1], correct[:70, 2], correct[:70, 3] = True, True, True, True
    cot = np.tile([20, 50, 80, 100], (100, 1))
    curve = RuleCurve(("a", "b", "c", "full"), correct, cot, cot, np.full(100, 100), np.full(100, 100), ("p",) * 100)
    within, b30, b50, b70 = choose_settings(curve, tolerance=0.01)
    assert (within.setting, within.accuracy, within.token_fraction) == ("b", 0.69, 0.5)
    assert (b30.setting, b50.setting, b70.setting) == ("a", "b", "b")


def test_choice_reads_validation_only():
    val = [group("v0"), group("v1", correct_class=2)]
    x = ChainRecord(token_confidence=confidences())
    rule = DeepConf(percentile=50, window=4)
    fitted, curve, choices = choose_on_validation(rule, val, [x, x])
    assert fitted.threshold == 2.5 and curve.problem == ("v0", "v1")
    # evaluation groups with other answers' correctness and other confidences do not move anything chosen
    other = ChainRecord(token_confidence=tuple(c * 0 + 9.0 for c in confidences()))
    evaluation = [group("e0", correct_class=3)]
    again = choose_on_validation(rule, val, [x, x])
    assert again[0] == fitted and again[2] == choices
    applied = rule_curve(fitted, evaluation, [other])
    assert applied.correct.shape == (1, len(fitted.grid(4))) and fitted.threshold == 2.5
    # a rule that fits nothing passes through unchanged
    assert choose_on_validation(Consensus(), val)[0] == Consensus()
    assert math.isclose(curve.fraction()[-1], 1.0)
