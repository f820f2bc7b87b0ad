"""Which stop-time confidence map stays calibrated on new problems? (docs/pruning.md)

The shipped map is fitted on the calibration problems' stops at the deployed pair. This replays the verifier's
default (its certified pruning rule at its λ) on the calibration problems and on new ones, fits on the calibration
stops each map of `MAPS` (`hf_msv.stop_rules.ConfidenceMap`: Platt scaling of the stop head's confidence, weighing
the chosen class's stop features or not, with an isotonic step or not), and reports, on the new problems' stops,
each map's mean confidence, the stops' accuracy, the ECE (beside the ECE a calibrated confidence spread like the
map's would show) and the log loss. A user picks among them without the new problems, by the maps' cross-fitted
figures on the calibration stops: ``chosen`` by log loss, ``chosen_by_ece`` by ECE. Several directories of either
kind are pooled. Last line: JSON (also written to ``--output``).

    python research/stop_confidence_features.py --verifier hf_msv/testbed/verifier \
        --calibration-dir runs/pool --eval-dir runs/eval768
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `import research.…`

from hf_msv import MSVEarlyStop, MSVVerifier
from hf_msv.metrics import nll as log_loss
from hf_msv.pruning import PRUNE_OFF
from hf_msv.stop_rules import ConfidenceMap
from hf_msv.training.confidence_map import CONFIDENCE_MAPS, choose_confidence_map
from hf_msv.training.pruned_replay import deployed_stops
from research.default_on_new_problems import stop_calibration
from research.pruning_study import report, scored_groups

MAPS = CONFIDENCE_MAPS  # the candidates `fit_stop_confidence` chooses among


def collected_ids(data_dir) -> list[str]:
    """The problem ids a collection holds (its rank indexes)."""
    ranks = sorted(Path(data_dir).glob("index-r*.json"))
    return [i for r in ranks for ids in json.loads(r.read_text())["shards"].values() for i in ids]


def testbed_problems(problem_ids) -> dict[str, tuple]:
    """What makes each testbed problem of `problem_ids` (``source/split/seed/index``) what it is: its arithmetic and
    distractor (two seeds of one split can draw the same)."""
    from hf_msv.testbed.task_v2 import generate_problems

    runs: dict[tuple[str, int], int] = {}
    for i in problem_ids:
        _, split, seed, index = i.rsplit("/", 3)
        runs[split, int(seed)] = max(runs.get((split, int(seed)), 0), int(index) + 1)
    drawn = {key: generate_problems(key[0], n, seed=key[1]) for key, n in runs.items()}
    out = {}
    for i in problem_ids:
        _, split, seed, index = i.rsplit("/", 3)
        problem = drawn[split, int(seed)][int(index)]
        out[i] = problem.meta["canonical"], str(problem.meta["distractor"])
    return out


def shared_problems(calibration_dirs, eval_dirs) -> frozenset[str]:
    """Ids of calibration problems whose testbed problem also occurs among the new problems: left out of the fits."""
    ids = lambda dirs: [i for d in dirs for i in collected_ids(d)]
    new = set(testbed_problems(ids(eval_dirs)).values())
    return frozenset(i for i, problem in testbed_problems(ids(calibration_dirs)).items() if problem in new)


def stops(verifier_dir, data_dir, max_problems=None, prune: bool = True, leave_out=frozenset()) -> dict:
    """The default's stops on `data_dir` (`prune=False`: the stop alone's), without the problems of `leave_out`:
    (S,) reported confidence, (S, F) stop-time features, (S,) right."""
    verifier, head, groups, scorer, scores = scored_groups(verifier_dir, data_dir, max_problems)
    kept = [k for k, g in enumerate(groups) if g.problem_id not in leave_out]
    groups, scores = [groups[k] for k in kept], [scores[k] for k in kept]
    criterion = MSVEarlyStop.from_verifier(verifier, prune=prune)
    if criterion.threshold is None:
        raise SystemExit(f"{verifier_dir} certified no stop: there are no stops to map")
    rule = criterion.prune or PRUNE_OFF
    conf, right, features = deployed_stops(head, criterion.threshold, groups, scorer, rule, scores)
    return {
        "problems": len(groups),
        "confidence": conf,
        "features": features,
        "right": right.astype(np.float64),
        "stored": criterion.confidence_map,
    }


def cached(args, data_dir, leave_out=frozenset()) -> dict:
    """`stops` of `data_dir`, kept in ``--cache`` (one .npz per directory and set of problems left out, for one
    verifier) to try other maps without a replay."""
    if args.cache is None:
        return stops(args.verifier, data_dir, args.max_problems, not args.stop_alone, leave_out)
    tag = ("-stop-alone" if args.stop_alone else "") + (f"-without-{_digest(leave_out)}" if leave_out else "")
    path = Path(args.cache) / (Path(data_dir).resolve().name + tag + ".npz")
    if not path.is_file():
        out = stops(args.verifier, data_dir, args.max_problems, not args.stop_alone, leave_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **{k: v for k, v in out.items() if isinstance(v, np.ndarray)}, problems=out["problems"])
    verifier = MSVVerifier.from_pretrained(args.verifier)
    d = np.load(path)
    keys = ("confidence", "features", "right")
    return {k: d[k] for k in keys} | {
        "problems": int(d["problems"]),
        "stored": MSVEarlyStop.from_verifier(verifier, prune=not args.stop_alone).confidence_map,
    }


def _digest(ids) -> str:
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:12]


def pooled(args, dirs, leave_out=frozenset()) -> dict:
    """`cached` stops of every directory of `dirs`, concatenated."""
    parts = [cached(args, d, leave_out & frozenset(collected_ids(d))) for d in dirs]
    out = {k: np.concatenate([p[k] for p in parts]) for k in ("confidence", "features", "right")}
    return out | {"problems": sum(p["problems"] for p in parts), "stored": parts[0]["stored"]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", required=True)
    parser.add_argument("--calibration-dir", required=True, nargs="+", help="the problems the maps are fitted on")
    parser.add_argument("--eval-dir", required=True, nargs="+", help="problems none of the fits read")
    parser.add_argument("--max-problems", type=int, default=None)
    parser.add_argument("--stop-alone", action="store_true", help="the stop alone's stops (prune=False)")
    overlap = "leave out of the fits the testbed calibration problems a new problem repeats (seeds can draw one twice)"
    parser.add_argument("--testbed-overlap", action="store_true", help=overlap)
    parser.add_argument("--cache", default=None, help="a directory keeping each directory's stops")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    shared = shared_problems(args.calibration_dir, args.eval_dir) if args.testbed_overlap else frozenset()
    cal = pooled(args, args.calibration_dir, shared)
    new = pooled(args, args.eval_dir)
    if cal["right"].size < 10 or not new["right"].size:
        raise SystemExit(f"too few stops to fit and score a map: {cal['right'].size} and {new['right'].size}")
    out = {"calibration": {"problems": cal["problems"], "stops": int(cal["right"].size), "left_out": sorted(shared)}}
    out["maps"] = {}
    out["evaluation"] = {"problems": new["problems"], "stops": int(new["right"].size)}
    # Chosen as a user would choose, without the new problems: `choose_confidence_map` (cross-fitted log loss).
    chosen, choice = choose_confidence_map(cal["confidence"], cal["right"], cal["features"])
    for name, (columns, isotonic) in MAPS.items():
        cmap = ConfidenceMap.fit(cal["confidence"], cal["right"], cal["features"], columns, isotonic)
        mapped = cmap(new["confidence"], new["features"])
        out["maps"][name] = {
            "map": cmap.to_dict(),
            "calibration_crossfit": choice.to_dict()["crossfit"][name],
            "evaluation": stop_calibration(mapped, new["right"]) | {"log_loss": log_loss(mapped, new["right"])},
        }
        print(json.dumps({"map": name, "ece": out["maps"][name]["evaluation"]["ece"]}), flush=True)
    assert out["maps"][choice.chosen]["map"] == chosen.to_dict()
    out["chosen"] = choice.chosen
    out["chosen_by_ece"] = min(choice.crossfit, key=lambda name: choice.crossfit[name][1])
    out["reported"] = stop_calibration(new["confidence"], new["right"])
    if new["stored"] is not None:  # what the verifier ships, fitted on its own calibration collection
        stored = new["stored"](new["confidence"], new["features"])
        out["stored"] = {"map": new["stored"].to_dict(), "evaluation": stop_calibration(stored, new["right"])}
    return report(out, args.output)


if __name__ == "__main__":
    main()
