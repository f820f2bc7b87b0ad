"""Is the stop-time confidence map's optimism on new problems a selection effect of λ? (docs/pruning.md)

The shipped pair's λ and its confidence map were both fitted on the calibration problems. If choosing λ there
selected a λ at which the calibration stops happen to be right (the fixed-sequence test stops where losses are few),
the calibration stops would be more accurate than new problems' stops at that λ, not at the λ around it. This
replays the verifier's certified pruning rule on each directory and reports, per λ, the stops, their mean reported
and mapped confidence and their accuracy. Last line: JSON (also written to ``--output``).

    python research/stop_calibration_by_lambda.py --verifier hf_msv/testbed/verifier --dirs runs/pool runs/eval768
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `import research.…`

from hf_msv import MSVEarlyStop, MSVVerifier
from hf_msv.lambda_rule import LAMBDAS
from hf_msv.pruning import PRUNE_OFF
from hf_msv.stop_rules import StopHead
from hf_msv.training.pruned_replay import MSVGroupScorer, load_replay_groups, replay_pruning, sweep_groups
from research.pruning_study import report

GRID = (0.95, 0.96, 0.97, 0.975, 0.98, 0.985, 0.99)


def by_lambda(replay, mapped, grid=GRID) -> list[dict]:
    """Per λ of `grid`: stops, mean reported and mapped confidence at the stops, their accuracy. `mapped` is the
    same stream swept at the grid's nearest λ with the confidence map (`sweep_groups`), or None (no map)."""
    rows = []
    for k, lam in enumerate(grid):
        j = int(np.argmin(np.abs(LAMBDAS - lam)))  # the nearest grid λ, reported as such
        hit = replay.stopped[:, j]
        reported, right = replay.confidence[hit, j], replay.correct[hit, j].astype(np.float64)
        at = reported if mapped is None else mapped.confidence[mapped.stopped[:, k], k]
        rows.append(
            {
                "lam": float(LAMBDAS[j]),
                "stops": int(right.size),
                "reported": float(reported.mean()) if right.size else None,
                "mapped": float(at.mean()) if right.size else None,
                "accuracy": float(right.mean()) if right.size else None,
            }
        )
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", required=True)
    parser.add_argument("--dirs", nargs="+", required=True, help="the calibration problems, then new ones")
    parser.add_argument("--lambdas", type=float, nargs="+", default=GRID)
    parser.add_argument("--max-problems", type=int, default=None)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    verifier = MSVVerifier.from_pretrained(args.verifier).eval()
    head = StopHead.of(verifier.config)
    assert head is not None, "a verifier with a fitted stop head"
    head = head.at(
        math.inf
    )  # the plain head: these figures are the certified λ's and above, where a floor below a switch is off
    criterion = MSVEarlyStop.from_verifier(verifier)
    rule = criterion.prune or PRUNE_OFF
    scorer = MSVGroupScorer(verifier)
    out = {"rule": rule.describe(), "lam": criterion.threshold, "dirs": {}}
    for directory in args.dirs:
        groups = load_replay_groups(directory, head.num_chains, args.max_problems)
        scores = scorer(groups, [np.ones(g.sequence.size, bool) for g in groups])
        streams = replay_pruning(rule, head, groups, scorer, scores)
        replay = sweep_groups(groups, streams, head)
        mapped = None
        if criterion.confidence_map is not None:
            nearest = [float(LAMBDAS[np.argmin(np.abs(LAMBDAS - lam))]) for lam in args.lambdas]
            mapped = sweep_groups(groups, streams, head, np.array(nearest), criterion.confidence_map)
        rows = by_lambda(replay, mapped, args.lambdas)
        out["dirs"][directory] = {"problems": len(groups), "by_lambda": rows}
        print(json.dumps({directory: out["dirs"][directory]["by_lambda"]}), flush=True)
    return report(out, args.output)


if __name__ == "__main__":
    main()
