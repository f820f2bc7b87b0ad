"""Does a stop-time confidence map that sees the stop's features stay calibrated on new problems? (docs/pruning.md)

The shipped map is Platt scaling of the stop head's confidence alone, fitted on the calibration problems' stops at
the deployed pair. This replays the verifier's default (its certified pruning rule at its λ) on the calibration
problems and on new ones, fits on the calibration stops each map of `MAPS` (`hf_msv.stop_rules.ConfidenceMap` over
the stop head's confidence and the chosen class's stop features at the stop), and reports, on the new problems'
stops, each map's mean confidence, the stops' accuracy, the ECE (beside the ECE a calibrated confidence spread like
the map's would show) and the log loss. The map a user would pick, ``chosen``, is the one of lowest cross-fitted log
loss on the calibration stops. Last line: JSON (also written to ``--output``).

    python research/stop_confidence_features.py --verifier hf_msv/testbed/verifier \
        --calibration-dir runs/pool --eval-dir runs/eval768
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `import research.…`

from hf_msv import MSVEarlyStop, MSVVerifier
from hf_msv.metrics import ece
from hf_msv.pruning import PRUNE_OFF
from hf_msv.stop_rules import ConfidenceMap
from hf_msv.training.pruned_replay import deployed_stops
from hf_msv.utils import json_safe
from research.default_on_new_problems import stop_calibration
from research.pruning_study import scored_groups

# Which stop features each candidate map reads beside the head's confidence (`hf_msv.stop_rules.STOP_TIME_FEATURES`).
MAPS = {
    "confidence alone (the shipped kind)": (),
    "+ support, answered": (1, 2),
    "+ every class feature": (0, 1, 2, 3, 4, 5),
    "+ every class feature, classes, stop time": (0, 1, 2, 3, 4, 5, 6, 7),
}


def stops(verifier_dir, data_dir, max_problems=None) -> dict:
    """The default's stops on `data_dir`: (S,) reported confidence, (S, F) stop-time features, (S,) right."""
    verifier, head, groups, scorer, scores = scored_groups(verifier_dir, data_dir, max_problems)
    criterion = MSVEarlyStop.from_verifier(verifier)
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


def cached(args, data_dir) -> dict:
    """`stops` of `data_dir`, kept in ``--cache`` (one .npz per directory, for one verifier) to try other maps
    without a replay."""
    if args.cache is None:
        return stops(args.verifier, data_dir, args.max_problems)
    path = Path(args.cache) / (Path(data_dir).resolve().name + ".npz")
    if not path.is_file():
        out = stops(args.verifier, data_dir, args.max_problems)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **{k: v for k, v in out.items() if isinstance(v, np.ndarray)}, problems=out["problems"])
    verifier = MSVVerifier.from_pretrained(args.verifier)
    d = np.load(path)
    keys = ("confidence", "features", "right")
    return {k: d[k] for k in keys} | {
        "problems": int(d["problems"]),
        "stored": MSVEarlyStop.from_verifier(verifier).confidence_map,
    }


def log_loss(p: np.ndarray, right: np.ndarray) -> float:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return float(-np.mean(right * np.log(p) + (1 - right) * np.log(1 - p)))


def crossfit(stops: dict, columns, folds: int = 5) -> dict:
    """The map's log loss and ECE on the calibration stops, each fold mapped by the map fitted on the others: what
    picks among `MAPS` without reading the new problems."""
    fold = np.arange(stops["right"].size) % folds
    mapped = np.empty(stops["right"].size)
    for f in range(folds):
        part = fold == f
        cmap = ConfidenceMap.fit(stops["confidence"][~part], stops["right"][~part], stops["features"][~part], columns)
        mapped[part] = cmap(stops["confidence"][part], stops["features"][part])
    return {"log_loss": log_loss(mapped, stops["right"]), "ece": ece(mapped, stops["right"])}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", required=True)
    parser.add_argument("--calibration-dir", required=True, help="the problems the maps are fitted on")
    parser.add_argument("--eval-dir", required=True, help="problems none of the fits read")
    parser.add_argument("--max-problems", type=int, default=None)
    parser.add_argument("--cache", default=None, help="a directory keeping each directory's stops")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    cal = cached(args, args.calibration_dir)
    new = cached(args, args.eval_dir)
    if cal["right"].size < 10 or not new["right"].size:
        raise SystemExit(f"too few stops to fit and score a map: {cal['right'].size} and {new['right'].size}")
    out = {"calibration": {"problems": cal["problems"], "stops": int(cal["right"].size)}, "maps": {}}
    out["evaluation"] = {"problems": new["problems"], "stops": int(new["right"].size)}
    for name, columns in MAPS.items():
        cmap = ConfidenceMap.fit(cal["confidence"], cal["right"], cal["features"], columns)
        mapped = cmap(new["confidence"], new["features"])
        out["maps"][name] = {
            "map": cmap.to_dict(),
            "calibration_crossfit": crossfit(cal, columns),
            "evaluation": stop_calibration(mapped, new["right"]) | {"log_loss": log_loss(mapped, new["right"])},
        }
        print(json.dumps({"map": name, "ece": out["maps"][name]["evaluation"]["ece"]}), flush=True)
    # Chosen as a user would choose, without the new problems: the lowest cross-fitted log loss on calibration.
    out["chosen"] = min(out["maps"], key=lambda name: out["maps"][name]["calibration_crossfit"]["log_loss"])
    out["reported"] = stop_calibration(new["confidence"], new["right"])
    if new["stored"] is not None:  # what the verifier ships, fitted on its own calibration collection
        stored = new["stored"](new["confidence"], new["features"])
        out["stored"] = {"map": new["stored"].to_dict(), "evaluation": stop_calibration(stored, new["right"])}
    out = json_safe(out)
    if args.output:
        Path(args.output).write_text(json.dumps(out, indent=1))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
