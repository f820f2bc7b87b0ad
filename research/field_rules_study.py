"""The field's early-stopping and pruning rules against the MSV's stop, at matched tokens (docs/early_stopping.md,
"The field's rules").

Every rule of `hf_msv.evaluation.field_rules.field_rules` has its setting chosen on the validation groups only
(`choose_on_validation`: the cheapest setting within 1 pp of the rule's own full decoding, and the most accurate
within 30 / 50 / 70 % of full decoding's chain-of-thought tokens), then is applied to the evaluation groups: accuracy
(paired bootstrap interval over problems against the rule's own full decoding and against the MSV_16 stop head's
full decoding), chain-of-thought token fraction and all-tokens fraction (chain of thought + elicitation).
Scores: the shipped MSV_16 (per-answer score, and its stop head at its certified λ as the reference row) and the
Probe. DeepConf reads token confidences recomputed by ``research/field_rules_confidence.py`` (``--confidences``:
one ``.npz`` per collection, named after its directory). One group per problem (N = the 16 collected chains, in
stored order). The verifiers' scores are cached beside the confidences. Last line: JSON (also ``--output``).

    OMP_NUM_THREADS=1 python research/field_rules_study.py --val-dir /work/runs/val256 \
        --eval-dir /work/runs/eval192 --confidences /work/runs/confidences --output docs/results/field-rules.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from hf_msv.data import AnswerGroup, ShardDataset, answer_group
from hf_msv.evaluation.early_stop import interpolated_curve
from hf_msv.evaluation.field_rules import (
    ChainRecord,
    RuleCurve,
    choose_on_validation,
    field_rules,
    rule_curve,
)
from hf_msv.evaluation.scoring import score_problems
from hf_msv.evaluation.verifiers import load_verifier
from hf_msv.generation import decide_stop
from hf_msv.lambda_rule import LambdaChoice
from hf_msv.metrics import paired_bootstrap
from hf_msv.schedules import NEVER, Schedule
from hf_msv.stop_rules import StopHead, stop_events

BUDGETS = (0.3, 0.5, 0.7)


def split_groups(directory: str, verifiers: dict, confidences: str) -> tuple[list[AnswerGroup], list[ChainRecord]]:
    """A collection's groups (every chain of a problem, stored order) with the verifiers' scores, and their
    `ChainRecord`s (answer steps, token confidences)."""
    name = Path(directory).name
    dataset = ShardDataset(directory, mode="streaming")
    problems = dataset.read_problems()
    cache = Path(confidences) / f"{name}-scores.npz"
    if cache.exists():
        stored = np.load(cache, allow_pickle=True)
        scores = {k: list(stored[k]) for k in verifiers}
    else:
        scores = {}
        for k, path in verifiers.items():
            started = time.time()
            scores[k] = score_problems(load_verifier(path), dataset)[0]
            print(f"{name}: scored {k} in {time.time() - started:.0f}s", flush=True)
        np.savez(cache, **{k: np.array(v, dtype=object) for k, v in scores.items()})
    conf = np.load(Path(confidences) / f"{name}.npz")
    where = {(str(p), int(s)): i for i, (p, s) in enumerate(zip(conf["problem_id"], conf["sequence"]))}
    offset, values = conf["offset"], conf["confidence"]
    groups, extras = [], []
    for i, p in enumerate(problems):
        g = answer_group(p, None, "streaming", {k: np.clip(v[i], 0.0, 1.0) for k, v in scores.items()})
        rows = [where[(p.problem_id, n)] for n in range(p.num_sequences)]
        tokens = tuple(values[offset[r] : offset[r + 1]] for r in rows)
        groups.append(g)
        extras.append(ChainRecord(step=p.answer_step, token_confidence=tokens))
    return groups, extras


def stop_head_schedules(group: AnswerGroup, step, head: StopHead, lambdas) -> list[Schedule]:
    """The MSV's stop (its head on class snapshots, `decide_stop`) as `Schedule`s, one per λ."""
    ev = stop_events(head, group.klass, group.sequence, step, group.end, group.num_sequences, group.scores["msv"])
    d = decide_stop(ev.time, ev.statistic, group.is_terminal[ev.answer], lambdas, ev.confidence, True)
    n = group.num_sequences
    return [
        Schedule(np.full(n, int(t) if s else NEVER), np.zeros(n, bool), int(t), bool(s), int(ev.answer[c]))
        for s, t, c in zip(d.stopped, d.stop_step, d.chosen)
    ]


def stop_head_curve(groups, extras, head: StopHead, lam: float) -> RuleCurve:
    """The MSV stop head at `lam` and at full decoding on `groups`, as a two-setting `RuleCurve`."""
    from hf_msv.evaluation.field_rules import all_tokens

    correct, cot, every, full_cot, full_all = [], [], [], [], []
    for g, x in zip(groups, extras):
        sched = stop_head_schedules(g, x.step, head, [lam, math.inf])
        correct.append([bool(g.correct[s.chosen]) for s in sched])
        cot.append([s.cot_tokens(g.seq_len) for s in sched])
        every.append([all_tokens(s, g) for s in sched])
        full_cot.append(cot[-1][-1])
        full_all.append(every[-1][-1])
    return RuleCurve(
        (f"lambda={lam:.3f}", "full"),
        np.asarray(correct),
        np.asarray(cot),
        np.asarray(every),
        np.asarray(full_cot),
        np.asarray(full_all),
        tuple(g.problem_id for g in groups),
    )


def interval(a: np.ndarray, b: np.ndarray, n_boot: int) -> dict:
    """Paired bootstrap of accuracy a − b over problems (one group each)."""
    return paired_bootstrap(a.astype(float), b.astype(float), n_boot=n_boot)


def evaluate_rule(label, rule, val, evaluation, reference: np.ndarray, n_boot: int) -> dict:
    """One rule: chosen on validation, applied to evaluation."""
    fitted, val_curve, choices = choose_on_validation(rule, *val, tolerance=0.01, budgets=BUDGETS)
    curve = rule_curve(fitted, *evaluation)
    own_full = curve.correct[:, -1]
    cot, every = curve.fraction(), curve.fraction(all_tokens=True)
    points = []
    for c in choices:
        j = c.index
        points.append(
            {
                "target": c.target,
                "setting": c.setting,
                "fits_on_validation": c.fits,
                "validation_accuracy": c.accuracy,
                "validation_token_fraction": c.token_fraction,
                "accuracy": float(curve.accuracy[j]),
                "vs_own_full": interval(curve.correct[:, j], own_full, n_boot),
                "vs_msv_full": interval(curve.correct[:, j], reference, n_boot),
                "cot_token_fraction": float(cot[j]),
                "all_token_fraction": float(every[j]),
                "pruned_chains": float(curve.pruned[j]) if curve.pruned.size else 0.0,
            }
        )
    return {
        "rule": label,
        "config": {k: v for k, v in asdict(fitted).items() if k != "name"},
        "full_accuracy": float(own_full.mean()),
        "validation_full_accuracy": float(val_curve.accuracy[-1]),
        "points": points,
        "curve": {
            "settings": list(curve.settings),
            "accuracy": curve.accuracy.tolist(),
            "cot_token_fraction": cot.tolist(),
            "all_token_fraction": every.tolist(),
            # a curve summary (a mix of two settings), not a setting chosen on validation
            "interpolated_accuracy": {f"{b:g}": interpolated_curve(curve.tradeoff()).at(b) for b in BUDGETS},
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--val-dir")
    parser.add_argument("--eval-dir")
    parser.add_argument("--confidences", help="directory of research/field_rules_confidence.py's npz")
    parser.add_argument("--msv", default="hf_msv/testbed/verifier")
    parser.add_argument("--probe", default="/work/runs/probe")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--only", nargs="*", default=None, help="rule labels to run (default all)")
    parser.add_argument("--output", default=None)
    parser.add_argument("--markdown", default=None, help="print the docs table of a results JSON and exit")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return
    verifiers = {"msv": args.msv, "probe": args.probe}
    val = split_groups(args.val_dir, verifiers, args.confidences)
    evaluation = split_groups(args.eval_dir, verifiers, args.confidences)
    msv = load_verifier(args.msv)
    head, choice = StopHead.of(msv.config), LambdaChoice.of(msv.config)
    head = head.at(
        math.inf
    )  # the plain head: these figures are the certified λ's and above, where a floor below a switch is off
    ref = stop_head_curve(*evaluation, head, choice.lam)
    reference = ref.correct[:, -1]
    out = {
        "validation": args.val_dir,
        "evaluation": args.eval_dir,
        "groups": {"validation": len(val[0]), "evaluation": len(evaluation[0])},
        "msv_stop_head": {
            "lambda": choice.lam,
            "accuracy": float(ref.accuracy[0]),
            "full_accuracy": float(reference.mean()),
            "vs_msv_full": interval(ref.correct[:, 0], reference, args.bootstrap),
            "cot_token_fraction": float(ref.fraction()[0]),
            "all_token_fraction": float(ref.fraction(all_tokens=True)[0]),
        },
        "rules": [],
    }
    print(json.dumps(out["msv_stop_head"]), flush=True)
    for label, rule in field_rules().items():
        if args.only and label not in args.only:
            continue
        started = time.time()
        result = evaluate_rule(label, rule, val, evaluation, reference, args.bootstrap)
        out["rules"].append(result)
        brief = [(p["target"], p["setting"], round(p["accuracy"], 3), round(p["cot_token_fraction"], 2))
                 for p in result["points"]]  # fmt: skip
        print(f"{label} ({time.time() - started:.0f}s): full {result['full_accuracy']:.3f} {brief}", flush=True)
    text = json.dumps(out, indent=1, default=float)
    if args.output:
        Path(args.output).write_text(text + "\n")
    print(json.dumps(out, default=float))


def markdown(results: dict) -> str:
    """The docs table: per rule, its full decoding, the ≤ 1 pp point and the three budgets (accuracy, CoT tokens)."""

    def pp(d: dict) -> str:
        return f"{d['estimate'] * 100:+.1f} [{d['low'] * 100:+.1f}, {d['high'] * 100:+.1f}]"

    m = results["msv_stop_head"]
    lines = [
        "| rule | full decoding | ≤ 1 pp setting: accuracy (− own full), CoT, all tokens | 30 % | 50 % | 70 % |",
        "|---|---|---|---|---|---|",
        f"| MSV_16 stop head, certified λ {m['lambda']:.3f} | {m['full_accuracy']:.3f} | {m['accuracy']:.3f} "
        f"({pp(m['vs_msv_full'])}), {m['cot_token_fraction']:.2f}, {m['all_token_fraction']:.2f} | | | |",
    ]
    for r in results["rules"]:
        within, *budgets = r["points"]
        cells = [
            f"{b['accuracy']:.3f} at {b['cot_token_fraction']:.2f}{'' if b['fits_on_validation'] else ' (none fits)'}"
            for b in budgets
        ]
        lines.append(
            f"| {r['rule']} | {r['full_accuracy']:.3f} | {within['setting']}: {within['accuracy']:.3f} "
            f"({pp(within['vs_own_full'])}), {within['cot_token_fraction']:.2f}, {within['all_token_fraction']:.2f} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
