"""The shipped default (the MSV's certified pruning rule beside its group stop) against the field's rules at matched
chain-of-thought tokens (docs/pruning.md, "The default against the field's rules").

The default's curve is the verifier's certified pruning rule (``config.early_stopping["pruning"]``) replayed exactly
(`replay_sweep`: the MSV re-scores a group after every prune) with the group stop over the λ grid
(`hf_msv.lambda_rule.LAMBDAS`, λ = ∞ the rule alone), full decoding (no rule) last: one `RuleCurve`, read by the same
`choose_settings` as every field rule. Every rule, the default included, has its setting for each 30 / 50 / 70 %
budget chosen on the validation groups only, then applied to the evaluation groups; the interpolated curves (upper
hull, `interpolated_curve`) are read at the same budgets. Each field rule is compared with the default by a paired
bootstrap over problems (default − rule) at the validation-chosen settings and on the interpolated curves (a
problem's value on a hull is its mix of the two vertices' correctness). The field rules' inputs are
``research/field_rules_study.py``'s (token confidences from ``research/field_rules_confidence.py``; MSV and Probe
scores cached beside them). The default's replays are cached (``--cache``). Several ``--eval-dir`` collections are
pooled. With ``--floored-msv`` (the same verifier with a support floor in its stop head, `StopHead.min_share`) it also
reports the default whose floor holds only below a switch λ_s (`StopHead.floor_below`), λ_s chosen on the
validation groups (`choose_switch`). Last line: JSON (also ``--output``).

    OMP_NUM_THREADS=1 python research/default_vs_field.py --val-dir runs/pool --eval-dir runs/eval192 \
        --confidences runs/confidences --msv hf_msv/testbed/verifier --probe runs/probe \
        --output docs/results/default-vs-field-n16.json
    python research/default_vs_field.py --markdown docs/results/default-vs-field-n16.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `import research.…`

from hf_msv.evaluation.early_stop import interpolated_curve
from hf_msv.evaluation.field_rules import RuleCurve, choose_on_validation, choose_settings, field_rules, rule_curve
from hf_msv.evaluation.verifiers import load_verifier
from hf_msv.lambda_rule import LAMBDAS
from hf_msv.metrics import paired_bootstrap
from hf_msv.pruning import PRUNE_OFF, PruneRule
from hf_msv.stop_rules import StopHead
from hf_msv.training.pruned_replay import MSVGroupScorer, load_replay_groups, replay_sweep, sweep_groups
from research.field_rules_study import split_groups

BUDGETS = (0.3, 0.5, 0.7)


def default_curve(directory: str, verifier, rule: PruneRule, num_chains: int, cache: Path | None) -> RuleCurve:
    """The default's `RuleCurve` on a collection: `rule` with the group stop at every λ of `LAMBDAS`, then full
    decoding (neither), in the collection's stored problem order. A cache written for another rule or stopping
    rule (the verifier's ``early_stopping``) is recomputed."""
    key = json.dumps({"rule": rule.to_dict(), "early_stopping": verifier.config.early_stopping}, sort_keys=True)
    if cache is not None and cache.exists():
        z = np.load(cache, allow_pickle=True)
        if "key" in z and str(z["key"]) == key:
            return RuleCurve(tuple(z["settings"]), *(z[k] for k in ("correct", "cot", "all", "full_cot", "full_all")),
                             tuple(z["problem"]), z["pruned"])  # fmt: skip
        print(f"{cache}: written for another rule or verifier, replayed again", flush=True)
    head = StopHead.of(verifier.config)
    groups = load_replay_groups(directory, num_chains)
    scorer = MSVGroupScorer(verifier)
    started = time.time()
    scores = scorer(groups, [np.ones(g.sequence.size, bool) for g in groups])
    full = replay_sweep(PRUNE_OFF, head, groups, scorer, scores, [math.inf])
    # Each λ with the head in effect at it (`StopHead.at`): a support floor below a switch λ is replayed as live.
    curve = swept_curve(replay_sweep(rule, head, groups, scorer, scores, LAMBDAS), full)
    print(f"{Path(directory).name}: default replayed in {time.time() - started:.0f}s", flush=True)
    if cache is not None:
        np.savez(cache, settings=np.array(curve.settings), correct=curve.correct, cot=curve.cot_tokens,
                 all=curve.all_tokens, full_cot=curve.full_cot, full_all=curve.full_all,
                 problem=np.array(curve.problem), pruned=curve.pruned, key=np.array(key))  # fmt: skip
    return curve


def stop_curve(groups, head: StopHead, streams, full) -> RuleCurve:
    """The `RuleCurve` of replayed `streams` (one per group) with the group stop at every λ of `LAMBDAS`, then full
    decoding (`full`: a λ = ∞ sweep of the groups with no pruning)."""
    return swept_curve(sweep_groups(groups, streams, head, LAMBDAS), full)


def swept_curve(swept, full) -> RuleCurve:
    """The `RuleCurve` of a `PrunedReplay` over `LAMBDAS`, then full decoding (`full`, as `stop_curve`)."""
    return RuleCurve(
        (*(f"lambda={lam:g}" for lam in LAMBDAS), "full"),
        np.concatenate([swept.correct, full.correct], 1),
        np.concatenate([swept.cot, full.cot], 1).astype(np.int64),
        np.concatenate([swept.tokens, full.tokens], 1).astype(np.int64),
        full.cot[:, 0].astype(np.int64),
        full.tokens[:, 0].astype(np.int64),
        tuple(str(p) for p in swept.problem),
        np.concatenate([swept.pruned, np.zeros((len(swept.problem), 1))], 1).mean(0),
    )


def concatenated(curves: list[RuleCurve]) -> RuleCurve:
    """One `RuleCurve` of the groups of several collections' curves (one grid), in order."""
    if len(curves) == 1:
        return curves[0]
    g = np.array([c.correct.shape[0] for c in curves], np.float64)
    return RuleCurve(
        curves[0].settings,
        *(np.concatenate([getattr(c, k) for c in curves]) for k in ("correct", "cot_tokens", "all_tokens",
                                                                     "full_cot", "full_all")),
        tuple(p for c in curves for p in c.problem),
        sum(w * c.pruned for w, c in zip(g / g.sum(), curves)),
    )  # fmt: skip


def switched(default: RuleCurve, floored: RuleCurve, lam_switch: float) -> RuleCurve:
    """The default's curve with the floored verifier's settings below `lam_switch`: the support floor on where
    λ < `lam_switch`, off at and above it (full decoding included)."""
    below = np.array([s.startswith("lambda=") and float(s.split("=")[1]) < lam_switch for s in default.settings])
    if default.settings != floored.settings or default.problem != floored.problem:
        raise ValueError("the two curves need one grid and one problem order")
    return RuleCurve(
        default.settings,
        *(np.where(below, getattr(floored, k), getattr(default, k)) for k in ("correct", "cot_tokens", "all_tokens")),
        default.full_cot,
        default.full_all,
        default.problem,
        np.where(below, floored.pruned, default.pruned),
    )


def choose_switch(default: RuleCurve, floored: RuleCurve, below: float) -> float:
    """The switch λ_s (a grid λ under `below`, the certified λ) whose switched curve has the highest mean
    interpolated accuracy over `BUDGETS` on these (validation) groups; ties: the smallest λ_s."""
    candidates = [float(x) for x in LAMBDAS if np.isfinite(x) and 0 < x < below]
    value = [np.mean([interpolated_curve(switched(default, floored, c).tradeoff()).at(b) for b in BUDGETS])
             for c in candidates]  # fmt: skip
    return candidates[int(np.argmax(np.round(value, 12)))]


def aligned(curve: RuleCurve, problems) -> RuleCurve:
    """`curve` with its groups in the order of `problems` (the field rules' order)."""
    where = {p: i for i, p in enumerate(curve.problem)}
    missing = [p for p in problems if p not in where]
    if missing:
        raise ValueError(f"{len(missing)} problems of the field rules' groups are not in the default's replay")
    i = np.array([where[p] for p in problems])
    return RuleCurve(curve.settings, curve.correct[i], curve.cot_tokens[i], curve.all_tokens[i], curve.full_cot[i],
                     curve.full_all[i], tuple(problems), curve.pruned)  # fmt: skip


def hull_values(curve: RuleCurve, budget: float) -> np.ndarray:
    """(G,) each problem's correctness on `curve`'s interpolated curve at `budget`: the mix of the two hull
    vertices around it (the origin, answering nothing, a vertex), whose mean is `interpolated_curve(...).at`."""
    fraction = np.r_[0.0, curve.fraction()]
    correct = np.concatenate([np.zeros((curve.correct.shape[0], 1)), curve.correct.astype(float)], 1)
    hull = interpolated_curve(curve.tradeoff())
    peak = int(np.argmax(hull.accuracy))
    xs, ys = hull.fraction[: peak + 1], hull.accuracy[: peak + 1]  # flat past the peak: the peak's mix
    x = min(budget, xs[-1])

    def vertex(k: int) -> int:  # a setting at hull vertex k (its budget, its accuracy)
        ok = np.flatnonzero(np.isclose(fraction, xs[k]) & np.isclose(correct.mean(0), ys[k]))
        return int(ok[0])

    hi = int(np.searchsorted(xs, x - 1e-12))
    if hi == 0 or np.isclose(xs[hi], x):
        return correct[:, vertex(hi)]
    w = (x - xs[hi - 1]) / (xs[hi] - xs[hi - 1])
    return (1 - w) * correct[:, vertex(hi - 1)] + w * correct[:, vertex(hi)]


def compare(default_values: np.ndarray, rule_values: np.ndarray, n_boot: int, rule_fits: bool = True) -> dict:
    """Default − rule, paired over problems. ``holds``: the default is ahead (point estimate ≥ 0, lower bound ≥ −1
    pp), or the rule has no setting within the budget on validation (it decodes more than the budget allows)."""
    d = paired_bootstrap(default_values.astype(float), rule_values.astype(float), n_boot=n_boot)
    ahead = bool(d["estimate"] >= 0 and d["low"] >= -0.01)
    return d | {"ahead": ahead, "rule_within_budget": rule_fits, "holds": ahead or not rule_fits}


def points(curve: RuleCurve, choices) -> list[dict]:
    cot, every = curve.fraction(), curve.fraction(all_tokens=True)
    return [
        {
            "target": c.target,
            "setting": c.setting,
            "fits_on_validation": c.fits,
            "accuracy": float(curve.accuracy[c.index]),
            "cot_token_fraction": float(cot[c.index]),
            "all_token_fraction": float(every[c.index]),
        }
        for c in choices
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--val-dir")
    parser.add_argument("--eval-dir", nargs="+", help="one or more collections of new problems, pooled")
    parser.add_argument("--confidences", help="directory of research/field_rules_confidence.py's npz")
    parser.add_argument("--msv", default="hf_msv/testbed/verifier")
    parser.add_argument("--floored-msv", default=None, help="the verifier with a support floor in its stop head: "
                        "also report the default with the floor below a switch λ chosen on validation")  # fmt: skip
    parser.add_argument("--probe", default=None)
    parser.add_argument("--cache", default=None, help="directory for the default's replays (default: --confidences)")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--only", nargs="*", default=None, help="field rule labels to run (default all)")
    parser.add_argument("--output", default=None)
    parser.add_argument("--markdown", default=None, help="print the docs table of a results JSON and exit")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return
    msv = load_verifier(args.msv)
    rule = PruneRule.of(msv.config)
    cache = Path(args.cache or args.confidences)
    verifiers = {"msv": args.msv} | ({"probe": args.probe} if args.probe else {})
    val = split_groups(args.val_dir, verifiers, args.confidences)
    parts = [split_groups(d, verifiers, args.confidences) for d in args.eval_dir]
    evaluation = ([g for p in parts for g in p[0]], [e for p in parts for e in p[1]])
    n = val[0][0].num_sequences

    def curves(verifier, tag: str) -> tuple[RuleCurve, RuleCurve]:
        def one(d, groups):
            path = cache / f"{Path(d).name}-default{tag}.npz"
            return aligned(default_curve(d, verifier, rule, n, path), [g.problem_id for g in groups])

        return one(args.val_dir, val[0]), concatenated([one(d, p[0]) for d, p in zip(args.eval_dir, parts)])

    defaults = {"default": curves(msv, "")}
    switch = None
    if args.floored_msv:
        floored = curves(load_verifier(args.floored_msv), "-floored")
        certified = float(msv.config.early_stopping["pruning"]["lambda"]["lam"])  # the floor stays off at and above it
        switch = choose_switch(defaults["default"][0], floored[0], certified)
        defaults["switched"] = tuple(switched(d, f, switch) for d, f in zip(defaults["default"], floored))
    out = {
        "validation": args.val_dir,
        "evaluation": args.eval_dir,
        "num_sequences": n,
        "groups": {"validation": len(val[0]), "evaluation": len(evaluation[0])},
        "rules": [],
    }
    mine, hull = {}, {}
    for name, (on_val, on_eval) in defaults.items():
        choices = choose_settings(on_val, budgets=BUDGETS)[1:]
        mine[name] = {c.target: on_eval.correct[:, c.index] for c in choices}
        hull[name] = {f"{b:g}": hull_values(on_eval, b) for b in BUDGETS}
        out[name] = {
            "rule": rule.describe() + ("" if name == "default" else f"; support floor below lambda={switch:g}"),
            "full_accuracy": float(on_eval.accuracy[-1]),
            "points": points(on_eval, choices),
            "interpolated_accuracy": {b: float(v.mean()) for b, v in hull[name].items()},
        } | ({} if name == "default" else {"lambda_switch": switch, "floored_msv": args.floored_msv})
        print(json.dumps(out[name]), flush=True)
    for label, field_rule in field_rules(("probe", "msv") if args.probe else ("msv",)).items():
        if args.only and label not in args.only:
            continue
        started = time.time()
        fitted, _, picked = choose_on_validation(field_rule, *val, budgets=BUDGETS)
        curve = rule_curve(fitted, *evaluation)
        budgeted = picked[1:]
        result = {
            "rule": label,
            "full_accuracy": float(curve.accuracy[-1]),
            "points": points(curve, budgeted),
            "interpolated_accuracy": {f"{b:g}": interpolated_curve(curve.tradeoff()).at(b) for b in BUDGETS},
        }
        for name in defaults:
            key = "" if name == "default" else f"_{name}"
            result[f"default{key}_minus_rule"] = {
                c.target: compare(mine[name][c.target], curve.correct[:, c.index], args.bootstrap, c.fits)
                for c in budgeted
            }
            result[f"default{key}_minus_rule_interpolated"] = {
                b: compare(v, hull_values(curve, float(b)), args.bootstrap) for b, v in hull[name].items()
            }
        out["rules"].append(result)
        print(f"{label} ({time.time() - started:.0f}s): {json.dumps(result['default_minus_rule'])}", flush=True)
    for name in defaults:
        key = "" if name == "default" else f"_{name}"
        kinds = (f"default{key}_minus_rule", f"default{key}_minus_rule_interpolated")
        holds = [c["holds"] for r in out["rules"] for k in kinds for c in r[k].values()]
        out[f"{name}_ahead_everywhere"] = bool(all(holds))
    text = json.dumps(out, indent=1, default=float)
    if args.output:
        Path(args.output).write_text(text + "\n")
    print(json.dumps(out, default=float))


def markdown(results: dict) -> str:
    """The docs table of each default (the default, and the switched one when measured): its and each rule's
    accuracy at the validation-chosen budgets (CoT fraction) and on the interpolated curves, with the paired
    difference default − rule."""

    def pp(d: dict) -> str:
        return f"{d['estimate'] * 100:+.1f} [{d['low'] * 100:+.1f}, {d['high'] * 100:+.1f}]"

    tables = []
    for name in ("default", "switched"):
        if name not in results:
            continue
        key = "" if name == "default" else f"_{name}"
        d = results[name]
        head = "| rule | full | " + " | ".join(f"{b:.0%} chosen" for b in BUDGETS) + " | "
        head += " | ".join(f"{b:.0%} interpolated" for b in BUDGETS) + " |"
        lines = [head, "|---|---|" + "---|" * (2 * len(BUDGETS))]
        cells = [f"{p['accuracy']:.3f} at {p['cot_token_fraction']:.2f}" for p in d["points"]]
        cells += [f"{v:.3f}" for v in d["interpolated_accuracy"].values()]
        lines.append(f"| **{d['rule']}** | {d['full_accuracy']:.3f} | " + " | ".join(cells) + " |")
        for r in results["rules"]:
            cells = [
                f"{p['accuracy']:.3f} at {p['cot_token_fraction']:.2f}{'' if p['fits_on_validation'] else '*'} "
                f"({pp(r[f'default{key}_minus_rule'][p['target']])})"
                for p in r["points"]
            ]
            cells += [
                f"{v:.3f} ({pp(r[f'default{key}_minus_rule_interpolated'][b])})"
                for b, v in r["interpolated_accuracy"].items()
            ]
            lines.append(f"| {r['rule']} | {r['full_accuracy']:.3f} | " + " | ".join(cells) + " |")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


if __name__ == "__main__":
    main()
