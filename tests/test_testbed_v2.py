"""Testbed v2 task generator and trace writer (hf_msv.testbed.task_v2): splits, parsing, knobs, determinism, and
each design property docs/testbed.md claims, checked on small samples where it could fail."""

import math
import random
from collections import Counter
from dataclasses import replace

import pytest

from hf_msv.answers import ELICITATION_PROMPT, extract_last_boxed
from hf_msv.testbed.task_v2 import (
    DELIMITER,
    SOURCE,
    TaskKnobsV2,
    answer_distribution,
    apply_op,
    carry_positions,
    error_rates,
    false_equations,
    format_prompt,
    generate_problems,
    knobs_v2,
    make_elicitation_example,
    make_trace,
    make_trace_parts,
    sample_elicited_answer,
    sample_trace,
    split_of,
    step_risk,
    trace_errors,
    trace_tokens,
    written_equations,
)

NOISELESS = dict(
    carry_error=0.0,
    borrow_error=0.0,
    mul_error=0.0,
    slip_error=0.0,
    distractor_take=(0.0, 0.0, 0.0),
    guess_prob=0.0,
    reconsider_prob=0.0,
)


@pytest.fixture(scope="module")
def sample():
    """60 evaluation problems x 24 traces of the default solver (about a second)."""
    problems = generate_problems("evaluation", 60, seed=3)
    rng = random.Random(0)
    return [(p, [sample_trace(p, rng) for _ in range(24)]) for p in problems]


def _traces(sample):
    return [(p, t) for p, ts in sample for t in ts]


# ------------------------------------------------------------------------------------------------ problems / knobs
def test_splits_are_disjoint_by_canonical_hash():
    canon = {
        s: {p.meta["canonical"] for p in generate_problems(s, 150, seed=1)}
        for s in ("train", "validation", "evaluation")
    }
    assert not canon["train"] & canon["validation"] and not canon["train"] & canon["evaluation"]
    assert not canon["validation"] & canon["evaluation"]
    for split, cs in canon.items():
        assert all(split_of(c) == split for c in cs)
    assert len(canon["evaluation"]) == 150  # distinct within a split


def test_reference_answer_is_right_and_ignores_the_irrelevant_clause():
    problems = generate_problems("train", 200, seed=2)
    assert {p.source for p in problems} == {SOURCE}
    assert sum(bool(p.meta["distractor"]) for p in problems) > 50
    for p in problems:
        v = p.meta["start"]
        for op, k in p.meta["ops"]:
            v = apply_op(v, op, k)
            assert 0 <= v <= 99
        assert p.gold == str(v)
        assert 3 <= len(p.meta["ops"]) <= 8
        if p.meta["distractor"]:
            _, d, _ = p.meta["distractor"]
            assert f"{d} of them are" in p.question
    # a solver that never slips and never takes the clause ends at the reference answer
    rng = random.Random(0)
    assert all(sample_trace(p, rng, **NOISELESS).terminal.answer == p.gold for p in problems[:60])


def test_generation_is_deterministic_in_seed():
    a, b = generate_problems("validation", 20, seed=4), generate_problems("validation", 20, seed=4)
    assert [p.question for p in a] == [p.question for p in b]
    assert [p.question for p in a] != [p.question for p in generate_problems("validation", 20, seed=5)]
    assert make_trace(a[0], random.Random(7)) == make_trace(a[0], random.Random(7))
    assert len({make_trace(a[0], random.Random(s)) for s in range(8)}) > 1


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(min_steps=5, max_steps=3), "min_steps"),
        (dict(ops="+/"), "ops"),
        (dict(mul_factors=(1, 2)), "mul_factors"),
        (dict(carry_error=1.5), "carry_error"),
        (dict(distractor_take=(0.5,)), "distractor_take"),
        (dict(max_trace_tokens=4), "max_trace_tokens"),
        (dict(no_such_knob=1), "unknown testbed-v2 knobs"),
    ],
)
def test_knobs_are_validated(bad, match):
    with pytest.raises(ValueError, match=match):
        knobs_v2(**bad)
    with pytest.raises(ValueError, match=match):
        generate_problems("train", 2, **bad)
    with pytest.raises(ValueError, match="split"):
        generate_problems("test", 2)


def test_one_digit_operands_are_a_valid_setting():
    problems = generate_problems("train", 200, seed=0, max_operand=9)
    assert all(0 < k <= 9 for p in problems for op, k in p.meta["ops"] if op != "*")
    assert any(op != "*" for p in problems for op, _ in p.meta["ops"])


def test_knobs_accept_json_lists():
    assert knobs_v2(mul_factors=[2, 3], distractor_take=[0.1, 0.2, 0.3]) == TaskKnobsV2(
        mul_factors=(2, 3), distractor_take=(0.1, 0.2, 0.3)
    )


# -------------------------------------------------------------------------------------------------- arithmetic
def test_carries_and_risk_follow_the_digits():
    assert carry_positions(40, "+", 38) == [] and carry_positions(47, "+", 38) == [(0, 1)]
    assert carry_positions(304, "-", 7) == [(0, 4), (1, 1)]  # borrow across a zero (the hard case), then from 3
    assert carry_positions(47, "*", 3) == [(0, 2)]  # carries 2
    kn = TaskKnobsV2()
    assert step_risk(40, "+", 38, kn) < step_risk(47, "+", 38, kn) < step_risk(304, "-", 7, kn)
    assert step_risk(47, "*", 3, kn) < step_risk(49, "*", 9, kn)  # carrying 8 vs 2
    assert step_risk(47, "+", 38, kn, scale=kn.mental_factor) > step_risk(47, "+", 38, kn)


# ------------------------------------------------------------------------------------------------------ traces
def test_traces_parse(sample):
    kn = TaskKnobsV2()
    for _, t in _traces(sample):
        assert trace_tokens(t.capped_text) <= kn.max_trace_tokens
        assert t.text.startswith(t.capped_text)
        if t.finished:
            assert t.capped_text == t.text and t.text.endswith("}")
            assert extract_last_boxed(t.text) == t.final_answer == t.terminal.answer
        else:
            assert extract_last_boxed(t.capped_text) is None  # no closed final box: the sampler was cut off
            assert trace_tokens(t.capped_text) == kn.max_trace_tokens
        body = "".join(x.text for x in t.pieces)
        assert body.count(DELIMITER) == sum(x.wait for x in t.pieces)  # a Wait only where a piece opens with one
        for j in t.wait_pieces:
            assert t.pieces[j].text.startswith(" " + DELIMITER + ",")
            assert trace_tokens("".join(x.text for x in t.pieces[:j]) + " " + DELIMITER) <= kn.max_trace_tokens


def test_trace_parts_tile_the_trace():
    p = generate_problems("train", 5, seed=9)[4]
    parts = make_trace_parts(p, random.Random(1))
    t = sample_trace(p, random.Random(1))
    assert "".join(s for s, _ in parts) + f"\n{ELICITATION_PROMPT}{{{t.final_answer}}}" == t.text
    assert all(s.startswith(" " + DELIMITER) for s, _ in parts[1:])
    assert parts[-1][1] == t.pieces[-1].answer


def test_the_tokenizer_counts_what_trace_tokens_counts(sample):
    from hf_msv.testbed.tokenizer import build_tokenizer

    tok = build_tokenizer()
    for _, t in _traces(sample)[:20]:
        ids = tok(t.capped_text, add_special_tokens=False).input_ids
        assert len(ids) == trace_tokens(t.capped_text)
        assert ids.count(tok.convert_tokens_to_ids(DELIMITER)) == t.capped_text.count(DELIMITER)


def test_elicitation_examples():
    problems = generate_problems("train", 40, seed=6)
    rng = random.Random(2)
    kinds = Counter()
    for p in problems:
        prefix, elicit, answer = make_elicitation_example(p, rng)
        assert elicit.endswith(ELICITATION_PROMPT) and answer.startswith("{") and answer.endswith("}")
        assert answer[1:-1].lstrip("-").isdigit()  # a noisy chain can go below zero
        assert format_prompt(p).endswith("A:") and not prefix.startswith("A:")
        kinds["wait" if prefix.endswith(DELIMITER) else "final" if prefix.endswith("}") else "piece"] += 1
    assert kinds["wait"] > kinds["final"] > 0


def test_elicited_answer_is_copied_where_stated_and_derived_mid_computation(sample):
    for _, t in _traces(sample):
        for x in t.pieces:
            if x.kind == "so":
                assert not x.derived and x.answer == str(x.value) and x.text == f" So {x.value}."
            if x.rest:
                assert x.derived
    # sampled answers (what training teaches) have the greedy answer as their most common value, with about the
    # probability the piece records (a derived answer whose mental path is likelier than not)
    p, piece = next((p, x) for p, t in _traces(sample) for x in t.pieces if x.derived and 0.6 < x.answer_prob < 0.9)
    drawn = Counter(sample_elicited_answer(piece, p, random.Random(s)) for s in range(300))
    assert drawn.most_common(1)[0][0] == piece.answer and len(drawn) > 1
    assert drawn[piece.answer] / 300 > piece.answer_prob - 0.1


# --------------------------------------------------------------------------------------------- design claims
def test_wrong_chains_wait_more_and_run_longer_than_right_ones(sample):
    mean = lambda xs: sum(xs) / len(xs)
    for size in (lambda t: len(t.wait_pieces), lambda t: trace_tokens(t.capped_text)):
        right = [size(t) for p, t in _traces(sample) if t.terminal.answer == p.gold]
        wrong = [size(t) for p, t in _traces(sample) if t.terminal.answer != p.gold]
        assert mean(wrong) > mean(right) * 1.02


def test_the_cap_binds_for_some_but_not_most_traces(sample):
    share = sum(not t.finished for _, t in _traces(sample)) / len(_traces(sample))
    assert 0.1 <= share <= 0.45
    # and cut chains are the less accurate ones
    acc = {f: [t.terminal.answer == p.gold for p, t in _traces(sample) if t.finished == f] for f in (True, False)}
    assert sum(acc[True]) / len(acc[True]) > sum(acc[False]) / len(acc[False])


def test_first_intermediate_answer_is_less_accurate_than_the_terminal_one(sample):
    pairs = [(t.waits[0].answer == p.gold, t.terminal.answer == p.gold) for p, t in _traces(sample) if t.waits]
    first, term = (sum(x) / len(pairs) for x in zip(*pairs))
    assert first < term - 0.05
    assert sum(len(t.wait_pieces) + 1 for _, t in _traces(sample)) / len(_traces(sample)) >= 5


def test_harder_problems_are_less_accurate_and_guesses_less_reliable(sample):
    def acc(rows):
        return sum(rows) / len(rows)

    short = [t.terminal.answer == p.gold for p, t in _traces(sample) if len(p.meta["ops"]) <= 4]
    long = [t.terminal.answer == p.gold for p, t in _traces(sample) if len(p.meta["ops"]) >= 6]
    assert acc(short) > acc(long)
    guesses = [t.pieces[0].answer == p.gold for p, t in _traces(sample) if t.pieces[0].kind == "guess"]
    passes = [
        next(x for x in t.pieces if x.kind == "so").answer == p.gold
        for p, t in _traces(sample)
        if any(x.kind == "so" for x in t.pieces) and t.pieces[0].kind != "guess"
    ]
    assert acc(guesses) < acc(passes) - 0.1


def test_rechecks_mostly_confirm_sometimes_fix_sometimes_break(sample):
    outcomes = Counter()
    for _, t in _traces(sample):
        for x in t.pieces:
            if x.kind in ("check", "fix"):
                a, rest = x.text.split(", ", 1)[1].split("=", 1)
                op = next(c for c in "+-*" if c in a[1:])
                lhs, k = a.rsplit(op, 1)
                true = apply_op(int(lhs), op, int(k))
                old = int(rest.split("?")[0])
                outcomes[
                    "confirm"
                    if x.kind == "check"
                    else "fix"
                    if x.value == true
                    else "break"
                    if old == true
                    else "other"
                ] += 1
    total = sum(outcomes.values())
    assert outcomes["confirm"] / total > 0.7
    assert outcomes["fix"] > outcomes["break"] > 0


def test_majorities_are_sometimes_wrong_and_answers_diverse(sample):
    maj_right = [Counter(t.terminal.answer for t in ts).most_common(1)[0][0] == p.gold for p, ts in sample]
    covered = [any(t.terminal.answer == p.gold for t in ts) for p, ts in sample]
    assert 0.3 < sum(maj_right) / len(sample) < 0.9
    assert sum(covered) - sum(maj_right) >= 5  # right answers the vote misses
    # the irrelevant clause is a visible cause: chains that subtract it end wrong unless they re-read (or a slip
    # happens to cancel it); problems that also subtract the same number for real are left out (ambiguous text)
    took = [
        t.terminal.answer == p.gold
        for p, t in _traces(sample)
        if p.meta["distractor"]
        and ["-", p.meta["distractor"][1]] not in p.meta["ops"]
        and f"-{p.meta['distractor'][1]}=" in t.capped_text.split(" So ")[0]
        and "still count" not in t.capped_text
    ]
    assert took and sum(took) / len(took) < 0.1


def test_the_wording_sets_how_often_the_clause_is_taken():
    problems = [p for p in generate_problems("train", 300, seed=8) if p.meta["distractor"]]
    rng = random.Random(4)
    taken = Counter()
    seen = Counter()
    for p in problems:
        _, d, w = p.meta["distractor"]
        for _ in range(8):
            first_pass = sample_trace(p, rng, guess_prob=0.0).capped_text.split(" So ")[0]
            seen[w] += 1
            taken[w] += first_pass.count(f"-{d}=") > sum(o == ["-", d] for o in p.meta["ops"])
    rate = [taken[w] / seen[w] for w in range(3)]
    assert rate[0] > rate[1] > rate[2]  # "broken" > "old" > "red", as distractor_take says


def test_a_wait_follows_a_wrong_step_more_often_than_a_right_one(sample):
    after = {True: [], False: []}
    for _, t in _traces(sample):
        for x, nxt in zip(t.pieces, t.pieces[1:]):
            if x.kind == "step":
                a, rest = x.text.split("=")
                a = a.split(":")[-1].strip()
                op = next(c for c in "+-*" if c in a[1:])
                lhs, k = a.rsplit(op, 1)
                after[apply_op(int(lhs), op, int(k)) != int(rest.rstrip("."))].append(nxt.mid)
    assert sum(after[True]) / len(after[True]) > 2 * sum(after[False]) / len(after[False])


def test_derived_answers_are_less_accurate_than_stated_ones(sample):
    derived = [x.answer == p.gold for p, t in _traces(sample) for x in t.pieces if x.derived]
    stated = [x.answer == p.gold for p, t in _traces(sample) for x in t.pieces if x.kind == "so"]
    assert sum(derived) / len(derived) < sum(stated) / len(stated) - 0.1


def test_chains_stop_when_confident_and_the_elicited_answer_hedges_by_doubt(sample):
    kn = TaskKnobsV2()
    finished = [t for _, t in _traces(sample) if t.finished and t.pieces[0].kind != "guess"]
    assert sum(t.pieces[-1].doubt <= kn.confident_doubt for t in finished) / len(finished) > 0.9
    p, ts = sample[1]
    piece = next(x for t in ts for x in t.pieces if x.kind == "so")
    sure, unsure = replace(piece, doubt=0.0, unease=0.0), replace(piece, doubt=0.4, unease=0.0)
    assert {sample_elicited_answer(sure, p, random.Random(s)) for s in range(50)} == {piece.answer}
    drawn = Counter(sample_elicited_answer(unsure, p, random.Random(s)) for s in range(300))
    assert 0.45 < drawn[piece.answer] / 300 < 0.8  # ~ 1 - doubt, the answer's probability
    assert unsure.answer_prob == sure.answer_prob == piece.answer_prob  # fixed at sampling; replace() keeps it


def _auroc(pairs) -> float:
    """AUROC of ``(right, score)`` pairs: P(a right one scores above a wrong one), ties counted half."""
    right = [x for ok, x in pairs if ok]
    wrong = [x for ok, x in pairs if not ok]
    return sum((r > w) + 0.5 * (r == w) for r in right for w in wrong) / (len(right) * len(wrong))


def test_self_evaluation_hedges_a_stated_answer_by_the_wrong_steps_standing(sample):
    """Elicitation's unease is ``self_check`` per wrong step standing in the chain: a wrong chain worked step by step
    with no clause to misread has some, a chain that wrote nothing wrong has none, and the terminal answer's
    probability then separates right from wrong chains far better than without self-evaluation."""
    kn = TaskKnobsV2()
    rows = [(p, t, t.terminal) for p, t in _traces(sample) if t.finished and not t.terminal.derived]
    plain = [(p, t, x) for p, t, x in rows if not p.meta["distractor"]]
    worked_wrong = [x for p, t, x in plain if x.answer != p.gold and any(y.kind == "step" for y in t.pieces)]
    clean = [x for p, t, x in plain if false_equations(t.text) == 0 and "? no," not in t.text]
    assert worked_wrong and clean
    assert all(x.unease >= kn.self_check - 1e-9 for x in worked_wrong)
    assert all(x.unease == 0.0 for x in clean)

    without = [(p, sample_trace(p, random.Random(i), self_check=0.0)) for i, (p, _) in enumerate(_traces(sample))]
    terminal = lambda pts: [(t.terminal.answer == p.gold, t.terminal.answer_prob) for p, t in pts]
    assert _auroc(terminal(_traces(sample))) > 0.85
    assert _auroc(terminal(without)) < _auroc(terminal(_traces(sample))) - 0.1


def test_written_equations_parse_steps_rechecks_and_fixes():
    eqs = written_equations(" 38*2=76. 76+17=94. Wait, 76+17=94? no, 93. 93-14=79. Wait, 93-14=79? yes. So 79.")
    assert [(e.a, e.op, e.k, e.result, e.checked, e.fix) for e in eqs] == [
        (38, "*", 2, 76, False, None),
        (76, "+", 17, 94, False, None),
        (76, "+", 17, 94, True, 93),
        (93, "-", 14, 79, False, None),
        (93, "-", 14, 79, True, None),
    ]
    assert [e.true for e in eqs] == [True, False, False, True, True]
    assert false_equations(" 38*2=76. 76+17=94. Wait, 76+17=94? no, 93.") == 1


def test_default_writer_stream_is_unchanged():
    """The shipped lm-v2 was trained on the default writer's stream: this digest of it must never change (a new
    knob, off by default, must not draw from the generator)."""
    import hashlib
    import json

    rng, rows = random.Random(7), []
    for p in generate_problems("train", 40, seed=5):
        t = sample_trace(p, rng)
        rows.append(
            [t.text, [(x.answer, round(x.answer_prob, 9)) for x in t.pieces], make_elicitation_example(p, rng)]
        )
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16] == "f9aaee4bc10eeb59"


def test_trace_errors_count_each_kind_of_departure():
    p = generate_problems("evaluation", 1)[0]
    p = replace(p, meta={**p.meta, "start": 38, "ops": [["+", 20], ["+", 6], ["+", 19]], "distractor": [1, 5, 0]})
    clean = " 38+20=58. 58+6=64. 64+19=83. So 83. Wait, 58+6=64? yes.\n### Final Answer ### \\boxed{83}"
    rates = error_rates(trace_errors([clean], p))
    assert math.isnan(rates.pop("wait_after_false"))  # no false step written
    assert rates == {
        "false_eq_plain": 0.0,
        "false_eq_carry": 0.0,
        "operand_misread": 0.0,
        "copy_slip": 0.0,
        "box_differs_from_so": 0.0,
        "wait_after_true": 0.0,
    }
    # 58+6 carries and is false; 60+19 is read from nowhere (copy slip); -5 is the irrelevant clause, not a misread;
    # 38+21 is a misread operand; the box disagrees with the last "So"
    bad = (
        " 38+21=59. 59-5=54. 58+6=65. Wait, 58+6=65? no, 64. 60+19=79. So 79. Wait, 38+21=59? yes."
        "\n### Final Answer ### \\boxed{80}"
    )
    c = trace_errors([bad], p)
    assert (c["eqs_plain"], c["false_plain"], c["eqs_carry"], c["false_carry"]) == (3, 0, 1, 1)
    assert c["operand_misreads"] == 1 and c["first_pass_eqs"] == 4
    assert c["copy_slips"] == 2  # 58 after 54, 60 after the fix to 64
    assert c["box_differs_from_so"] == 1
    # steps written "a op k = c.": 58+6=65 is false and a Wait follows it at once; the three true ones are not
    # followed by one (the re-checks "a op k = c?" are not steps)
    assert (c["steps_false"], c["wait_after_false"], c["steps_true"], c["wait_after_true"]) == (1, 1, 3, 0)


def test_answer_distribution_is_what_the_elicitation_draws_from():
    """The exact distribution behind ``sample_elicited_answer``, for a derived piece (mid-computation), a confident
    stated one and a hedged stated one (doubt and a wrong step standing): frequencies of 20,000 draws within 5
    standard errors of every answer's probability."""
    problems, rng = generate_problems("train", 60, seed=4), random.Random(7)
    kinds = set()
    for p in problems:
        for piece in sample_trace(p, rng).pieces:
            kind = "derived" if piece.rest else "hedged" if piece.doubt + piece.unease > 0.2 else "stated"
            if kind in kinds:
                continue
            kinds.add(kind)
            dist = answer_distribution(piece, p)
            assert sum(dist.values()) == pytest.approx(1.0, abs=1e-9)
            n, draws = 20000, Counter(sample_elicited_answer(piece, p, rng) for _ in range(20000))
            for answer in set(dist) | set(draws):
                q = dist.get(answer, 0.0)
                assert abs(draws[answer] / n - q) <= 5 * math.sqrt(max(q * (1 - q), 1e-4) / n), (kind, answer)
            if kind == "hedged":  # the stated answer is the most likely one, but not certain
                assert max(dist, key=dist.get) == str(piece.value) and dist[str(piece.value)] < 0.8
    assert kinds == {"derived", "stated", "hedged"}


def test_reading_unease_is_the_clause_share_of_a_pieces_unease():
    """``Piece.reading_unease`` (the writer with its clause reading's unease alone): the terminal piece's unease
    less its reading share is whole wrong steps (``self_check`` each), and the share is there exactly where the clause
    is taken at that piece."""
    rng, kn = random.Random(5), knobs_v2()
    seen = set()
    for p in generate_problems("evaluation", 120, seed=4):
        for _ in range(6):
            t = sample_trace(p, rng)
            share = t.terminal.reading_unease
            steps = (t.terminal.unease - share) / kn.self_check
            assert steps > -1e-9 and abs(steps - round(steps)) < 1e-9
            seen.add((share > 0, any(q.kind == "reread" for q in t.pieces[t.capped_pieces :])))
            if not p.meta.get("distractor"):
                assert share == 0.0
    assert (True, False) in seen and (False, False) in seen
