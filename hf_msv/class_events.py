"""Class snapshots: the rows every class-level stopping rule (`hf_msv.stop_rules`) is computed on.

At each arrival time t of a group (a time at which some answer becomes available), a *snapshot* holds one row per
equivalence class that some chain's latest answer stands by at t (plus the class of any answer arriving at t), with
that class's values as they are at t. Any arrival can change every class's values, not only the arriving one's:
a chain moving from the runner-up to a third class raises the leader's Adaptive-Consistency value, one more chain
answering changes every class's share of answered chains. A snapshot therefore refreshes every class, and its rows
stay current until the group's next arrival time, when the next snapshot replaces them. The stopping rule
(`hf_msv.generation.decide_stop` with ``snapshots=True``) fires at the first time some current row reaches λ and
outputs the best current row's class.

`class_events` is causal (a snapshot reads only the answers with end ≤ t) and order-free (rows are sorted by time,
then class id; a class's representative answer is fixed by its contents), so ``generate``, vLLM, the evaluation's
replay and training compute the same rows from the same answers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .baselines import arrival_times, logit, steady_classes

__all__ = ["NO_RUNNER_UP", "PROBE_WINDOW", "ClassEvents", "class_events", "snapshot_rows"]

PROBE_WINDOW = 3  # probe stability: a chain's last 3 answers must agree (Dynasor-CoT's default certainty window)
NO_RUNNER_UP = -8.0  # the runner-up's mean logit when no other class has a chain (σ(−8) ≈ 3e-4)


@dataclass(frozen=True)
class ClassEvents:
    """A group's class snapshots; every array has one entry per row (E,), rows sorted by (time, klass).

    Args:
        time: the arrival time t of the row's snapshot.
        klass: the class.
        answer: its representative answer: the class's held answer (a chain's latest) of latest (end, sequence,
            step), else the class's answer arriving at t. A stop on the row outputs it.
        support: chains whose latest answer at t is in the class.
        steady: chains whose last `PROBE_WINDOW` answers at t all are in the class.
        runner_up: the largest support of another class.
        answered: chains with an answer at t.
        features: (E, 6) the stop head's features (`hf_msv.stop_rules.FEATURES`) when scores were given, else None.
    """

    time: np.ndarray
    klass: np.ndarray
    answer: np.ndarray
    support: np.ndarray
    steady: np.ndarray
    runner_up: np.ndarray
    answered: np.ndarray
    features: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.time.size)

    def rows_of_answers(self, klass, end) -> np.ndarray:
        """(A,) the row of each answer's own class at its own arrival time (`snapshot_rows`)."""
        return snapshot_rows(self.time, self.klass, klass, end)


def snapshot_rows(time, klass, at_klass, at_end) -> np.ndarray:
    """The rows of snapshots (`time`, `klass`: (E,), sorted by (time, klass)) holding each (class, time) pair of
    (A,) `at_klass`, `at_end`: each answer's own class at its own arrival (every such row exists).

    Returns:
        (A,) int row indices.
    """
    time, klass = np.asarray(time, np.int64), np.asarray(klass, np.int64)
    at_klass, at_end = np.asarray(at_klass, np.int64).reshape(-1), np.asarray(at_end, np.int64).reshape(-1)
    if at_klass.size == 0:
        return np.zeros(0, np.int64)
    low = min(int(at_klass.min()), int(klass.min(initial=0)))
    width = max(int(at_klass.max()), int(klass.max(initial=0))) - low + 1
    keys = time * width + (klass - low)  # ascending: rows are sorted by (time, klass)
    return np.searchsorted(keys, at_end * width + (at_klass - low))


def _top_two(values: np.ndarray, order: np.ndarray) -> tuple[int, int]:
    """Positions of the first and second entries of `order` (a ranking of `values`' positions); -1 when missing."""
    return (int(order[0]) if order.size else -1), (int(order[1]) if order.size > 1 else -1)


def _snapshot(t, klass, sequence, step, end, by_chain, z, num_chains, window) -> dict:
    """The rows of the snapshot at time t (see `ClassEvents`)."""
    avail = by_chain[end[by_chain] <= t]  # chain-major, then step
    chains, latest, steady_class = steady_classes(avail, sequence, klass, window)
    arriving = np.flatnonzero(end == t)
    classes = np.unique(np.r_[klass[latest], klass[arriving]])
    position = np.searchsorted(classes, klass[latest])
    support = np.bincount(position, minlength=classes.size)
    steady = np.bincount(np.searchsorted(classes, steady_class), minlength=classes.size)
    # The representative: held answers first, then arrivals; within them the latest (end, sequence, step).
    candidates = np.r_[latest, arriving]
    held = np.r_[np.ones(latest.size, bool), np.zeros(arriving.size, bool)]
    rank = np.lexsort((step[candidates], sequence[candidates], end[candidates], held, klass[candidates]))
    last_of_class = np.r_[klass[candidates][rank][1:] != klass[candidates][rank][:-1], True]
    answer = candidates[rank][last_of_class]
    # The largest support of another class: the best unless this class alone holds it.
    by_support = np.argsort(-support, kind="stable")
    best, second = _top_two(support, by_support)
    runner_up = np.where(np.arange(classes.size) == best, support[second] if second >= 0 else 0, support[best])
    rows = {
        "time": np.full(classes.size, t, np.int64),
        "klass": classes,
        "answer": answer,
        "support": support,
        "steady": steady,
        "runner_up": runner_up,
        "answered": np.full(classes.size, chains.size, np.int64),
    }
    if z is not None:
        rows["features"] = _features(classes, position, support, latest, avail, answer, klass, z, num_chains)
    return rows


def _features(classes, position, support, latest, avail, answer, klass, z, num_chains) -> np.ndarray:
    """(C, 6) stop-head features of a snapshot's classes (`hf_msv.stop_rules.FEATURES`)."""
    is_held = support > 0
    mean = np.where(
        is_held, np.bincount(position, weights=z[latest], minlength=classes.size) / np.maximum(support, 1), z[answer]
    )
    best_logit = np.full(classes.size, -np.inf)
    mine = np.isin(klass[avail], classes)
    np.maximum.at(best_logit, np.searchsorted(classes, klass[avail][mine]), z[avail][mine])
    best_logit = np.where(np.isfinite(best_logit), best_logit, z[answer])
    # The runner-up: the held class of highest mean logit other than this one (ties: the lower class id).
    held = np.flatnonzero(is_held)
    first, second = _top_two(mean, held[np.argsort(-mean[held], kind="stable")])
    ru = np.where(np.arange(classes.size) == first, second, first)
    has_ru = ru >= 0
    return np.stack(
        [
            mean,
            support / num_chains,
            np.full(classes.size, latest.size / num_chains),
            np.where(has_ru, mean[np.maximum(ru, 0)], NO_RUNNER_UP),
            np.where(has_ru, support[np.maximum(ru, 0)] / num_chains, 0.0),
            best_logit,
        ],
        1,
    )


def class_events(
    klass, sequence, step, end, num_chains: int, scores=None, times=None, window: int = PROBE_WINDOW
) -> ClassEvents:
    """The class snapshots of one group's answers at each of its arrival times (`ClassEvents`).

    Args:
        klass, sequence, step, end: (A,) ints: equivalence class, chain, answer step within its chain, end time.
        num_chains: N (the features count chains as shares of N).
        scores: (A,) verifier probabilities: adds the stop head's features; `None`: counts only.
        times: the arrival times whose snapshots are needed (default: all); a live caller passes the new ones.
        window: `PROBE_WINDOW` (how many of a chain's latest answers must agree to be steady).

    Returns:
        The `ClassEvents`.

    Raises:
        ValueError: if `window` < 1.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    klass, sequence, step, end = (np.asarray(x, dtype=np.int64).reshape(-1) for x in (klass, sequence, step, end))
    z = None if scores is None else logit(np.asarray(scores, dtype=np.float64).reshape(-1))
    by_chain = np.lexsort((np.arange(klass.size), step, sequence))
    wanted = arrival_times(end) if times is None else np.unique(np.asarray(times, np.int64))
    parts = [_snapshot(int(t), klass, sequence, step, end, by_chain, z, num_chains, window) for t in wanted]
    names = ("time", "klass", "answer", "support", "steady", "runner_up", "answered")
    if not parts:
        empty = {name: np.zeros(0, np.int64) for name in names}
        return ClassEvents(**empty, features=None if z is None else np.zeros((0, 6)))
    columns = {name: np.concatenate([p[name] for p in parts]) for name in names}
    features = None if z is None else np.concatenate([p["features"] for p in parts])
    return ClassEvents(**columns, features=features)
