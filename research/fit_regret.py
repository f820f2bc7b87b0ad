"""Fit the regret clause's statistic on the stop head's own problems (docs/pruning.md).

The statistic (`hf_msv.training.regret.fit_regret`) is fitted on every problem of ``--data-dir``; beside it, a two-fold
check over the problems (fit on one half, score the other): the AUC of the regret against its label and the share of
positives among the rows below a few thresholds. Writes the head (``RegretHead.to_dict``) to ``--output``; last
line: JSON.

    python research/fit_regret.py --verifier runs64/msv16-n64 --data-dir runs64/val128 --output runs64/regret.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from hf_msv.pruning import CHAIN_FEATURES, PRUNE_OFF
from hf_msv.training.pruned_replay import replay_pruning
from hf_msv.training.regret import TARGETS, RegretHead, fit_regret, regret_rows
from hf_msv.utils import json_safe

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `import research.…`
from research.pruning_study import full_output_classes, scored_groups

THRESHOLDS = (0.005, 0.01, 0.02, 0.05, 0.1)


def two_fold(groups, scores, head, target: str = "correct", outputs=None) -> dict:
    """Fit on the even problems and check on the odd ones, and the reverse; the two halves' rows pooled."""
    x, y, g = regret_rows(groups, scores, head, target=target, outputs=outputs)
    predicted = np.empty(y.size)
    for fold in (0, 1):
        train = [i for i in range(len(groups)) if i % 2 == fold]
        part = None if outputs is None else [outputs[i] for i in train]
        fitted = fit_regret([groups[i] for i in train], [scores[i] for i in train], head, target=target, outputs=part)
        rows = g % 2 != fold
        predicted[rows] = fitted.predict(x[rows])
    below = {
        f"{c:g}": {"rows": float((predicted <= c).mean()), "positives": float(y[predicted <= c].mean())}
        for c in THRESHOLDS
        if (predicted <= c).any()
    }
    return {"auc": float(roc_auc_score(y, predicted)), "positive_rate": float(y.mean()), "below": below}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", required=True)
    parser.add_argument("--data-dir", required=True, help="the stop head's own problems")
    parser.add_argument("--output", required=True, help="where the fitted RegretHead is written (JSON)")
    parser.add_argument("--max-problems", type=int, default=None)
    parser.add_argument("--target", choices=TARGETS, default="correct", help="the label (hf_msv.training.regret)")
    args = parser.parse_args(argv)
    _, head, groups, scorer, scores = scored_groups(args.verifier, args.data_dir, args.max_problems)
    outputs = None
    if args.target == "output":  # full decoding's output class, as the ceiling reads it
        off = replay_pruning(PRUNE_OFF, head, groups, scorer, scores)
        outputs = full_output_classes(groups, head, off)
    fitted = fit_regret(groups, scores, head, target=args.target, outputs=outputs)
    with open(args.output, "w") as handle:
        json.dump(fitted.to_dict(), handle, indent=1)
        handle.write("\n")
    RegretHead.from_dict(fitted.to_dict())  # what the candidates' scripts read back
    out = {
        "head": fitted.to_dict(),
        "weights": dict(zip(CHAIN_FEATURES, fitted.coef)),
        "two_fold": two_fold(groups, scores, head, args.target, outputs),
    }
    print(json.dumps(json_safe(out)))
    return out


if __name__ == "__main__":
    main()
