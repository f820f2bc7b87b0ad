"""Which stopping statistic a streaming MSV should stop on (docs/early_stopping.md, "Choosing the statistic").

On one validation split, cross-fitted over two folds of problems, every candidate statistic is replayed with the
stopping rule (`decide_stop`) over the λ grid: the raw MSV score (the paper's rule), the stop head fitted on every
answer, the stop head refitted on leader events (the default), and the field's training-free rules. Printed per
statistic: full-decoding accuracy, the best accuracy at 30 / 50 / 70 % of full decoding's tokens, the target rule's
λ (0.95 × full decoding) with its tokens and the stop-time calibration, and the guaranteed λ (ε = 2 pp, δ = 0.1).

    python research/stop_rules_study.py --val-dir runs/val [--verifier DIR] [--out stop_rules.json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from hf_msv import MSVVerifier
from hf_msv.data import ShardDataset
from hf_msv.lambda_rule import LAMBDAS, choose_lambda
from hf_msv.stop_rules import FEATURES, fit_stop_head, stop_statistic
from hf_msv.testbed import TESTBED_VERIFIER_DIR
from hf_msv.training.stopping_curve import group_rows, replay_groups, stop_head_features
from hf_msv.training.trainer import validation_predictions

BUDGETS = (0.3, 0.5, 0.7)


def cross_fitted_head(x, labels, structure, fold, rounds: int, num_chains: int) -> np.ndarray:
    """Out-of-fold stop-head statistic: each fold scored by the head fitted on the other."""
    out = np.zeros(len(labels))
    for k in np.unique(fold):
        held = fold == k
        head = fit_stop_head(
            x[~held], labels[~held], structure["group"][~held], structure["end"][~held], num_chains, rounds=rounds
        )
        out[held] = head.predict(x[held])
    return out


def training_free(rule: str, structure: dict, num_chains: int, size: int) -> np.ndarray:
    out = np.zeros(size)
    for rows in group_rows(structure):
        out[rows] = stop_statistic(
            rule, *(structure[k][rows] for k in ("klass", "sequence", "step", "end")), num_chains
        )
    return out


def summarise(replay) -> dict:
    accuracy, tokens = replay.correct.mean(0), replay.tokens.mean(0)
    budget = {f: float(accuracy[tokens <= f * tokens[-1] + 1e-9].max()) for f in BUDGETS}
    target = choose_lambda(LAMBDAS, replay.correct, replay.tokens, replay.problem)
    guarantee = choose_lambda(LAMBDAS, replay.correct, replay.tokens, replay.problem, epsilon=0.02, delta=0.1)
    return {
        "full_accuracy": float(accuracy[-1]),
        "budget_accuracy": budget,
        "target": target.to_dict(),
        "target_at_stop": replay.at_stop(target.lam),
        "guarantee": guarantee.to_dict(),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--val-dir", required=True)
    parser.add_argument("--verifier", default=str(TESTBED_VERIFIER_DIR))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    verifier = MSVVerifier.from_pretrained(args.verifier).eval()
    n = verifier.config.num_sequences
    predictions = validation_predictions(
        verifier, ShardDataset(args.val_dir, num_sequences=n, mode="streaming"), "streaming"
    )
    structure, labels = predictions.structure, predictions.labels
    p = 1.0 / (1.0 + np.exp(-predictions.logits))
    x = stop_head_features(p, structure, n)
    _, fold = np.unique(predictions.problems, return_inverse=True)
    fold %= 2
    stats = {
        "raw MSV score (the paper's rule)": p,
        "stop head, fitted on every answer": cross_fitted_head(x, labels, structure, fold, 0, n),
        "stop head, refitted on leader events (default)": cross_fitted_head(x, labels, structure, fold, 2, n),
    }
    for rule in ("consensus", "adaptive-consistency", "probe-stability"):
        stats[rule] = training_free(rule, structure, n, len(p))
    results = {name: summarise(replay_groups(s, labels, structure, predictions.problems)) for name, s in stats.items()}
    print(f"{len(np.unique(predictions.problems))} validation problems, N = {n}; features {FEATURES}")
    for name, r in results.items():
        t, g, at = r["target"], r["guarantee"], r["target_at_stop"]
        print(
            f"{name:48s} full {r['full_accuracy']:.3f} | at 30/50/70 % "
            + " ".join(f"{v:.3f}" for v in r["budget_accuracy"].values())
            + f" | target λ {t['lam']} acc {t['accuracy']:.3f} tokens {t['tokens'] / t['full_tokens']:.2f}"
            f" stopped {at['stopped']:.2f} acc@stop {at['accuracy']:.3f} conf@stop {at['confidence']:.3f}"
            f" ECE {at['ece']:.3f} | ε=2pp λ {g['lam']} tokens {g['tokens'] / g['full_tokens']:.2f}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print(json.dumps({name: r["budget_accuracy"] for name, r in results.items()}))


if __name__ == "__main__":
    main()
