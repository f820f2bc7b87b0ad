"""Testbed v2's trace writer at the generator level: does it meet the testbed's targets? (CPU, < 1 min)

Backs docs/testbed.md ("The trace writer's statistics").

    python research/testbed_v2_design.py                 # 200 evaluation problems x 64 traces
    python research/testbed_v2_design.py --knobs '{"guess_prob": 0.2}'

The traces are the writer's own (:func:`hf_msv.testbed.task_v2.sample_trace`): what a perfect imitator of it would
show, not an LM's. Everything is read from what a sampler capped at ``max_trace_tokens`` sees, with the greedy answer
of the elicitation rule at every ``Wait``. Rows (target in brackets): pass@1 [0.3, 0.6]; majority right [<= 0.75];
pass@K - maj@K [>= 0.15]; elicited answers per sequence [>= 6]; first intermediate vs terminal accuracy [>= 10 pp
below]; Waits of wrong vs right traces [wrong higher]; traces at the cap [10-40 %]; mean trace tokens [<= 400];
visible-feature probe AUROC [>= 0.80] (a logistic regression on what a reader of the capped trace sees, fit on half
the problems, scored on the other half). Informational rows: the probe's best-of-K, the probe with an arithmetic
check of the written equations and without the clause-reading features, the writer's own answer probabilities'
AUROC (a Token-Probs proxy), re-check outcomes, and in the JSON the writer's trace errors counted as
``research/testbed_quality.py`` counts an LM's. The last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections import Counter

import numpy as np

from hf_msv.testbed.task_v2 import (
    apply_op,
    carry_positions,
    error_rates,
    false_equations,
    generate_problems,
    knobs_v2,
    sample_trace,
    step_risk,
    trace_errors,
    trace_tokens,
    written_equations,
)


def visible_features(capped_text: str, finished: bool, problem, kn) -> list[float]:
    """What a reader of the question and the capped trace sees, without checking any arithmetic (one row of the
    probe): the first pass's steps as written, their carries and risk (a function of their digits), Waits, fixes,
    stated answers, the irrelevant clause's wording and whether the chain subtracted its number."""
    n_question_ops = len(problem.meta["ops"])
    # the first pass as written (not its re-checks)
    first = [e for e in written_equations(capped_text) if not e.checked][:n_question_ops]
    dis = problem.meta.get("distractor")
    first_pass = capped_text.split(" So ")[0]
    took = bool(dis) and first_pass.count(f"-{dis[1]}=") > sum(o == ["-", dis[1]] for o in problem.meta["ops"])
    rereads = capped_text.count("still count") + capped_text.count("take them away")
    carries = [len(carry_positions(e.a, e.op, e.k)) for e in first]
    risks = [step_risk(e.a, e.op, e.k, kn) for e in first]
    n_mul = sum(e.op == "*" for e in first)
    waits = capped_text.count("Wait")
    fixes, yeses = capped_text.count("? no,"), capped_text.count("? yes.")
    stated = re.findall(r"(?:So|About) (-?\d+)\.", capped_text)
    last_is_stated = bool(re.search(r"So -?\d+\.\s*$", capped_text.split("\n")[0])) or finished
    return [
        float(capped_text.startswith(" About")),
        n_question_ops,
        sum(carries),
        max(carries, default=0),
        n_mul,
        sum(risks),
        max(risks, default=0.0),
        waits,
        fixes,
        yeses,
        float(finished),
        float(not last_is_stated),
        len(set(stated)),
        float(len(stated) >= 2 and stated[-1] != stated[-2]),
        trace_tokens(capped_text) / 100.0,
        fixes / max(waits, 1),
        float(bool(dis)),
        *[float(bool(dis) and dis[2] == w) for w in range(3)],
        float(took),
        float(rereads),
        float(took != (rereads % 2 == 1)),
    ]


READING_COLUMNS = slice(20, 23)  # in visible_features: took the clause, rereads, final reading (the last columns)


def auroc(y: np.ndarray, s: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, s)) if 0 < y.sum() < len(y) else float("nan")


def probe_scores(X: np.ndarray, y: np.ndarray, fit_rows: np.ndarray) -> np.ndarray:
    """Logistic regression fit on ``fit_rows`` (half the problems); its scores of the other rows (held-out
    problems)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    clf.fit(X[fit_rows], y[fit_rows])
    return clf.predict_proba(X[~fit_rows])[:, 1]


def probe_auroc(X: np.ndarray, y: np.ndarray, fit_rows: np.ndarray) -> float:
    return auroc(y[~fit_rows], probe_scores(X, y, fit_rows))


def best_of_k(scores: np.ndarray, y: np.ndarray, pid: np.ndarray) -> float:
    """Accuracy of the highest-scored trace per problem (rows aligned; every problem's rows together)."""
    return float(np.mean([y[pid == i][np.argmax(scores[pid == i])] for i in np.unique(pid)]))


def sample_all(problems, k: int, seed: int, knobs: dict):
    """Per trace: (problem index, terminal right, Waits, first-Wait answer right or None, ...) and probe features;
    the final re-check outcomes and the writer's trace errors (:func:`~hf_msv.testbed.task_v2.trace_errors`)."""
    rng, kn = random.Random(seed), knobs_v2(**knobs)
    rows, feats, finals, outcomes, errors = [], [], [], Counter(), Counter()
    for pi, p in enumerate(problems):
        ans = []
        for _ in range(k):
            t = sample_trace(p, rng, **knobs)
            errors += trace_errors([t.capped_text], p)  # counted as testbed_quality counts an LM's
            right = t.terminal.answer == p.gold
            waits = [w.answer == p.gold for w in t.waits]
            capped = t.capped_text
            rows.append(
                dict(
                    problem=pi,
                    right=right,
                    waits=len(waits),
                    first=waits[0] if waits else None,
                    wait_acc=waits,
                    finished=t.finished,
                    tokens=trace_tokens(capped) + t.finished,
                    derived=t.terminal.derived,
                    prob=t.terminal.answer_prob,
                )
            )
            f = visible_features(capped, t.finished, p, kn)
            feats.append(f + [false_equations(capped)])
            ans.append(t.terminal.answer)
            for piece in t.pieces[: t.capped_pieces]:
                if piece.kind in ("check", "fix", "reread"):
                    outcomes[_outcome(piece, t, p)] += 1
        finals.append(ans)
    return rows, np.array(feats, dtype=float), finals, outcomes, errors


def _outcome(piece, t, p) -> str:
    """A re-check as confirm / fix / break / change (wrong -> other wrong), from the equation it re-checks."""
    if piece.kind == "reread":
        return "reread"
    e = written_equations(piece.text)[0]
    if piece.kind == "check":
        return "confirm"
    return "fix" if e.fix == apply_op(e.a, e.op, e.k) else "break" if e.true else "wrong_to_wrong"


def summarize(problems, rows, X, finals, outcomes, errors) -> dict:
    y = np.array([r["right"] for r in rows], dtype=int)
    pid = np.array([r["problem"] for r in rows])
    fit = pid < len(problems) // 2
    waits = np.array([r["waits"] for r in rows], dtype=float)
    firsts = [(r["first"], r["right"]) for r in rows if r["first"] is not None]
    all_waits = [a for r in rows for a in r["wait_acc"]]
    maj = [Counter(a).most_common(1)[0][0] == p.gold for p, a in zip(problems, finals)]
    anyr = [p.gold in a for p, a in zip(problems, finals)]
    within = []  # per problem with both: mean Waits of its wrong traces minus its right ones
    for i in range(len(problems)):
        m = pid == i
        if 0 < y[m].sum() < m.sum():
            within.append(waits[m & (y == 0)].mean() - waits[m & (y == 1)].mean())
    n_re = sum(outcomes.values()) or 1
    return {
        "pass_at_1": float(y.mean()),
        "maj_at_k": float(np.mean(maj)),
        "pass_at_k": float(np.mean(anyr)),
        "pass_minus_maj": float(np.mean(anyr) - np.mean(maj)),
        "elicited_per_sequence": float(waits.mean() + 1),
        "first_intermediate_acc": float(np.mean([f for f, _ in firsts])),
        "terminal_acc_same_traces": float(np.mean([r for _, r in firsts])),
        "intermediate_acc_all_waits": float(np.mean(all_waits)),
        "waits_wrong": float(waits[y == 0].mean()),
        "waits_right": float(waits[y == 1].mean()),
        "waits_wrong_minus_right_within_problem": float(np.mean(within)) if within else float("nan"),
        "cap_binding_share": float(np.mean([not r["finished"] for r in rows])),
        "mean_trace_tokens": float(np.mean([r["tokens"] for r in rows])),
        "max_trace_tokens_seen": int(max(r["tokens"] for r in rows)),
        "probe_auroc_visible": probe_auroc(X[:, :-1], y, fit),
        "probe_best_of_k": best_of_k(probe_scores(X[:, :-1], y, fit), y[~fit], pid[~fit]),
        "pass_at_1_held_out": float(y[~fit].mean()),
        "probe_auroc_with_arithmetic_check": probe_auroc(X, y, fit),
        "probe_auroc_without_clause_reading": probe_auroc(X[:, : READING_COLUMNS.start], y, fit),
        "token_prob_proxy_auroc": auroc(y, np.array([r["prob"] for r in rows])),
        "terminal_derived_share": float(np.mean([r["derived"] for r in rows])),
        "acc_finished": float(y[[r["finished"] for r in rows]].mean()),
        "acc_capped": float(y[[not r["finished"] for r in rows]].mean())
        if not all(r["finished"] for r in rows)
        else float("nan"),
        "distinct_answers_per_problem": float(np.mean([len(set(a)) for a in finals])),
        "recheck_outcomes": {k: round(v / n_re, 4) for k, v in sorted(outcomes.items())},
        "writer_trace_errors": error_rates(errors),
    }


def table(s: dict) -> list[tuple[str, str, str, bool | None]]:
    """(row, target, measured, passed); passed None for informational rows."""
    d = s["terminal_acc_same_traces"] - s["first_intermediate_acc"]
    return [
        ("pass@1", "0.30-0.60", f"{s['pass_at_1']:.3f}", 0.3 <= s["pass_at_1"] <= 0.6),
        ("majority right (maj@K)", "<= 0.75", f"{s['maj_at_k']:.3f}", s["maj_at_k"] <= 0.75),
        ("pass@K - maj@K", ">= 0.15", f"{s['pass_minus_maj']:.3f}", s["pass_minus_maj"] >= 0.15),
        ("elicited answers / sequence", ">= 6", f"{s['elicited_per_sequence']:.2f}", s["elicited_per_sequence"] >= 6),
        (
            "first intermediate acc vs terminal",
            ">= 10 pp below",
            f"{s['first_intermediate_acc']:.3f} vs {s['terminal_acc_same_traces']:.3f} ({100 * d:.1f} pp)",
            d >= 0.10,
        ),
        (
            "Waits / trace, wrong vs right",
            "wrong higher",
            f"{s['waits_wrong']:.2f} vs {s['waits_right']:.2f}",
            s["waits_wrong"] > s["waits_right"],
        ),
        ("cap-binding share", "0.10-0.40", f"{s['cap_binding_share']:.3f}", 0.1 <= s["cap_binding_share"] <= 0.4),
        ("mean trace tokens", "<= 400", f"{s['mean_trace_tokens']:.1f}", s["mean_trace_tokens"] <= 400),
        ("visible-feature probe AUROC", ">= 0.80", f"{s['probe_auroc_visible']:.3f}", s["probe_auroc_visible"] >= 0.8),
        (
            "visible probe best-of-K vs pass@1 (info)",
            "LM: >= +0.10",
            f"{s['probe_best_of_k']:.3f} vs {s['pass_at_1_held_out']:.3f} (held-out problems)",
            None,
        ),
        ("probe + arithmetic check (info)", "-", f"{s['probe_auroc_with_arithmetic_check']:.3f}", None),
        ("probe without the clause reading (info)", "-", f"{s['probe_auroc_without_clause_reading']:.3f}", None),
        ("Token-Probs proxy AUROC (info)", "LM: >= 0.70", f"{s['token_prob_proxy_auroc']:.3f}", None),
        ("accuracy at every Wait (info)", "-", f"{s['intermediate_acc_all_waits']:.3f}", None),
        (
            "Waits wrong - right, within problem (info)",
            "-",
            f"{s['waits_wrong_minus_right_within_problem']:.2f}",
            None,
        ),
        ("accuracy finished / capped (info)", "-", f"{s['acc_finished']:.3f} / {s['acc_capped']:.3f}", None),
        ("distinct terminal answers / problem (info)", "-", f"{s['distinct_answers_per_problem']:.1f}", None),
        ("re-check outcomes (info)", "mostly confirm", json.dumps(s["recheck_outcomes"]), None),
        (
            "Wait right after a false / true step (info)",
            "-",
            "{wait_after_false} / {wait_after_true}".format(**s["writer_trace_errors"]),
            None,
        ),
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-problems", type=int, default=200)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--knobs", default="{}", help="JSON dict of TaskKnobsV2 overrides")
    a = ap.parse_args(argv)
    t0 = time.time()
    knobs = json.loads(a.knobs)
    knobs_v2(**knobs)  # validate before sampling
    problems = generate_problems("evaluation", a.n_problems, seed=a.seed, **knobs)
    rows, X, finals, outcomes, errors = sample_all(problems, a.samples, a.seed, knobs)
    s = summarize(problems, rows, X, finals, outcomes, errors)
    rows_t = table(s)
    print(f"{'row':44s} {'target':16s} {'measured':40s} verdict")
    for name, target, measured, ok in rows_t:
        print(f"{name:44s} {target:16s} {measured:40s} {'info' if ok is None else 'PASS' if ok else 'FAIL'}")
    s.update(
        n_problems=len(problems),
        samples_per_problem=a.samples,
        knobs=knobs,
        seed=a.seed,
        rows_passed=sum(ok is True for *_, ok in rows_t),
        rows_measured=sum(ok is not None for *_, ok in rows_t),
        wall_s=round(time.time() - t0, 1),
    )
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()}))
    return s


if __name__ == "__main__":
    main()
