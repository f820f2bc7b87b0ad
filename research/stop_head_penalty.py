"""How much of the stop head a validation split can fit (docs/early_stopping.md, "How much head the validation
split supports").

The stop head is fitted on validation and applied to evaluation with the λ chosen on validation, for each ridge
penalty on the features beyond the class's best logit: 0 (the unpenalised head), the cross-validated choice
(`choose_stop_penalty`, the default) and ∞ (Platt scaling of the class's best logit at the stop: the raw score's
choices, calibrated). The raw score itself is the paper's rule. Printed per head: full-decoding accuracy, the best
accuracy within 30 / 50 / 70 % of full decoding's tokens, and at the target λ (0.95 × full decoding, chosen on
validation) the accuracy, tokens and stop-time calibration on evaluation. `--subsample K` also refits on K random
validation problems (seeds 0..R-1) to show the small-split regime on a large collection. Last line: JSON.

    python research/stop_head_penalty.py --val-dir runs/val --eval-dir runs/eval [--verifier DIR] \
        [--subsample 32 --repeats 5]
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import torch

from hf_msv import MSVVerifier
from hf_msv.data import ShardDataset
from hf_msv.lambda_rule import LAMBDAS, choose_lambda, lambda_index
from hf_msv.stop_rules import choose_stop_penalty, fit_stop_head
from hf_msv.testbed import TESTBED_VERIFIER_DIR
from hf_msv.training.stopping_curve import replay_groups, stop_head_features
from hf_msv.training.trainer import validation_predictions

BUDGETS = (0.3, 0.5, 0.7)


def split_data(verifier, directory):
    n = verifier.config.num_sequences
    predictions = validation_predictions(
        verifier, ShardDataset(directory, num_sequences=n, mode="streaming"), "streaming"
    )
    p = 1.0 / (1.0 + np.exp(-predictions.logits))
    return predictions, p, stop_head_features(p, predictions.structure, n)


def rows_of(predictions, problems) -> np.ndarray:
    return np.flatnonzero(np.isin(predictions.problems.astype(str), problems))


def sub(predictions, rows):
    return {k: v[rows] for k, v in predictions.structure.items()}, predictions.labels[rows], predictions.problems[rows]


def evaluate(stat_val, stat_eval, val, ev, vrows) -> dict:
    """λ by the target rule on validation (rows `vrows`), applied to evaluation."""
    structure, labels, problems = sub(val, vrows)
    rv = replay_groups(stat_val, labels, structure, problems)
    lam = choose_lambda(LAMBDAS, rv.correct, rv.tokens, rv.problem).lam
    r = replay_groups(stat_eval, ev.labels, ev.structure, ev.problems)
    j = lambda_index(lam)
    accuracy, tokens = r.correct.mean(0), r.tokens.mean(0)
    at = r.at_stop(lam)
    return {
        "full": float(accuracy[-1]),
        "budget": {f: float(accuracy[tokens <= f * tokens[-1] + 1e-9].max()) for f in BUDGETS},
        "lambda": None if math.isinf(lam) else float(lam),
        "accuracy": float(accuracy[j]),
        "tokens": float(tokens[j] / tokens[-1]),
        "stopped": at["stopped"],
        "accuracy_at_stop": at["accuracy"],
        "confidence_at_stop": at["confidence"],
        "ece_at_stop": at["ece"],
    }


def heads(val, xv, ev, xe, pv, pe, vrows, n) -> dict:
    structure, labels, problems = sub(val, vrows)
    x = xv[vrows]
    choice = choose_stop_penalty(x, labels, structure["group"], structure["end"], problems, n)
    out = {}
    for name, penalty in (("head, penalty 0", 0.0), ("head, cross-validated", choice.penalty), ("head, ∞", math.inf)):
        head = fit_stop_head(x, labels, structure["group"], structure["end"], n, penalty=penalty)
        out[name] = evaluate(head.predict(x), head.predict(xe), val, ev, vrows)
    out["raw score"] = evaluate(pv[vrows], pe, val, ev, vrows)
    out["head, cross-validated"]["penalty"] = None if math.isinf(choice.penalty) else choice.penalty
    return out


def show(name: str, r: dict):
    print(
        f"  {name:24s} full {r['full']:.3f} | 30/50/70 % "
        + " ".join(f"{v:.3f}" for v in r["budget"].values())
        + f" | λ {r['lambda']} acc {r['accuracy']:.3f} tokens {r['tokens']:.2f} | stop {r['stopped']:.2f}"
        f" acc {r['accuracy_at_stop']:.3f} conf {r['confidence_at_stop']:.3f} ECE {r['ece_at_stop']:.3f}"
        + (f" | penalty {r['penalty']}" if "penalty" in r else "")
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--val-dir", required=True)
    parser.add_argument("--eval-dir", required=True)
    parser.add_argument("--verifier", default=str(TESTBED_VERIFIER_DIR))
    parser.add_argument("--subsample", type=int, default=0, help="also refit on this many validation problems")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    verifier = MSVVerifier.from_pretrained(args.verifier).eval()
    n = verifier.config.num_sequences
    (val, pv, xv), (ev, pe, xe) = split_data(verifier, args.val_dir), split_data(verifier, args.eval_dir)
    names = np.unique(val.problems.astype(str))
    print(f"{names.size} validation problems, {np.unique(ev.problems).size} evaluation problems, N = {n}")
    results = {"all": heads(val, xv, ev, xe, pv, pe, np.arange(len(pv)), n)}
    print("validation: all problems")
    for name, r in results["all"].items():
        show(name, r)
    for seed in range(args.repeats if args.subsample else 0):
        pick = np.random.default_rng(seed).choice(names, args.subsample, replace=False)
        results[f"subsample {seed}"] = heads(val, xv, ev, xe, pv, pe, rows_of(val, pick), n)
        print(f"validation: {args.subsample} problems, draw {seed}")
        for name, r in results[f"subsample {seed}"].items():
            show(name, r)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
