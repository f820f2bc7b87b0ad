"""The ceiling of pruning at matched budgets (docs/pruning.md, "The ceiling"): a pruner that knows the answer full
decoding outputs (`oracle_decision`), with the verifier's group stop over the λ grid, on evaluation problems,
against the stop alone and the default (the verifier's certified pruning rule with the same stop); ``--rules`` adds
other pruning rules' curves (`research/pruning_study.py`'s syntax; ``regret=R`` with ``--regret-head``).

Read on the interpolated curves (upper hull, `interpolated_curve`) at 30 / 50 / 70 % of full decoding's CoT tokens,
the way research/default_vs_field.py reads them: the most any pruner can add to the verifier's stop at that budget
on these problems, whatever its statistic. Last line: JSON (also ``--output``).

    python research/budget_ceiling.py --verifier hf_msv/testbed/verifier --data-dir runs/eval768 \
        --output docs/results/budget-ceiling-n16.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `import research.…`

from hf_msv.evaluation.early_stop import interpolated_curve
from hf_msv.evaluation.field_rules import RuleCurve
from hf_msv.pruning import PRUNE_OFF, PruneRule
from hf_msv.training.pruned_replay import oracle_decision, replay_pruning, sweep_groups
from research.default_vs_field import stop_curve
from research.pruning_study import full_output_classes, parse_rule, read_regret, scored_groups

BUDGETS = (0.3, 0.5, 0.7)


def at_budgets(curve: RuleCurve) -> dict:
    hull = interpolated_curve(curve.tradeoff())
    return {f"{b:g}": float(hull.at(b)) for b in BUDGETS}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", required=True)
    parser.add_argument("--data-dir", required=True, nargs="+", help="evaluation problems (one or more, pooled)")
    parser.add_argument("--max-problems", type=int, default=None)
    parser.add_argument("--output", default=None)
    parser.add_argument("--rules", nargs="*", default=(), help="more pruning rules, e.g. regret=0.1,min_answers=2")
    parser.add_argument("--regret-head", default=None, help="the RegretHead JSON of research/fit_regret.py")
    args = parser.parse_args(argv)
    regret = read_regret(args.regret_head)
    extra = {text: parse_rule(text, regret) for text in args.rules}
    verifier, head, groups, scorer, scores = scored_groups(args.verifier, args.data_dir, args.max_problems)
    off = replay_pruning(PRUNE_OFF, head, groups, scorer, scores)
    full = sweep_groups(groups, off, head, [math.inf])
    targets = full_output_classes(groups, head, off)
    oracle = [
        replay_pruning(oracle_decision(g, t), head, [g], scorer, [s])[0] for g, t, s in zip(groups, targets, scores)
    ]
    rule = PruneRule.of(verifier.config)
    curves = {
        "stop alone": stop_curve(groups, head, off, full),
        "default": stop_curve(groups, head, replay_pruning(rule, head, groups, scorer, scores), full),
        "ceiling": stop_curve(groups, head, oracle, full),
    } | {
        text: stop_curve(groups, head, replay_pruning(r, head, groups, scorer, scores), full)
        for text, r in extra.items()
    }
    out = {
        "data_dir": args.data_dir[0] if len(args.data_dir) == 1 else args.data_dir,
        "groups": len(groups),
        "num_chains": head.num_chains,
        "default_rule": rule.describe(),
        "full_accuracy": float(full.correct.mean()),
        "interpolated_accuracy": {name: at_budgets(c) for name, c in curves.items()},
    }
    if args.output:
        Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
