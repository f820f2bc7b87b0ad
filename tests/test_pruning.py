"""Per-chain pruning: the decision (`hf_msv.pruning.prune_chains`), its exact replay beside the group stop
(`hf_msv.training.pruned_replay`), the token accounting, and the joint Learn-then-Test (`choose_jointly`).

`scripted_group` and `SCRIPTED_PRUNES` are a hand-built group and the prunes its rule makes: the live generation
core driven with the same answers and scores (a scorer returning `scripted_group()["score"]`) must prune the same
chains at the same times.
"""

import json
from dataclasses import replace

import numpy as np
import pytest

from hf_msv.data import AnswerGroup
from hf_msv.evaluation.early_stop import replay_many
from hf_msv.lambda_rule import LAMBDAS, choose_jointly, choose_lambda
from hf_msv.metrics import ece
from hf_msv.pruning import (
    CHAIN_FEATURES,
    DECODING,
    ENDED,
    PRUNE_OFF,
    PRUNED,
    PruneRule,
    chain_features,
    chain_status,
    held_answers,
    prune_chains,
)
from hf_msv.schedules import NEVER
from hf_msv.stop_rules import STOP_TIME_FEATURES, ConfidenceMap, StopHead, stop_events, stop_time_features
from hf_msv.training.pruned_replay import ReplayGroup, replay_pruning, replay_sweep, sweep_group, sweep_groups
from hf_msv.training.regret import RegretHead, fit_regret, regret_rows

# Confidence = statistic = σ(the class's mean logit): the snapshot confidence of a class is its chains' mean score.
MEAN_HEAD = StopHead(coef=(1.0, 0.0, 0.0, 0.0, 0.0, 0.0), intercept=0.0, num_chains=4)

# The scripted group's rule: a chain whose last 2 answers agree is pruned (the steady clause).
SCRIPTED_RULE = PruneRule(steady=2)


def scripted_group() -> dict:
    """A hand-built group of 4 chains, each array (A,) in (end, sequence) order: ``sequence``, ``step``,
    ``start`` (τ), ``end`` (τ + 2: one segment token and one answer token), ``klass``, ``score`` (the verifier's
    probability, fixed), ``correct``, ``terminal``; and ``seq_len`` (4,). Class 0 is right.

    Chain 0 answers 0, 0 (steady at t = 22: pruned there; its terminal answer at 60 never arrives), chain 1
    answers 1, 0, 0 (steady at t = 42), chain 2 answers 1, 1 at t = 32 and 52, but ends at 50 (its terminal answer
    arrives at 52: ended chains are never pruned), chain 3 answers 2, 0, 1 (never steady).
    """
    rows = [  # (sequence, step, start, klass, score, terminal)
        (0, 0, 10, 0, 0.7, False),
        (1, 0, 12, 1, 0.4, False),
        (3, 0, 15, 2, 0.2, False),
        (0, 1, 20, 0, 0.8, False),
        (1, 1, 25, 0, 0.6, False),
        (3, 1, 28, 0, 0.5, False),
        (2, 0, 30, 1, 0.3, False),
        (1, 2, 40, 0, 0.7, False),
        (3, 2, 45, 1, 0.4, False),
        (2, 1, 50, 1, 0.3, True),
        (0, 2, 58, 0, 0.9, True),
        (1, 3, 62, 0, 0.8, True),
        (3, 3, 70, 0, 0.6, True),
    ]
    sequence, step, start, klass, score, terminal = (np.array(c) for c in zip(*rows))
    return {
        "sequence": sequence,
        "step": step,
        "start": start,
        "end": start + 2,
        "klass": klass,
        "score": score.astype(np.float64),
        "correct": klass == 0,
        "terminal": terminal.astype(bool),
        "seq_len": np.array([58, 62, 50, 70]),
    }


# (t, chains pruned at t) under SCRIPTED_RULE with the scripted (fixed) scores.
SCRIPTED_PRUNES = ((22, (0,)), (42, (1,)))


def _replay_group(d: dict) -> ReplayGroup:
    return ReplayGroup(
        d["sequence"], d["step"], d["end"], d["start"], d["klass"], d["correct"], d["terminal"], d["seq_len"], "p"
    )


def _fixed_scorer(scores):
    def scorer(groups, keeps):
        return [np.where(k, s, np.nan) for s, k in zip(scores, keeps)]

    return scorer


def _rows(t, head, d, keep=None):
    keep = np.ones(d["end"].size, bool) if keep is None else keep
    ev = stop_events(
        head, d["klass"][keep], d["sequence"][keep], d["step"][keep], d["end"][keep], 4, d["score"][keep], times=[t]
    )
    return ev.klass, ev.confidence


# -- the decision --------------------------------------------------------------------------------------------------


def test_held_answers_and_status():
    d = scripted_group()
    held, count = held_answers(22, d["sequence"], d["step"], d["end"], 4)
    assert held.tolist() == [3, 1, -1, 2] and count.tolist() == [2, 1, 0, 1]
    status = chain_status(52, d["seq_len"], np.array([22, NEVER, NEVER, NEVER]))
    assert status.tolist() == [PRUNED, DECODING, ENDED, DECODING]


def test_off_prunes_nothing():
    d = scripted_group()
    k, c = _rows(72, MEAN_HEAD, d)
    out = prune_chains(PRUNE_OFF, 72, d["sequence"], d["step"], d["end"], d["klass"], k, c, np.zeros(4, int))
    assert not out.any() and PRUNE_OFF.off


def test_steady_clause():
    d = scripted_group()
    args = (d["sequence"], d["step"], d["end"], d["klass"])
    k, c = _rows(22, MEAN_HEAD, d)
    assert prune_chains(SCRIPTED_RULE, 22, *args, k, c, np.zeros(4, int)).tolist() == [True, False, False, False]
    # Not before its second answer arrives, and never a chain that is not decoding.
    k, c = _rows(17, MEAN_HEAD, d)
    assert not prune_chains(SCRIPTED_RULE, 17, *args, k, c, np.zeros(4, int)).any()
    k, c = _rows(22, MEAN_HEAD, d)
    assert not prune_chains(SCRIPTED_RULE, 22, *args, k, c, np.array([ENDED, 0, 0, 0])).any()
    # The class floor: class 0's confidence at t = 22 is 0.8 (its one holding chain's latest score).
    floor = PruneRule(steady=2, steady_confidence=0.85)
    assert not prune_chains(floor, 22, *args, k, c, np.zeros(4, int)).any()
    # A window of 3 needs three agreeing answers: at t = 42 chain 1 has 1, 0, 0.
    k, c = _rows(42, MEAN_HEAD, d)
    assert not prune_chains(PruneRule(steady=3), 42, *args, k, c, np.zeros(4, int)).any()
    assert prune_chains(PruneRule(steady=2), 42, *args, k, c, np.zeros(4, int))[1]


def test_ruled_out_clause():
    d = scripted_group()
    args = (d["sequence"], d["step"], d["end"], d["klass"])
    k, c = _rows(17, MEAN_HEAD, d)  # class 0: 0.7, class 1: 0.4, class 2: 0.2
    rule = PruneRule(doubt=0.3, lead=0.6)
    assert prune_chains(rule, 17, *args, k, c, np.zeros(4, int)).tolist() == [False, False, False, True]
    # No class leads enough: nothing is ruled out.
    assert not prune_chains(PruneRule(doubt=0.3, lead=0.8), 17, *args, k, c, np.zeros(4, int)).any()
    # The leading class is never ruled out by itself, however low its own confidence.
    assert not prune_chains(PruneRule(doubt=0.75, lead=0.71), 17, *args, k, c, np.zeros(4, int))[0]
    # min_answers: chain 3 has answered once.
    assert not prune_chains(PruneRule(doubt=0.3, lead=0.6, min_answers=2), 17, *args, k, c, np.zeros(4, int)).any()


def test_rule_round_trip_and_config():
    rule = PruneRule(doubt=0.2, lead=0.7, steady=3, steady_confidence=0.1, min_answers=2)
    assert PruneRule.from_dict(rule.to_dict()) == rule
    assert PruneRule.of(object()) == PRUNE_OFF  # a config saved without pruning prunes nothing

    class Config:
        early_stopping = {"lambda": {}, "pruning": {"rule": rule.to_dict()}}

    assert PruneRule.of(Config()) == rule
    assert rule.describe().endswith("(after its 2nd answer)")
    for k, nth in ((3, "3rd"), (4, "4th"), (11, "11th"), (21, "21st")):
        assert PruneRule(steady=2, min_answers=k).describe().endswith(f"(after its {nth} answer)")


def test_chain_features():
    d = scripted_group()
    args = (d["sequence"], d["step"], d["end"], d["klass"])
    k, c = _rows(42, MEAN_HEAD, d)  # held classes 0, 0, 1, 0; class 0 leads
    x = chain_features(42, *args, k, c, np.array([DECODING, DECODING, ENDED, DECODING]))
    assert x.shape == (4, len(CHAIN_FEATURES))
    conf = dict(zip(k.tolist(), c.tolist()))
    assert np.allclose(x[[0, 1, 3], 0], np.log(conf[0] / (1 - conf[0])))
    assert np.allclose(x[[0, 1, 3], 1], np.log(conf[1] / (1 - conf[1])))  # the best other class: class 1
    assert np.allclose(x[2, 1], np.log(conf[0] / (1 - conf[0])))
    assert x[:, 2].tolist() == [1, 1, 0, 1]  # holds the leading class
    assert np.allclose(np.expm1(x[:, 3]), [2, 2, 1, 1])  # answers in a row of the held class (chain 1: 1, 0, 0)
    assert np.allclose(np.expm1(x[:, 4]), [2, 3, 1, 2])  # answers given
    assert np.allclose(x[:, 5], [1 / 2, 2 / 3, 1, 2 / 2])  # classes held ÷ answers
    assert np.allclose(x[:, 6], [3 / 4, 3 / 4, 1 / 4, 3 / 4])  # chains holding the class ÷ N
    assert np.allclose(x[:, 7], 1 / 4)  # chains ended ÷ N


def test_regret_clause():
    d = scripted_group()
    args = (d["sequence"], d["step"], d["end"], d["klass"])
    k, c = _rows(42, MEAN_HEAD, d)
    zeros = (0.0,) * len(CHAIN_FEATURES)
    low = float(np.log(0.01 / 0.99))  # every chain's regret is 0.01
    constant = lambda r, **kw: PruneRule(regret=r, regret_coef=zeros, regret_intercept=low, **kw)
    live = np.zeros(4, int)
    assert prune_chains(constant(0.02), 42, *args, k, c, live).all()  # regret 0.01 ≤ 0.02: every chain
    assert not prune_chains(constant(0.005), 42, *args, k, c, live).any()
    assert prune_chains(constant(0.02, min_answers=2), 42, *args, k, c, live).tolist() == [True, True, False, True]
    # Weighted on "the held class leads": only the leading class's chains have a low regret.
    leaders = PruneRule(regret=0.01, regret_coef=(0.0, 0.0, -6.0, *zeros[3:]), regret_intercept=0.0)
    assert prune_chains(leaders, 42, *args, k, c, live).tolist() == [True, True, False, True]
    assert not constant(0.02).off and "regret" in constant(0.02).describe()
    with pytest.raises(ValueError, match="weights"):
        PruneRule(regret=0.1, regret_coef=(1.0,))
    # Written and read back (a config stores lists); a rule without the clause is written as before.
    assert PruneRule.from_dict(json.loads(json.dumps(leaders.to_dict()))) == leaders
    assert "regret" not in PruneRule(steady=2).to_dict()


def _held_rows(d):
    """The regret's rows by brute force: (t, chain, held answer) of every chain still decoding with an answer, at
    every arrival time, in `regret_rows`' order."""
    for t in np.unique(d["end"]):
        for n in range(4):
            mine = (d["sequence"] == n) & (d["end"] <= t)
            if d["seq_len"][n] > t and mine.any():
                yield t, n, np.flatnonzero(mine)[np.argmax(d["step"][mine])]


def test_regret_rows_label_a_wrong_held_answer_that_decoding_would_correct():
    d = scripted_group()
    group = _replay_group(d)
    x, y, g = regret_rows([group], [d["score"]], MEAN_HEAD)
    expected = []  # labelled by brute force over the recorded answers
    for t, n, held in _held_rows(d):
        later = (d["sequence"] == n) & (d["end"] > t) & d["correct"]
        expected.append(bool(~d["correct"][held] & later.any()))
    assert y.tolist() == expected and (g == 0).all() and x.shape == (len(expected), len(CHAIN_FEATURES))
    # Rows at t = 12 (chain 0), 14 (chains 0, 1), 17 (chains 0, 1, 3): chains 1 and 3 hold wrong classes (1, 2)
    # and answer 0 later; chain 0 holds the right class.
    assert expected[:6] == [False, False, True, False, True, True]
    fitted = fit_regret([group] * 3, [d["score"]] * 3, MEAN_HEAD)
    assert fitted.rows == 3 * len(expected) and fitted.positives == 3 * sum(expected) and fitted.groups == 3
    assert fitted.predict(x)[y].mean() > fitted.predict(x)[~y].mean()
    rule = fitted.rule(0.05, PruneRule(steady=2))
    assert rule.steady == 2 and rule.regret_coef == fitted.coef
    assert RegretHead.from_dict(json.loads(json.dumps(fitted.to_dict()))) == fitted
    with pytest.raises(ValueError, match="other chain features"):
        RegretHead.from_dict(fitted.to_dict() | {"features": ["something else"]})


def test_regret_rows_change_target_labels_a_chain_whose_final_class_differs():
    d = scripted_group()
    group = _replay_group(d)
    x, y, _ = regret_rows([group], [d["score"]], MEAN_HEAD, target="change")
    expected = []  # brute force: the chain's last answer (by step) falls in another class than its held one
    for _, n, held in _held_rows(d):
        every = np.flatnonzero(d["sequence"] == n)
        final = every[np.argmax(d["step"][every])]
        expected.append(bool(d["klass"][held] != d["klass"][final]))
    assert y.tolist() == expected and any(expected) and not all(expected)
    assert x.shape == regret_rows([group], [d["score"]], MEAN_HEAD)[0].shape  # the same rows, another label
    fitted = fit_regret([group] * 3, [d["score"]] * 3, MEAN_HEAD, target="change")
    assert fitted.target == "change" and fitted.positives == 3 * sum(expected)
    assert RegretHead.from_dict(json.loads(json.dumps(fitted.to_dict()))) == fitted
    with pytest.raises(ValueError, match="target"):
        regret_rows([group], [d["score"]], MEAN_HEAD, target="gold")


def test_regret_rows_output_target_labels_a_chain_that_will_answer_the_output_class():
    d = scripted_group()
    group = _replay_group(d)
    for output in (0, 1):  # the label follows the output class it is given, not the gold one
        x, y, _ = regret_rows([group], [d["score"]], MEAN_HEAD, target="output", outputs=[output])
        expected = []  # brute force: a later answer of the chain falls in the output class (the ceiling keeps it)
        for t, n, _ in _held_rows(d):
            later = (d["sequence"] == n) & (d["end"] > t) & (d["klass"] == output)
            expected.append(bool(later.any()))
        assert y.tolist() == expected and any(expected) and not all(expected)
        assert x.shape == regret_rows([group], [d["score"]], MEAN_HEAD)[0].shape
    fitted = fit_regret([group] * 2, [d["score"]] * 2, MEAN_HEAD, target="output", outputs=[0, 0])
    assert fitted.target == "output" and fitted.groups == 2
    with pytest.raises(ValueError, match="output class"):
        regret_rows([group], [d["score"]], MEAN_HEAD, target="output")


# -- the replay ----------------------------------------------------------------------------------------------------


def test_scripted_group_replays_to_its_prunes():
    d = scripted_group()
    group = _replay_group(d)
    (stream,) = replay_pruning(SCRIPTED_RULE, MEAN_HEAD, [group], _fixed_scorer([d["score"]]))
    prunes = tuple(
        (int(t), tuple(int(n) for n in np.flatnonzero(stream.cut == t)))
        for t in np.unique(stream.cut[stream.cut < NEVER])
    )
    assert prunes == SCRIPTED_PRUNES
    # Chain 0's answers after 22 and chain 1's after 42 never arrive; their held answers become final.
    assert stream.keep.tolist() == [d["end"][a] <= stream.cut[d["sequence"][a]] for a in range(d["end"].size)]
    assert stream.final[3] and stream.final[7] and not stream.keep[10] and not stream.keep[11]


def test_token_accounting():
    d = scripted_group()
    group = _replay_group(d)
    (stream,) = replay_pruning(SCRIPTED_RULE, MEAN_HEAD, [group], _fixed_scorer([d["score"]]))
    sweep = sweep_group(group, stream, MEAN_HEAD, [np.inf])
    # No group stop: chains 0 and 1 cut at 22 and 42, chains 2 and 3 to their ends (50, 70).
    assert sweep.cot_tokens[0] == 22 + 42 + 50 + 70
    # Every kept answer's 2 elicitation tokens, none of the dropped ones (their τ is past the cut).
    assert sweep.elicitation_tokens[0] == 2 * stream.keep.sum()
    schedule = sweep.schedule(0, stream.cut, group.seq_len)
    assert schedule.pruned.tolist() == [True, True, False, False]
    assert schedule.cot_tokens(group.seq_len) == sweep.cot_tokens[0]
    assert schedule.elicitation_tokens(group.sequence, group.start, group.end) == sweep.elicitation_tokens[0]
    # A group stop at t* = 30 cuts everything there; an answer being elicited (τ = 30 − 1) counts its 1 token.
    d2 = dict(d, start=d["start"].copy())
    d2["start"][6] = 29
    d2["end"] = d2["start"] + 2
    g2 = _replay_group(d2)
    (s2,) = replay_pruning(PRUNE_OFF, MEAN_HEAD, [g2], _fixed_scorer([d2["score"]]))
    sw = sweep_group(g2, s2, MEAN_HEAD, [0.0])  # λ = 0 stops at the first arrival, t* = 12
    assert sw.stopped[0] and sw.stop_step[0] == 12
    assert sw.cot_tokens[0] == 4 * 12 and sw.elicitation_tokens[0] == 2 + 0
    sw = sweep_group(g2, s2, MEAN_HEAD, [0.75])  # first reached when class 0 has 0.8, at t = 22
    assert sw.stop_step[0] == 22
    assert sw.elicitation_tokens[0] == 2 * 4  # 4 answers elicited by 22, none in flight


def test_off_reproduces_the_stop_only_replay():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, a = 4, 16
        sequence = rng.integers(0, n, a)
        sequence[:n] = np.arange(n)
        start = np.sort(rng.integers(1, 80, a))
        step = np.array([(sequence[:i] == sequence[i]).sum() for i in range(a)])
        end = start + rng.integers(1, 4, a)
        klass = rng.integers(0, 3, a)
        terminal = np.array([step[i] == (sequence == sequence[i]).sum() - 1 for i in range(a)])
        seq_len = np.array([start[(sequence == s) & terminal][0] for s in range(n)])
        score = rng.uniform(0.05, 0.95, a)
        correct = klass == 0
        group = ReplayGroup(sequence, step, end, start, klass, correct, terminal, seq_len, "p")
        (stream,) = replay_pruning(PRUNE_OFF, MEAN_HEAD, [group], _fixed_scorer([score]))
        sweep = sweep_group(group, stream, MEAN_HEAD, LAMBDAS)
        ev = stop_events(MEAN_HEAD, klass, sequence, step, end, n, score)
        recorded = AnswerGroup(
            sequence, end, klass, correct, terminal, seq_len, start, {"m": score}, "p", {"m": score}, {"m": ev}
        )
        stop_only = replay_many(recorded, "m", LAMBDAS)
        assert np.array_equal(sweep.chosen, stop_only.chosen)
        assert np.array_equal(sweep.stopped, stop_only.stopped)
        assert np.array_equal(sweep.correct, stop_only.correct)
        assert np.array_equal(sweep.cot_tokens, stop_only.tokens)


def _causal_scorer(groups, keeps):
    """A verifier whose score of an answer depends on the kept answers available at its end (causal, joint)."""
    out = []
    for g, keep in zip(groups, keeps):
        s = np.full(g.end.size, np.nan)
        for a in np.flatnonzero(keep):
            seen = keep & (g.end <= g.end[a])
            agree = (seen & (g.klass == g.klass[a])).sum() - 1
            s[a] = 1 / (1 + np.exp(-(0.6 * agree - 0.4 * (seen.sum() - 1 - agree) - 0.2 * g.step[a])))
        out.append(s)
    return out


def _live(rule, head, group, scorer):
    """Brute force: at every arrival time, score what is available from scratch and decide, as a live run does."""
    cut = np.full(group.num_chains, NEVER, np.int64)
    for t in np.unique(group.end):
        keep = (group.end <= t) & (group.end <= cut[group.sequence])
        if not (keep & (group.end == t)).any():
            continue
        (s,) = scorer([group], [keep])
        k = np.flatnonzero(keep)
        ev = stop_events(head, group.klass[k], group.sequence[k], group.step[k], group.end[k], 4, s[k], times=[t])
        status = chain_status(int(t), group.seq_len, cut)
        pruned = prune_chains(
            rule, int(t), group.sequence[k], group.step[k], group.end[k], group.klass[k], ev.klass, ev.confidence,
            status,
        )  # fmt: skip
        cut[pruned] = t
    return cut


def test_fixpoint_equals_live_scoring():
    d = scripted_group()
    group = _replay_group(d)
    for rule in (SCRIPTED_RULE, PruneRule(doubt=0.45, lead=0.55), PruneRule(doubt=0.4, lead=0.5, steady=2)):
        (stream,) = replay_pruning(rule, MEAN_HEAD, [group], _causal_scorer)
        assert stream.cut.tolist() == _live(rule, MEAN_HEAD, group, _causal_scorer).tolist()
        (rescored,) = _causal_scorer([group], [stream.keep])
        assert np.allclose(stream.scores[stream.keep], rescored[stream.keep])


def test_sweep_groups_summary():
    d = scripted_group()
    group = _replay_group(d)
    streams = replay_pruning(SCRIPTED_RULE, MEAN_HEAD, [group, group], _fixed_scorer([d["score"]] * 2))
    replay = sweep_groups([group, group], streams, MEAN_HEAD, [0.85, np.inf])
    assert replay.correct.shape == (2, 2) and replay.pruned[:, 1].tolist() == [2, 2]
    assert replay.at(1)["all_tokens"] == replay.cot[0, 1] + replay.elicitation[0, 1]


def test_replay_sweep_reads_each_lambda_with_the_head_in_effect_there(monkeypatch):
    """A head whose support floor holds below a switch λ is replayed once per side: below the switch every λ
    equals the floored head's replay, at and above it the plain head's (full decoding included), and the floor does
    change the outcome here (not a vacuous merge). A sweep of the unresolved head below the switch refuses."""
    d = scripted_group()
    group, scorer = _replay_group(d), _causal_scorer
    rule = PruneRule(doubt=0.4, lead=0.5, steady=2)  # the ruled-out clause reads the snapshot's confidences
    floored = replace(MEAN_HEAD, min_share=0.5)
    switching = replace(floored, floor_below=0.6)
    lambdas = np.array([0.3, 0.5, 0.59, 0.6, 0.7, np.inf])
    merged = replay_sweep(rule, switching, [group], scorer, lambdas=lambdas)
    sides = {
        h: sweep_groups([group], replay_pruning(rule, h, [group], scorer), h, lambdas) for h in (floored, MEAN_HEAD)
    }
    below = lambdas < 0.6
    for name in ("correct", "cot", "elicitation", "stopped", "pruned"):
        got, low, high = (getattr(r, name) for r in (merged, sides[floored], sides[MEAN_HEAD]))
        assert np.array_equal(got[:, below], low[:, below]) and np.array_equal(got[:, ~below], high[:, ~below])
    assert not np.array_equal(sides[floored].cot[:, below], sides[MEAN_HEAD].cot[:, below])
    # A rule that reads no confidence is replayed once for both sides, with the same result.
    import hf_msv.training.pruned_replay as module

    steady, calls = PruneRule(steady=2), []
    monkeypatch.setattr(module, "replay_pruning", lambda *a, **k: calls.append(1) or replay_pruning(*a, **k))
    once = replay_sweep(steady, switching, [group], scorer, lambdas=lambdas)
    monkeypatch.undo()
    assert len(calls) == 1 and not steady.reads_confidence and rule.reads_confidence
    for h, cols in ((floored, below), (MEAN_HEAD, ~below)):
        alone = sweep_groups([group], replay_pruning(steady, h, [group], scorer), h, lambdas)
        assert np.array_equal(once.correct[:, cols], alone.correct[:, cols])
        assert np.array_equal(once.cot[:, cols], alone.cot[:, cols])
    (stream,) = replay_pruning(rule, MEAN_HEAD, [group], scorer)
    sweep_group(group, stream, switching, np.array([0.6, np.inf]))  # the unresolved head's own side
    with pytest.raises(ValueError, match="replay_sweep"):
        sweep_group(group, stream, switching, lambdas)


# -- the joint guarantee -------------------------------------------------------------------------------------------


def test_joint_choice_is_bonferroni_and_cheapest():
    lam = np.array([0.5, 0.9, np.inf])
    g = 400
    ref = np.ones(g, bool)
    correct = np.ones((2, g, 3), bool)
    tokens = np.ones((2, g, 3)) * np.array([10.0, 20.0, 30.0])
    tokens[0] += 12  # setting 1 is cheaper ...
    correct[1, :12, 0] = False  # ... but at λ = 0.5 it loses 3 %
    out = choose_jointly(lam, correct, tokens, ref, np.full(g, 30.0), epsilon=0.02, delta=0.1)
    assert out.delta_per_setting == pytest.approx(0.05)
    assert out.cheapest == (0.5, 0.9) and out.setting == 1 and out.choice.lam == 0.9
    assert out.choice.reached and out.choice.tokens == 20.0 and out.choice.full_tokens == 30.0
    # One setting: the same as choose_lambda's fixed-sequence test (the ∞ point tested first is lossless).
    one = choose_jointly(lam, correct[:1], tokens[:1], ref, np.full(g, 30.0), epsilon=0.02, delta=0.1)
    alone = choose_lambda(lam, correct[0], tokens[0], epsilon=0.02, delta=0.1)
    assert one.choice.lam == alone.lam and one.delta_per_setting == 0.1
    # Nothing certified: λ = ∞ with reached False.
    bad = correct.copy()
    bad[:, :40, :] = False
    out = choose_jointly(lam, bad, tokens, ref, np.full(g, 30.0), epsilon=0.02, delta=0.1)
    assert not out.choice.reached and np.isinf(out.choice.lam)


def test_joint_guarantee_holds_over_draws():
    """Over draws of calibration problems with known loss rates, the chosen pair's true loss exceeds ε at most a
    δ share of the time (every setting's cheapest λ has true loss 2ε: tempting, and wrong)."""
    rng = np.random.default_rng(1)
    lam = np.array([0.5, 0.9, np.inf])
    true_loss = np.array([[0.04, 0.01, 0.0], [0.04, 0.005, 0.0], [0.04, 0.0, 0.0]])  # (K, Λ)
    eps, delta, g, draws = 0.02, 0.1, 300, 300
    tokens = np.broadcast_to(np.array([1.0, 2.0, 3.0]), (3, g, 3)) - np.arange(3)[:, None, None] * 0.1
    violations = 0
    for _ in range(draws):
        correct = rng.uniform(size=(3, g, 3)) >= true_loss[:, None, :]
        out = choose_jointly(lam, correct, tokens, np.ones(g, bool), np.full(g, 3.0), epsilon=eps, delta=delta)
        j = int(np.flatnonzero(lam == out.choice.lam)[0])
        violations += true_loss[out.setting, j] > eps
    assert violations / draws <= delta


def test_confidence_map_recalibrates():
    rng = np.random.default_rng(0)
    reported = rng.uniform(0.5, 0.9, 2000)
    right = rng.uniform(size=2000) < np.minimum(reported + 0.08, 1.0)  # under-confident by 8 pp
    cmap = ConfidenceMap.fit(reported, right)
    assert abs(cmap(reported).mean() - right.mean()) < 0.01
    assert ConfidenceMap.from_dict(cmap.to_dict()) == cmap and np.isnan(cmap(np.array([np.nan])))[0]


def test_confidence_map_weighs_the_stop_time_features():
    """A map fitted with a feature that the reported confidence does not see is calibrated within each value of the
    feature, where the confidence-alone map is not; it needs the features to be applied, and reads back."""
    rng = np.random.default_rng(1)
    reported = rng.uniform(0.5, 0.9, 4000)
    features = np.zeros((4000, len(STOP_TIME_FEATURES)))
    hard = rng.uniform(size=4000) < 0.5
    features[:, 1] = np.where(hard, 0.4, 0.9)  # the class's support: the hard half is right 20 pp less often
    right = rng.uniform(size=4000) < np.clip(reported + np.where(hard, -0.1, 0.1), 0, 1)
    alone, weighing = ConfidenceMap.fit(reported, right), ConfidenceMap.fit(reported, right, features, columns=(1,))
    gap = lambda cmap, part: abs(cmap(reported[part], features[part]).mean() - right[part].mean())
    assert gap(alone, hard) > 0.07 and gap(weighing, hard) < 0.02 and gap(weighing, ~hard) < 0.02
    assert weighing.needs_features and not alone.needs_features and weighing.weights[0] == 0.0
    assert ConfidenceMap.from_dict(weighing.to_dict()) == weighing and "weights" not in alone.to_dict()
    with pytest.raises(ValueError, match="stop-time features"):
        weighing(reported)
    with pytest.raises(ValueError, match="2 stop-time features given"):
        weighing(reported, features[:, :2])


def test_confidence_map_isotonic_step_bends_a_shape_platt_cannot_fit():
    """Stops right 55 % of the time whatever they report below 0.6, and as often as they report above: Platt scaling
    alone misses both ranges' edges; the isotonic step is calibrated in both ranges on new stops, reports no
    certainty, and reads back."""
    rng = np.random.default_rng(2)

    def stops(m):
        reported = rng.uniform(0.2, 0.99, m)
        return reported, rng.uniform(size=m) < np.where(reported < 0.6, 0.55, reported)

    (reported, right), (new, new_right) = stops(3000), stops(20000)
    platt, bent = ConfidenceMap.fit(reported, right), ConfidenceMap.fit(reported, right, isotonic=True)
    below, above = (new >= 0.5) & (new < 0.6), new >= 0.8  # where Platt's curve over- and under-reports
    gap = lambda cmap, part: abs(cmap(new[part]).mean() - new_right[part].mean())
    assert gap(platt, below) > 0.05 and gap(platt, above) > 0.02
    assert gap(bent, below) < 0.015 and gap(bent, above) < 0.015
    assert ece(bent(new), new_right) < ece(platt(new), new_right) - 0.01
    p, q = np.asarray(bent.knots).T
    assert np.all(np.diff(p) > 0) and np.all(np.diff(q) >= 0) and 1 / 3002 <= q.min() and q.max() <= 1 - 1 / 3002
    assert ConfidenceMap.from_dict(bent.to_dict()) == bent and "knots" not in platt.to_dict() and not platt.knots
    assert np.isnan(bent(np.array([np.nan])))[0] and bent(np.array([0.0, 1.0])).tolist() == [q[0], q[-1]]


def test_choose_confidence_map_weighs_a_feature_only_where_it_pays():
    """The chooser's cross-fitted log loss picks a map weighing the class's support when half the stops are harder
    at the same reported confidence, and the confidence alone when the feature carries nothing; the chosen map is
    the candidate fitted on every stop."""
    from hf_msv.training.confidence_map import CONFIDENCE_MAPS, choose_confidence_map

    rng = np.random.default_rng(3)
    reported = rng.uniform(0.5, 0.95, 1500)
    features = np.zeros((1500, len(STOP_TIME_FEATURES)))
    hard = rng.uniform(size=1500) < 0.5
    features[:, 1] = np.where(hard, 0.4, 0.9)
    for shift, weighs in ((0.15, True), (0.0, False)):
        right = rng.uniform(size=1500) < np.clip(reported + np.where(hard, -shift, shift / 3), 0, 1)
        cmap, choice = choose_confidence_map(reported, right, features)
        assert set(choice.crossfit) == set(CONFIDENCE_MAPS) and choice.stops == 1500
        losses = {name: loss for name, (loss, _) in choice.crossfit.items()}
        assert choice.chosen == min(losses, key=losses.get)
        columns, isotonic = CONFIDENCE_MAPS[choice.chosen]
        assert (1 in columns) == weighs and cmap.needs_features == bool(columns)
        assert cmap == ConfidenceMap.fit(reported, right, features, columns, isotonic)
    with pytest.raises(ValueError, match="at least 10"):
        choose_confidence_map(reported[:9], right[:9], features[:9])


def test_stop_time_features_read_the_snapshot_at_the_stop():
    # Chains 0 and 1 answer class 0, chain 2 class 1; chain 1's second answer (class 1) arrives after the stop.
    klass, sequence, step, end = [0, 0, 1, 1], [0, 1, 2, 1], [0, 0, 0, 1], [3, 5, 6, 9]
    scores = [0.8, 0.6, 0.3, 0.9]
    x = stop_time_features(scores, klass, sequence, step, end, 4, time=6, answer=1)
    assert x.shape == (len(STOP_TIME_FEATURES),)
    assert x[1] == 0.5 and x[2] == 0.75 and x[4] == 0.25  # support 2 of 4, 3 answered, runner-up 1
    assert x[6] == 0.5 and x[7] == pytest.approx(np.log(7.0))  # 2 classes held; log(1 + 6)
    assert x[0] == pytest.approx((np.log(4.0) + np.log(1.5)) / 2)  # mean logit of 0.8 and 0.6


def test_held_answers_leave_the_snapshots_without_hold():
    from hf_msv.training.pruned_replay import _snapshots

    d = scripted_group()
    group = _replay_group(d)
    for hold in (True, False):
        (stream,) = replay_pruning(SCRIPTED_RULE, MEAN_HEAD, [group], _fixed_scorer([d["score"]]), hold=hold)
        assert stream.cut.tolist()[:2] == [22, 42]
        time, answer, _, confidence = _snapshots(group, stream, MEAN_HEAD, hold)
        # At t = 27 class 0 is held by chain 1 (0.6) and, with hold, by pruned chain 0 (0.8).
        (row,) = np.flatnonzero((time == 27) & (group.klass[answer] == 0))
        assert confidence[row] == pytest.approx(0.710 if hold else 0.6, abs=1e-3)  # σ(mean logit)


def test_stored_entries_read_back(tmp_path):
    import json
    from types import SimpleNamespace

    from hf_msv.training.pruned_replay import fit_stop_confidence, store_confidence_map, store_pruning

    (tmp_path / "config.json").write_text(json.dumps({"early_stopping": {"lambda": {"lam": 0.9}}, "x": 1}))
    d = scripted_group()
    group = _replay_group(d)
    groups = [group] * 30
    cmap, evidence = fit_stop_confidence(MEAN_HEAD, 0.75, groups, _fixed_scorer([d["score"]] * 30))
    assert evidence["stops"] == 30 and evidence["accuracy"] == 1.0 and evidence["chosen"] in evidence["crossfit"]
    store_confidence_map(tmp_path, cmap, evidence)
    store_pruning(tmp_path, {"rule": SCRIPTED_RULE.to_dict()})
    config = SimpleNamespace(**json.loads((tmp_path / "config.json").read_text()))
    assert ConfidenceMap.of(config) == cmap and PruneRule.of(config) == SCRIPTED_RULE
    assert config.early_stopping["lambda"] == {"lam": 0.9} and config.x == 1
    # A saved verifier's card gets the pair's line, once, whatever line an earlier pair left.
    from hf_msv.lambda_rule import LambdaChoice

    pair = LambdaChoice(0.95, "guarantee", True, 0.01, 0.1, None, 300, 230, 0.8, 10.0, 0.0, 0.8, 20.0).to_dict()
    (tmp_path / "README.md").write_text("# card\n- Default with pruning: an older pair\n- other line\n")
    store_pruning(tmp_path, {"rule": SCRIPTED_RULE.to_dict(), "lambda": pair})
    card = (tmp_path / "README.md").read_text()
    assert card.count("- Default with pruning:") == 1 and "an older pair" not in card and "- other line" in card
    assert f"{SCRIPTED_RULE.describe()}, beside the stop at λ = 0.95" in card and "on 300 calibration problems" in card
    # A stop head with a floor below a switch: written into the config, its line in the card once.
    from hf_msv.training.pruned_replay import store_stop_head

    switching = replace(MEAN_HEAD, min_share=0.12, floor_below=0.9)
    store_stop_head(tmp_path, MEAN_HEAD)
    store_stop_head(tmp_path, switching)
    config = SimpleNamespace(**json.loads((tmp_path / "config.json").read_text()))
    assert StopHead.of(config) == switching and PruneRule.of(config) == SCRIPTED_RULE
    card = (tmp_path / "README.md").read_text()
    assert card.count("- Support floor") == 1 and "- Support floor in runs at λ < 0.9 (off at and above it)" in card


def test_net_loss_p_value_is_valid_and_sees_gains():
    from hf_msv.lambda_rule import net_loss_p_value

    rng = np.random.default_rng(0)
    # At the null's boundary (2 % lost, 1 % gained: a net drop of exactly ε = 1 pp) it rejects at most δ of the time.
    rejected = 0
    for seed in range(200):
        u = rng.uniform(size=2000)
        losses = np.where(u < 0.02, 1.0, np.where(u < 0.03, -1.0, 0.0))
        rejected += net_loss_p_value(losses, 0.01, 0.1, seed=seed) <= 0.1
    assert rejected / 200 <= 0.1
    # 22 lost and 34 gained of 2,560: the paired test cannot certify ε = 1 pp at 0.025, the net one can.
    losses = np.zeros(2560)
    losses[:22], losses[22:56] = 1.0, -1.0
    assert ltt_p_value_paired(losses) > 0.025 and net_loss_p_value(losses, 0.01, 0.025) < 0.001


def ltt_p_value_paired(net: np.ndarray) -> float:
    from hf_msv.lambda_rule import ltt_p_value

    return ltt_p_value((net > 0).astype(float), 0.01)


def test_joint_choice_with_net_loss():
    lam = np.array([0.9, np.inf])
    g = 2560
    ref = np.zeros(g, bool)
    ref[:2000] = True
    correct = np.repeat(ref[None, :, None], 2, 0).repeat(2, 2)
    correct[1, :22, :] = False  # the pruning setting loses 22 problems ...
    correct[1, 2000:2034, :] = True  # ... and gains 34
    tokens = np.ones((2, g, 2)) * np.array([20.0, 30.0])
    tokens[1] -= 10
    paired = choose_jointly(lam, correct, tokens, ref, np.full(g, 30.0), epsilon=0.01, delta=0.1)
    net = choose_jointly(lam, correct, tokens, ref, np.full(g, 30.0), epsilon=0.01, delta=0.1, loss="net")
    assert paired.cheapest == (0.9, None) and paired.setting == 0
    assert net.cheapest == (0.9, 0.9) and net.setting == 1 and "net loss" in net.procedure


def test_group_scorer_reads_n_chains_in_subgroups_of_m(tmp_path):
    """At N > M the replay scores a group as live generation does (`MSVScorer`): chain n in subgroup n // M as its
    sequence n % M. Six chains scored by an MSV_3 equal the two three-chain groups the dataset cuts them into."""
    from helpers.generation import tiny_verifier
    from helpers.shards import D, write_dataset
    from hf_msv.training.pruned_replay import MSVGroupScorer, load_replay_groups

    write_dataset(tmp_path, num_problems=2, num_sequences=6)
    scorer = MSVGroupScorer(tiny_verifier(num_sequences=3, hidden=D))
    whole = load_replay_groups(tmp_path, 6)
    halves = load_replay_groups(tmp_path, 3)
    assert len(whole) == 2 and len(halves) == 4
    keep = lambda groups: [np.ones(g.sequence.size, bool) for g in groups]
    scores, parts = scorer(whole, keep(whole)), scorer(halves, keep(halves))
    for i, group in enumerate(whole):
        rows = group.item["answer_index"].numpy()
        for part, part_scores in zip(halves[2 * i : 2 * i + 2], parts[2 * i : 2 * i + 2]):
            where = np.searchsorted(rows, part.item["answer_index"].numpy())
            np.testing.assert_allclose(scores[i][where], part_scores, rtol=1e-5)
        assert not np.isnan(scores[i]).any()
    # Validation (the stop head's inputs) reads the six chains the same way, numbering them 0..5 in their group.
    from hf_msv.data import ShardDataset
    from hf_msv.training.trainer import validation_predictions

    p = validation_predictions(scorer.model, ShardDataset(tmp_path, num_sequences=6, mode="streaming"), "streaming")
    assert p.structure["sequence"].max() == 5 and np.unique(p.structure["group"]).size == 2
    got = {
        (str(q), int(n), int(k)): z
        for q, n, k, z in zip(p.problems, p.structure["sequence"], p.structure["step"], p.logits)
    }
    for group, s in zip(whole, scores):
        for n, k, v in zip(group.sequence, group.step, s):
            assert got[(group.problem_id, int(n), int(k))] == pytest.approx(np.log(v / (1 - v)), abs=1e-4)
    # ... so the stopping rule of an MSV_3 can be fitted for runs of six chains.
    from hf_msv.training import fit_stopping_rule

    fit = fit_stopping_rule(scorer.model, tmp_path, num_chains=6, calibration_fraction=0.5)
    assert fit.head.num_chains == 6 and scorer.model.config.early_stopping["stop_head"]["num_chains"] == 6
