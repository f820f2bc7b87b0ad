"""Does λ chosen on validation transfer to new problems with the stop head that is saved? (docs/early_stopping.md,
"The stop head").

For one streaming MSV, one validation and one evaluation split (groups of the verifier's N), and each λ rule (the
target rule, the guarantee at ε = 2 pp and 1 pp), the λ is chosen two ways and applied on the evaluation split:

* in-sample (the default of `fit_early_stopping`): the head fitted on all of validation, λ chosen on its statistic;
* cross-fitted: λ chosen on the out-of-fold statistic of two heads fitted on halves, then applied with the head
  fitted on all of validation;
* split (Learn-then-Test's learning / calibration split): the head fitted on half the validation problems, λ chosen
  on the other half, for two random halvings.

    python research/stop_lambda_transfer.py --val-dir runs/val --eval-dir runs/eval [--verifier DIR]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from hf_msv import MSVVerifier
from hf_msv.data import ShardDataset
from hf_msv.lambda_rule import LAMBDAS, choose_lambda, lambda_index
from hf_msv.stop_rules import fit_stop_head
from hf_msv.testbed import TESTBED_VERIFIER_DIR
from hf_msv.training.stopping_curve import replay_groups, stop_head_features
from hf_msv.training.trainer import validation_predictions

RULES = {"target 0.95 × full": {}, "ε = 2 pp": {"epsilon": 0.02}, "ε = 1 pp": {"epsilon": 0.01}}


def split_data(verifier, directory):
    n = verifier.config.num_sequences
    predictions = validation_predictions(
        verifier, ShardDataset(directory, num_sequences=n, mode="streaming"), "streaming"
    )
    return predictions, stop_head_features(1.0 / (1.0 + np.exp(-predictions.logits)), predictions.structure, n)


def subset(predictions, x, rows):
    structure = {k: v[rows] for k, v in predictions.structure.items()}
    return x[rows], predictions.labels[rows], structure, predictions.problems[rows]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--val-dir", required=True)
    parser.add_argument("--eval-dir", required=True)
    parser.add_argument("--verifier", default=str(TESTBED_VERIFIER_DIR))
    args = parser.parse_args()
    torch.set_num_threads(1)
    verifier = MSVVerifier.from_pretrained(args.verifier).eval()
    n = verifier.config.num_sequences
    val, xv = split_data(verifier, args.val_dir)
    ev, xe = split_data(verifier, args.eval_dir)
    _, problem = np.unique(val.problems, return_inverse=True)

    def fit(rows):
        x, y, structure, _ = subset(val, xv, rows)
        return fit_stop_head(x, y, structure["group"], structure["end"], n)

    def choose(head, rows, rule, stat=None):
        x, y, structure, problems = subset(val, xv, rows)
        r = replay_groups(head.predict(x) if stat is None else stat[rows], y, structure, problems)
        return choose_lambda(LAMBDAS, r.correct, r.tokens, r.problem, **rule).lam

    def cross_fitted() -> np.ndarray:
        stat = np.zeros(problem.size)
        for k in (0, 1):
            held = problem % 2 == k
            stat[held] = fit(~held).predict(xv[held])
        return stat

    def apply(head, lam) -> str:
        r = replay_groups(head.predict(xe), ev.labels, ev.structure, ev.problems)
        j = lambda_index(lam)
        at = r.at_stop(lam)
        return (
            f"λ {lam}: accuracy {r.correct[:, j].mean():.3f} (full {r.correct[:, -1].mean():.3f}), tokens "
            f"{r.tokens[:, j].mean() / r.tokens[:, -1].mean():.2f}, at the stop {at['stopped']:.2f} stopped, "
            f"accuracy {at['accuracy']:.3f}, confidence {at['confidence']:.3f}"
        )

    everything = np.ones(problem.size, bool)
    print(f"{problem.max() + 1} validation problems, {len(np.unique(ev.problems))} evaluation problems, N = {n}")
    for name, rule in RULES.items():
        head = fit(everything)
        print(f"{name:20s} in-sample | {apply(head, choose(head, everything, rule))}")
        print(f"{name:20s} cross-fit | {apply(head, choose(head, everything, rule, cross_fitted()))}")
        for seed in (0, 1):
            half = np.random.default_rng(seed).permutation(problem.max() + 1)[problem] % 2 == 0
            head = fit(half)
            print(f"{name:20s} split {seed}   | {apply(head, choose(head, ~half, rule))}")


if __name__ == "__main__":
    main()
