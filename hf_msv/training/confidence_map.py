"""Choosing the stop-time confidence map on the calibration stops (docs/pruning.md, "Stop-time confidence").

A `ConfidenceMap` is fitted on the stops of calibration problems; which kind of map (what it weighs beside the stop
head's confidence, and whether an isotonic step follows) is chosen on the same stops by cross-fitting, so that the
choice reads no problem the evaluation reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..metrics import ece, nll
from ..stop_rules import STOP_TIME_FEATURES, ConfidenceMap

__all__ = ["CONFIDENCE_MAPS", "MapChoice", "choose_confidence_map"]

# The candidates: which `STOP_TIME_FEATURES` a map weighs beside the head's confidence (its indices), and whether an
# isotonic step follows the Platt scaling. Fixed before the maps were compared on new problems (docs/pruning.md).
CONFIDENCE_MAPS: dict[str, tuple[tuple[int, ...], bool]] = {
    "confidence alone": ((), False),
    "+ support, answered": ((1, 2), False),
    "+ every class feature": ((0, 1, 2, 3, 4, 5), False),
    "+ every class feature, classes, stop time": (tuple(range(len(STOP_TIME_FEATURES))), False),
    "confidence alone, isotonic step": ((), True),
    "+ support, answered, isotonic step": ((1, 2), True),
}


@dataclass(frozen=True)
class MapChoice:
    """What `choose_confidence_map` measured.

    Args:
        chosen: the chosen candidate's name.
        stops: how many calibration stops.
        crossfit: each candidate's cross-fitted ``(log loss, ECE)``.
    """

    chosen: str
    stops: int
    crossfit: dict[str, tuple[float, float]]

    def to_dict(self) -> dict:
        crossfit = {name: {"log_loss": loss, "ece": error} for name, (loss, error) in self.crossfit.items()}
        return {"chosen": self.chosen, "stops": self.stops, "crossfit": crossfit}


def choose_confidence_map(
    confidence, correct, features, candidates=None, folds: int = 5, repeats: int = 10, seed: int = 0
) -> tuple[ConfidenceMap, MapChoice]:
    """The candidate map of lowest log loss cross-fitted on the calibration stops, fitted on all of them.

    Each of `repeats` random splits of the stops into `folds` maps every fold by the map fitted on the others; a
    candidate's figure is the mean over the splits. Log loss (a proper score) chooses: it rewards sharpness as well
    as calibration, and on the calibration stops it does not favour the isotonic step's steps for fitting their noise.

    Args:
        confidence: (S,) what the stops reported (unmapped).
        correct: (S,) whether each stop's answer was right.
        features: (S, F) their `STOP_TIME_FEATURES`.
        candidates: ``{name: (columns, isotonic)}`` (default `CONFIDENCE_MAPS`, in order: ties keep the first).
        folds, repeats, seed: the cross-fit.

    Returns:
        ``(map, choice)``: the chosen candidate fitted on every stop, and the `MapChoice`.

    Raises:
        ValueError: fewer than two stops per fold.
    """
    candidates = dict(CONFIDENCE_MAPS if candidates is None else candidates)
    conf, right = np.asarray(confidence, np.float64).reshape(-1), np.asarray(correct, np.float64).reshape(-1)
    x = np.asarray(features, np.float64).reshape(conf.size, -1)
    if conf.size < 2 * folds:
        raise ValueError(f"{conf.size} calibration stops: a confidence map needs at least {2 * folds} to choose")
    rng = np.random.default_rng(seed)
    splits = [rng.permutation(conf.size) % folds for _ in range(repeats)]
    crossfit = {}
    for name, (columns, isotonic) in candidates.items():
        figures = []
        for fold in splits:
            mapped = np.empty(conf.size)
            for f in range(folds):
                part = fold == f
                cmap = ConfidenceMap.fit(conf[~part], right[~part], x[~part], columns, isotonic)
                mapped[part] = cmap(conf[part], x[part])
            figures.append((nll(mapped, right), ece(mapped, right)))
        loss, error = np.mean(figures, 0)
        crossfit[name] = (float(loss), float(error))
    chosen = min(crossfit, key=lambda name: crossfit[name][0])
    columns, isotonic = candidates[chosen]
    cmap = ConfidenceMap.fit(conf, right, x, columns, isotonic)
    return cmap, MapChoice(chosen, int(conf.size), crossfit)
