"""Where a net guarantee's slack comes from: per collection and per λ, the problems a verifier's stored pair (and its
stop alone) loses against full decoding and the problems it gains (docs/pruning.md, "3,072 calibration problems").

The net loss offsets the problems a rule loses (full decoding right, the rule wrong) with those it gains (full
decoding wrong, the rule right). This script replays the stored pruning rule (`MSVEarlyStop.from_verifier`) and the
stop alone over a few λ on each ``--data-dir`` separately, so that the calibration collections' lost and gained
shares can be set beside the evaluation collections'. Each share and the net change have a bootstrap interval over
the collection's problems. One line per collection as it is read; last line: JSON (also written to ``--output``).

    python research/churn_by_collection.py --verifier runs64/msv16-n64-floor3072 \
        --data-dir runs64/cal runs64/cal2 runs64/eval192 runs64/eval576
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `import research.…`

from hf_msv import MSVEarlyStop
from hf_msv.lambda_rule import lambda_index
from hf_msv.metrics import bootstrap_interval
from hf_msv.pruning import PRUNE_OFF
from hf_msv.training.pruned_replay import replay_pruning, sweep_groups
from hf_msv.utils import json_safe
from research.pruning_study import report, scored_groups

LAMBDAS = (0.93, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99)


def churn(correct: np.ndarray, full: np.ndarray, stopped: np.ndarray) -> dict:
    """(P,) a rule's correctness against (P,) full decoding's on the same problems: the net change, the shares lost
    and gained (each with a bootstrap interval over problems) and the share of problems that stop."""
    lost, gained = (full & ~correct).astype(np.float64), (~full & correct).astype(np.float64)
    interval = lambda x: bootstrap_interval(lambda idx: float(x[idx].mean()), x.size)
    return {
        "net": interval(gained - lost),
        "lost": interval(lost),
        "gained": interval(gained),
        "stopped": float(stopped.mean()),
    }


def collection_churn(verifier_dir, data_dir, lambdas=LAMBDAS, max_problems=None) -> dict:
    """`churn` of the stored pair and of the stop alone at each of `lambdas` on the problems of `data_dir`."""
    verifier, head, groups, scorer, scores = scored_groups(verifier_dir, data_dir, max_problems)
    off = sweep_groups(groups, replay_pruning(PRUNE_OFF, head, groups, scorer, scores), head)
    rule = MSVEarlyStop.from_verifier(verifier, prune=True).prune or PRUNE_OFF
    pair = off if rule.off else sweep_groups(groups, replay_pruning(rule, head, groups, scorer, scores), head)
    full = off.correct[:, lambda_index(math.inf)]
    rows = {
        name: {str(lam): churn(replay.correct[:, lambda_index(lam)], full, replay.stopped[:, lambda_index(lam)])
               for lam in lambdas}
        for name, replay in (("pair", pair), ("stop_alone", off))
    }  # fmt: skip
    return {"problems": len(groups), "full_accuracy": float(full.mean()), "rule": rule.describe(), **rows}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", required=True)
    parser.add_argument("--data-dir", required=True, nargs="+", help="collections, each reported on its own")
    parser.add_argument("--lambdas", type=float, nargs="+", default=list(LAMBDAS))
    parser.add_argument("--max-problems", type=int, default=None)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    out = {}
    for data_dir in args.data_dir:
        out[data_dir] = collection_churn(args.verifier, data_dir, args.lambdas, args.max_problems)
        print(json.dumps({"data_dir": data_dir, **json_safe(out[data_dir])}), flush=True)
    return report(out, args.output)


if __name__ == "__main__":
    main()
