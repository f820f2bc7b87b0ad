"""Per-chain pruning beside the certified group stop (docs/pruning.md).

Every candidate rule of `hf_msv.training.pruned_replay.PRUNE_CANDIDATES` (chosen on the stop head's own problems,
before this script reads the calibration or evaluation problems) is replayed exactly (the MSV re-scores each group
after every prune) on the calibration problems; the rule and λ are certified jointly by Learn-then-Test
(`fit_pruning`: Bonferroni over the rules, fixed-sequence over λ; ε, δ); the stop-time confidence is recalibrated on
the calibration stops. The chosen pair and every candidate at its own certified λ are then applied unchanged to the
evaluation problems, against full decoding (no pruning, no stop) and the stop alone at the verifier's certified λ,
with paired bootstrap intervals over problems. The ceiling: a pruner that knows full decoding's answer
(`oracle_decision`) with the same stop. Last line: JSON (also written to ``--output``).

    python research/pruning_study.py --verifier hf_msv/testbed/verifier --calibration-dir runs/pool \
        --eval-dir runs/eval192 --epsilon 0.01 --output docs/results/pruning-n16.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from hf_msv import MSVVerifier
from hf_msv.lambda_rule import LAMBDAS, LambdaChoice, lambda_index
from hf_msv.metrics import ece, paired_bootstrap
from hf_msv.pruning import PRUNE_OFF, PruneRule
from hf_msv.stop_rules import StopHead
from hf_msv.training.pruned_replay import (
    PRUNE_CANDIDATES,
    MSVGroupScorer,
    PrunedReplay,
    fit_pruning,
    load_replay_groups,
    oracle_decision,
    replay_pruning,
    store_pruning,
    sweep_groups,
)
from hf_msv.training.regret import RegretHead
from hf_msv.utils import json_safe


def report(out: dict, output=None) -> dict:
    """A research script's result: made JSON-safe, written to `output` (when given) and printed as the last line."""
    out = json_safe(out)
    if output:
        with open(output, "w") as handle:
            json.dump(out, handle, indent=1)
    print(json.dumps(out))
    return out


def mapped_stops(groups, streams, head, lam: float, confidence_map) -> tuple[np.ndarray, np.ndarray]:
    """``(mapped, right)``: (S,) what the stops at λ report through `confidence_map` as deployed (the stop's
    features read where the map weighs them: `sweep_groups`), and (S,) whether they are right (float)."""
    at = sweep_groups(groups, streams, head, np.array([lam]), confidence_map)
    hit = at.stopped[:, 0]
    return np.asarray(at.confidence[hit, 0], np.float64), at.correct[hit, 0].astype(np.float64)


def operating_point(replay: PrunedReplay, j: int, full: PrunedReplay, stops=None) -> dict:
    """Accuracy, tokens as fractions of full decoding's (with paired bootstrap intervals) and the stop's
    calibration of `replay` at λ index j, against `full` (no pruning) at λ = ∞; `stops`: the recalibrated stops at
    j, ``(mapped, right)`` of `mapped_stops`."""
    f = LAMBDAS.size - 1
    right, reference = replay.correct[:, j].astype(float), full.correct[:, f].astype(float)
    out = replay.at(j) | {
        "lam": None if math.isinf(LAMBDAS[j]) else float(LAMBDAS[j]),
        "full_accuracy": float(reference.mean()),
        "accuracy_vs_full": paired_bootstrap(right, reference),
        "loss": float((reference.astype(bool) & ~replay.correct[:, j]).mean()),
        "cot_fraction": paired_bootstrap(replay.cot[:, j], full.cot[:, f], statistic="ratio"),
        "all_fraction": paired_bootstrap(replay.tokens[:, j], full.tokens[:, f], statistic="ratio"),
    }
    if stops is not None:  # the recalibrated stop-time confidence
        mapped, right = stops
        out["confidence_at_stop_recalibrated"] = float(mapped.mean()) if right.size else math.nan
        out["ece_at_stop_recalibrated"] = ece(mapped, right) if right.size else math.nan
    return out


def pruned_cause(groups, streams, targets) -> dict:
    """Of the chains a rule pruned, the share whose unpruned run would have ended on full decoding's output class
    and the share that held it when pruned: what pruning them gave up."""
    ended_on = held = total = 0
    for g, s, target in zip(groups, streams, targets):
        for n in np.flatnonzero(s.cut < g.seq_len):
            mine = np.flatnonzero(g.sequence == n)
            kept = mine[s.keep[mine]]
            total += 1
            ended_on += int(g.klass[mine[np.argmax(g.step[mine])]] == target)
            held += int(kept.size > 0 and g.klass[kept[np.argmax(g.step[kept])]] == target)
    return {
        "pruned_chains": total,
        "would_end_on_output": ended_on / max(total, 1),
        "held_output_when_pruned": held / max(total, 1),
    }


def parse_rule(text: str, regret: RegretHead | None = None) -> PruneRule:
    """A `PruneRule` from ``name=value,...`` (e.g. ``steady=2,min_answers=6``; ``regret=0.02`` adds the regret
    clause with the weights of `regret`, a fitted `RegretHead`)."""
    fields = {}
    for part in text.split(","):
        name, value = part.split("=")
        fields[name] = int(value) if name in ("steady", "min_answers") else float(value)
    threshold = fields.pop("regret", None)
    if threshold is None:
        return PruneRule(**fields)
    if regret is None:
        raise ValueError(f"{text!r} has the regret clause: pass --regret-head (research/fit_regret.py)")
    return regret.rule(threshold, PruneRule(**fields))


def scored_groups(verifier_dir, data_dir, max_problems=None):
    """``(verifier, head, groups, scorer, scores)``: the verifier saved in `verifier_dir`, its stop head, the groups of
    `data_dir` at the head's N (the first `max_problems`), a `MSVGroupScorer` and every group's full scores."""
    verifier = MSVVerifier.from_pretrained(verifier_dir).eval()
    head = StopHead.of(verifier.config)
    assert head is not None, "a verifier with a fitted stop head"
    head = head.at(
        math.inf
    )  # the plain head: these figures are the certified λ's and above, where a floor below a switch is off
    groups = load_replay_groups(data_dir, head.num_chains, max_problems)
    scorer = MSVGroupScorer(verifier)
    return verifier, head, groups, scorer, scorer(groups, [np.ones(g.sequence.size, bool) for g in groups])


def read_regret(path) -> RegretHead | None:
    """The `RegretHead` written by research/fit_regret.py (None without a path)."""
    return None if path is None else RegretHead.from_dict(json.loads(open(path).read()))


CURVE_LAMBDAS = (math.inf, 0.999, 0.995, 0.99, 0.988, 0.986, 0.984, 0.982, 0.98, 0.97, 0.95)


def calibration_curve(replay: PrunedReplay, off: PrunedReplay, epsilon: float, level: float) -> list[dict]:
    """The Learn-then-Test record of one rule on the calibration problems at a few λ: losses against full decoding,
    the p-value, the losses the test tolerates at its level, tokens as fractions of full decoding's."""
    from scipy.stats import binom

    f = LAMBDAS.size - 1
    reference = off.correct[:, f]
    n = reference.size
    tolerated = int(binom.ppf(level, n, epsilon)) - (binom.cdf(int(binom.ppf(level, n, epsilon)), n, epsilon) > level)
    rows = []
    for lam in CURVE_LAMBDAS:
        j = lambda_index(lam)
        losses = int((reference & ~replay.correct[:, j]).sum())
        rows.append(
            {
                "lam": None if math.isinf(lam) else lam,
                "losses": losses,
                "tolerated": int(tolerated),
                "p_value": float(binom.cdf(losses, n, epsilon)),
                "accuracy": float(replay.correct[:, j].mean()),
                "cot_fraction": float(replay.cot[:, j].mean() / off.cot[:, f].mean()),
                "all_fraction": float(replay.tokens[:, j].mean() / off.tokens[:, f].mean()),
            }
        )
    return rows


def run_rule(rule, head, groups, scorer, scores) -> tuple[PrunedReplay, list]:
    streams = replay_pruning(rule, head, groups, scorer, scores)
    return sweep_groups(groups, streams, head), streams


# Measured on the evaluation problems beside the candidates, never certified: the verifier's ruled-out clause.
ALTERNATIVES = (PruneRule(doubt=0.1, lead=0.5), PruneRule(doubt=0.05, lead=0.9), PruneRule(steady=2))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", required=True)
    parser.add_argument(
        "--calibration-dir", required=True, nargs="+", help="problems the stop head was not fitted on (pooled)"
    )
    parser.add_argument("--eval-dir", required=True, nargs="+", help="new problems (one or more collections, pooled)")
    parser.add_argument("--epsilon", type=float, default=0.01)
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--output", default=None)
    parser.add_argument("--also-epsilon", type=float, default=None, help="certify at a second ε on the same replays")
    parser.add_argument("--loss", default="paired", choices=("paired", "net"), help="the guarantee's loss")
    parser.add_argument("--no-alternatives", action="store_true", help="skip the uncertified alternatives")
    parser.add_argument("--max-problems", type=int, default=None, help="a quick run on the first problems")
    parser.add_argument(
        "--store", action="store_true", help="store the certified pair in --verifier's config (`store_pruning`)"
    )
    parser.add_argument(
        "--rules", nargs="+", default=None, help="candidate rules besides no pruning, e.g. steady=2,min_answers=6"
    )
    parser.add_argument("--regret-head", default=None, help="the RegretHead JSON of research/fit_regret.py")
    args = parser.parse_args(argv)
    regret = read_regret(args.regret_head)
    rules = PRUNE_CANDIDATES if args.rules is None else (PRUNE_OFF, *(parse_rule(r, regret) for r in args.rules))
    start = time.time()
    verifier = MSVVerifier.from_pretrained(args.verifier).eval()
    head = StopHead.of(verifier.config)
    stop_only = LambdaChoice.of(verifier.config)
    assert head is not None and stop_only is not None, "a verifier with a fitted stop head and λ"
    head = head.at(
        math.inf
    )  # the plain head: these figures are the certified λ's and above, where a floor below a switch is off
    n = head.num_chains  # the N the stop head was fitted at (an MSV_M reads N > M chains in subgroups of M)
    scorer = MSVGroupScorer(verifier)

    calibration = load_replay_groups(args.calibration_dir, n, args.max_problems)
    cal_scores = scorer(calibration, [np.ones(g.sequence.size, bool) for g in calibration])
    fit, cal_replays = fit_pruning(
        rules, head, calibration, scorer, args.epsilon, args.delta, scores=cal_scores, loss=args.loss
    )
    print(f"calibration done in {time.time() - start:.0f}s: {fit.rule.describe()}, λ = {fit.choice.choice.lam}")
    if args.store and not fit.rule.off:  # what fit_shipped_pruning stores, from these replays
        store_pruning(args.verifier, fit.config_entry())
    cal_off = cal_replays[0]

    groups = load_replay_groups(args.eval_dir, n, args.max_problems)
    scores = scorer(groups, [np.ones(g.sequence.size, bool) for g in groups])
    replays, streams = zip(*(run_rule(r, head, groups, scorer, scores) for r in rules))
    full = replays[0]
    f = LAMBDAS.size - 1
    candidates = []
    for i, rule in enumerate(rules):
        lam = fit.choice.cheapest[i]
        row = {"rule": rule.to_dict(), "describe": rule.describe(), "certified_lambda": lam}
        if lam is not None:
            row["calibration"] = operating_point(cal_replays[i], lambda_index(lam), cal_off)
            row["evaluation"] = operating_point(replays[i], lambda_index(lam), full)
        row["evaluation_at_stop_only_lambda"] = operating_point(replays[i], lambda_index(stop_only.lam), full)
        row["evaluation_no_stop"] = operating_point(replays[i], f, full)
        row["rescorings_per_group"] = float(np.mean([s.rescorings for s in streams[i]]))
        row["calibration_curve"] = calibration_curve(
            cal_replays[i], cal_off, args.epsilon, fit.choice.delta_per_setting
        )
        candidates.append(row)
        print(json.dumps({k: row[k] for k in ("describe", "certified_lambda")}), flush=True)

    chosen = rules.index(fit.rule) if fit.rule in rules else 0
    j = lambda_index(fit.choice.choice.lam)
    deployed_stops = None
    if fit.confidence_map is not None:
        deployed_stops = mapped_stops(groups, streams[chosen], head, float(LAMBDAS[j]), fit.confidence_map)
    deployed = operating_point(replays[chosen], j, full, deployed_stops)
    targets = full_output_classes(groups, head, streams[0])
    for i, row in enumerate(candidates):
        row["cause"] = pruned_cause(groups, streams[i], targets)
    alternatives = []
    for rule in ALTERNATIVES if args.rules is None and not args.no_alternatives else ():
        replay, alt_streams = run_rule(rule, head, groups, scorer, scores)
        alternatives.append(
            {
                "rule": rule.to_dict(),
                "describe": rule.describe(),
                "evaluation_at_stop_only_lambda": operating_point(replay, lambda_index(stop_only.lam), full),
                "evaluation_no_stop": operating_point(replay, f, full),
                "cause": pruned_cause(groups, alt_streams, targets),
            }
        )
        print(json.dumps({"alternative": rule.describe()}), flush=True)

    also = None
    if args.also_epsilon is not None:
        fit2, _ = fit_pruning(
            rules, head, calibration, scorer, args.also_epsilon, args.delta, replays=cal_replays, loss=args.loss
        )
        chosen2 = rules.index(fit2.rule) if fit2.rule in rules else 0
        j2 = lambda_index(fit2.choice.choice.lam)
        stops2 = None
        if fit2.confidence_map is not None:
            stops2 = mapped_stops(groups, streams[chosen2], head, float(LAMBDAS[j2]), fit2.confidence_map)
        also = {
            "epsilon": args.also_epsilon,
            "fit": {"describe": fit2.rule.describe(), "lambda": fit2.choice.choice.to_dict()},
            "cheapest": list(fit2.choice.cheapest),
            "calibration": operating_point(cal_replays[chosen2], lambda_index(fit2.choice.choice.lam), cal_off),
            "deployed": operating_point(replays[chosen2], j2, full, stops2),
        }
        print(json.dumps({"also": also["fit"]}), flush=True)

    # The ceiling: a pruner that knows full decoding's output class, with the same stop.
    oracle_streams = [
        replay_pruning(oracle_decision(g, t), head, [g], scorer, [s])[0] for g, t, s in zip(groups, targets, scores)
    ]
    oracle = sweep_groups(groups, oracle_streams, head)
    ceiling = {
        "at_deployed_lambda": operating_point(oracle, j, full),
        "no_stop": operating_point(oracle, f, full),
    }
    out = {
        "command": "python research/pruning_study.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "epsilon": args.epsilon,
        "delta": args.delta,
        "num_chains": n,
        "calibration_problems": len(calibration),
        "evaluation_problems": len(groups),
        "procedure": fit.choice.procedure,
        "loss": args.loss,
        "delta_per_rule": fit.choice.delta_per_setting,
        "fit": {
            "rule": fit.rule.to_dict(),
            "describe": fit.rule.describe(),
            "lambda": fit.choice.choice.to_dict(),
            "config_entry": fit.config_entry(),
        },
        "deployed": deployed,
        "stop_only": operating_point(full, lambda_index(stop_only.lam), full),
        "candidates": candidates,
        "alternatives": alternatives,
        "also_epsilon": also,
        "ceiling": ceiling,
        "seconds": time.time() - start,
    }
    if args.output:
        with open(args.output, "w") as handle:
            json.dump(json_safe(out), handle, indent=1)
            handle.write("\n")
    print(json.dumps({k: out[k] for k in ("fit", "deployed", "stop_only")}, default=float))
    return out


def full_chosen(groups, head, streams) -> list[int]:
    """Full decoding's output answer of each group (no pruning, no stop)."""
    from hf_msv.training.pruned_replay import sweep_group

    return [int(sweep_group(g, s, head, [np.inf]).chosen[0]) for g, s in zip(groups, streams)]


def full_output_classes(groups, head, streams) -> list[int]:
    """The class of full decoding's output answer in each group."""
    return [int(g.klass[c]) for g, c in zip(groups, full_chosen(groups, head, streams))]


if __name__ == "__main__":
    main()
