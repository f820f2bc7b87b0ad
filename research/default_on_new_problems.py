"""A verifier's stored default (the certified stop, and pruning rule when it has one) on new problems
(docs/pruning.md).

Reads what `MSVEarlyStop.from_verifier` deploys (λ, pruning rule, stop-time confidence map) and `prune=False`'s
stop alone, replays both exactly on the problems of ``--eval-dir`` (`replay_pruning`, `sweep_groups`) and reports
them against full decoding (no pruning, no stop): accuracy with its paired interval, CoT and all tokens as
fractions with ratio intervals, the share of problems that stop, and at the stops the reported confidence against
accuracy: ECE (10 bins), the mean gap with its bootstrap interval, and the ECE a perfectly calibrated confidence
with the same values would show on as many stops (the estimator's floor: labels drawn from the confidences).
Several ``--eval-dir`` collections are pooled into one set of problems. Last line: JSON (also written to
``--output``).

    python research/default_on_new_problems.py --verifier hf_msv/testbed/verifier --eval-dir runs/eval768
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
from hf_msv.lambda_rule import LAMBDAS, lambda_index
from hf_msv.metrics import bootstrap_interval, ece
from hf_msv.pruning import PRUNE_OFF
from hf_msv.training.pruned_replay import replay_pruning, sweep_groups
from research.pruning_study import mapped_stops, operating_point, report, scored_groups  # the pruning study's figures


def stop_calibration(confidence: np.ndarray, right: np.ndarray, draws: int = 400, seed: int = 0) -> dict:
    """The reported confidence at the stops against their accuracy, beside the ECE of a calibrated confidence."""
    if confidence.size == 0:
        return {"stops": 0}
    rng = np.random.default_rng(seed)
    floor = [ece(confidence, rng.random(confidence.size) < confidence) for _ in range(draws)]
    return {
        "stops": int(confidence.size),
        "confidence": float(confidence.mean()),
        "accuracy": float(right.mean()),
        "gap": bootstrap_interval(lambda idx: float((confidence - right)[idx].mean()), confidence.size),
        "ece": ece(confidence, right),
        "ece_if_calibrated": {"mean": float(np.mean(floor)), "p10_p90": np.percentile(floor, [10, 90]).tolist()},
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", required=True)
    parser.add_argument("--eval-dir", required=True, nargs="+", help="problems none of the rule's fits read (one or "
                        "more collections, pooled)")  # fmt: skip
    parser.add_argument("--max-problems", type=int, default=None)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    verifier, head, groups, scorer, scores = scored_groups(args.verifier, args.eval_dir, args.max_problems)
    off_streams = replay_pruning(PRUNE_OFF, head, groups, scorer, scores)
    off = sweep_groups(groups, off_streams, head)
    eval_dir = args.eval_dir[0] if len(args.eval_dir) == 1 else args.eval_dir
    out = {"eval_dir": eval_dir, "problems": len(groups), "num_chains": head.num_chains}
    for name, prune in (("default", True), ("stop_alone", False)):
        criterion = MSVEarlyStop.from_verifier(verifier, prune=prune)
        rule = criterion.prune or PRUNE_OFF
        streams = off_streams if rule.off else replay_pruning(rule, head, groups, scorer, scores)
        replay = off if rule.off else sweep_groups(groups, streams, head)
        j = lambda_index(math.inf if criterion.threshold is None else criterion.threshold)
        stops = mapped_stops(groups, streams, head, float(LAMBDAS[j]), criterion.confidence_map)
        point = operating_point(replay, j, off, stops if criterion.confidence_map is not None else None)
        calibration = stop_calibration(*stops)
        out[name] = {"rule": rule.describe(), "lam": criterion.threshold, **point, "stop_calibration": calibration}
        print(json.dumps({"which": name, "rule": rule.describe(), "lam": criterion.threshold}), flush=True)
    return report(out, args.output)


if __name__ == "__main__":
    main()
