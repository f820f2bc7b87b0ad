"""Choosing pruning candidates on the stop head's own problems (docs/pruning.md).

Each rule is replayed exactly (the MSV re-scores a group after every prune) on problems the stop head was fitted
on, which the guarantee and the evaluation never read, at the verifier's λ and with no stop: accuracy, the loss
1[full decoding right ∧ output wrong], the net drop, CoT and all tokens as fractions of full decoding's, chains
pruned per group. Last line: JSON (also written to ``--output``).

Besides `PruneRule`'s clauses, a rule may add a *crowd* clause (``crowd=K,crowd_confidence=C``), measured here and
not in the library: prune a chain still decoding whose held class is held by at least K chains (any status) and has
confidence ≥ C: a redundant chain in a settled class (DeepPrune's target, read from the snapshot).

    python research/pruning_candidates.py --verifier runs64/msv16-n64 --data-dir runs64/val128 \
        --rules steady=2,min_answers=4 steady=2 steady=2,min_answers=4,crowd=16,crowd_confidence=0.8
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from hf_msv.lambda_rule import LAMBDAS, LambdaChoice, lambda_index
from hf_msv.pruning import DECODING, PRUNE_OFF, PruneRule, held_answers, prune_chains
from hf_msv.training.pruned_replay import replay_pruning, sweep_groups

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `import research.…`
from research.pruning_study import parse_rule as library_rule
from research.pruning_study import read_regret, scored_groups


def crowd_decision(rule: PruneRule, crowd: int, confidence: float):
    """`prune_chains(rule, ...)` or the crowd clause (module docstring): a `Decision` for `replay_pruning`."""

    def decide(t, sequence, step, end, klass, row_klass, row_confidence, status):
        out = prune_chains(rule, t, sequence, step, end, klass, row_klass, row_confidence, status)
        status = np.asarray(status)
        held, _ = held_answers(t, sequence, step, end, status.size)
        held_class = np.where(held >= 0, np.asarray(klass)[np.maximum(held, 0)], -1)
        lookup = {int(k): float(c) for k, c in zip(row_klass, row_confidence)}
        conf = np.array([lookup.get(int(k), -np.inf) for k in held_class])
        support = np.array([(held_class == k).sum() if k >= 0 else 0 for k in held_class])
        return out | ((status == DECODING) & (held >= 0) & (support >= crowd) & (conf >= confidence))

    return decide


def parse_rule(text: str, regret=None):
    """``(describe, rule or Decision)`` from ``name=value,...`` (e.g. ``steady=2,min_answers=6``; ``crowd=K`` and
    ``crowd_confidence=C`` add the crowd clause, ``regret=R`` the regret clause of the `RegretHead` `regret`)."""
    parts = [p for p in text.split(",") if not p.startswith("crowd")]
    extra = {n: float(v) for n, v in (p.split("=") for p in text.split(",") if p.startswith("crowd"))}
    rule = library_rule(",".join(parts), regret) if parts else PRUNE_OFF
    crowd = int(extra["crowd"]) if "crowd" in extra else None
    crowd_confidence = extra.get("crowd_confidence", 0.0)
    if crowd is None:
        return rule.describe(), rule
    text = f"a chain whose class {crowd} chains hold at confidence ≥ {crowd_confidence:g}"
    describe = f"prune {text}" if rule.off else f"{rule.describe()}; or {text}"
    return describe, crowd_decision(rule, crowd, crowd_confidence)


def row(replay, full, j: int) -> dict:
    """One rule at λ index j against full decoding (no pruning, λ = ∞)."""
    f = LAMBDAS.size - 1
    right, reference = replay.correct[:, j], full.correct[:, f]
    return {
        "accuracy": float(right.mean()),
        "loss": float((reference & ~right).mean()),
        "net_drop": float(reference.mean() - right.mean()),
        "cot_fraction": float(replay.cot[:, j].mean() / full.cot[:, f].mean()),
        "all_fraction": float(replay.tokens[:, j].mean() / full.tokens[:, f].mean()),
        "pruned_chains": float(replay.pruned[:, j].mean()),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", required=True)
    parser.add_argument("--data-dir", required=True, help="the stop head's own problems")
    parser.add_argument("--rules", nargs="+", required=True, help="rules besides no pruning, e.g. steady=2")
    parser.add_argument("--max-problems", type=int, default=None)
    parser.add_argument("--output", default=None)
    parser.add_argument("--regret-head", default=None, help="the RegretHead JSON of research/fit_regret.py")
    args = parser.parse_args(argv)
    regret = read_regret(args.regret_head)
    verifier, head, groups, scorer, scores = scored_groups(args.verifier, args.data_dir, args.max_problems)
    stop = LambdaChoice.of(verifier.config)
    assert stop is not None, "a verifier with a certified λ"
    j = lambda_index(stop.lam)
    rules = [(PRUNE_OFF.describe(), PRUNE_OFF), *(parse_rule(r, regret) for r in args.rules)]
    full = sweep_groups(groups, replay_pruning(PRUNE_OFF, head, groups, scorer, scores), head)
    rows = []
    for spec, (describe, rule) in zip(["none", *args.rules], rules):
        replay = (
            full
            if rule is PRUNE_OFF
            else sweep_groups(groups, replay_pruning(rule, head, groups, scorer, scores), head)
        )
        rows.append(
            {
                "rule": spec,
                "describe": describe,
                "at_lambda": row(replay, full, j),
                "no_stop": row(replay, full, LAMBDAS.size - 1),
            }
        )
        print(json.dumps({"describe": describe, **rows[-1]["at_lambda"]}), flush=True)
    out = {"data_dir": args.data_dir, "groups": len(groups), "num_chains": head.num_chains, "lam": stop.lam}
    out["rules"] = rows
    if args.output:
        with open(args.output, "w") as fh:
            json.dump(out, fh, indent=1)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
