"""Fitting the regret clause of per-chain pruning (`hf_msv.pruning`): a logistic regression on
`hf_msv.pruning.chain_features` of the chance that pruning the chain now costs something.

A pruned chain keeps its held answer. Three labels (`TARGETS`) say when that costs: ``"correct"``, decoding on would
have turned a wrong held answer into a correct one (the chain's own regret); ``"change"``, the chain's final answer
falls in another class than its held one, so full decoding would have counted it elsewhere (what the group's output can
lose *or* gain by the prune); ``"output"``, a later answer of the chain falls in the class full decoding outputs (the
chains the ceiling, `oracle_decision`, keeps; no gold label is read). The rows are every chain still decoding (with an
answer) at the arrival times of recorded groups decoded in full, read from the class snapshots of the stop head: the
problems the stop head was fitted on, which the guarantee (`fit_pruning`) and the evaluation never read. The clause's
threshold is then one more candidate parameter, certified with λ as the other clauses are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..baselines import fit_logistic, logistic
from ..pruning import CHAIN_FEATURES, DECODING, PRUNE_OFF, PruneRule, chain_features, chain_status, held_answers
from ..schedules import NEVER
from ..stop_rules import StopHead, stop_events
from .pruned_replay import ReplayGroup

__all__ = ["TARGETS", "RegretHead", "fit_regret", "regret_rows"]

TARGETS = ("correct", "change", "output")


@dataclass(frozen=True)
class RegretHead:
    """The fitted regret statistic σ(coef · x + intercept) on `CHAIN_FEATURES` rows, with its training evidence.

    Args:
        coef: one weight per `CHAIN_FEATURES` entry.
        intercept: the bias.
        rows: the chain rows it was fitted on.
        positives: the rows whose label (`target`) is 1.
        groups: the groups the rows come from.
        target: the label it was fitted on (`TARGETS`).
    """

    coef: tuple[float, ...]
    intercept: float
    rows: int = 0
    positives: int = 0
    groups: int = 0
    target: str = "correct"

    def rule(self, threshold: float, base: PruneRule = PRUNE_OFF) -> PruneRule:
        """`base` with the regret clause at `threshold` (prune a chain whose regret ≤ threshold)."""
        return dataclasses.replace(base, regret=threshold, regret_coef=self.coef, regret_intercept=self.intercept)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """(m,) regret of (m, F) `chain_features` rows."""
        return logistic(features, self.coef, self.intercept)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"coef": list(self.coef), "features": list(CHAIN_FEATURES)}

    @classmethod
    def from_dict(cls, d: dict) -> RegretHead:
        """The head written by `to_dict`."""
        if list(d.get("features", CHAIN_FEATURES)) != list(CHAIN_FEATURES):
            raise ValueError("this regret head was fitted on other chain features than CHAIN_FEATURES")
        return cls(
            coef=tuple(float(c) for c in d["coef"]),
            intercept=float(d["intercept"]),
            rows=int(d.get("rows", 0)),
            positives=int(d.get("positives", 0)),
            groups=int(d.get("groups", 0)),
            target=str(d.get("target", "correct")),
        )


def regret_rows(
    groups: Sequence[ReplayGroup],
    scores: Sequence[np.ndarray],
    head: StopHead,
    max_times: int = 48,
    target: str = "correct",
    outputs: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The training rows of the regret statistic on groups decoded in full.

    Args:
        groups: recorded groups (no pruning).
        scores: (A,) the verifier's probabilities of each group's answers.
        head: the stop head whose snapshot confidences the clause reads.
        max_times: arrival times per group at most (evenly spaced over its arrivals): neighbouring times repeat
            nearly the same rows.
        target: the label (`TARGETS`).
        outputs: the class full decoding outputs in each group (needed by ``target="output"``).

    Returns:
        ``(x, y, group)``: (m, F) `chain_features`, (m,) bool label, (m,) the group's index.
    """
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if target == "output" and (outputs is None or len(outputs) != len(groups)):
        raise ValueError("target='output' needs full decoding's output class of every group (outputs)")
    xs, ys, gs = [], [], []
    for g, (group, s) in enumerate(zip(groups, scores)):
        times = np.unique(group.end)
        if times.size > max_times:
            times = times[np.unique(np.linspace(0, times.size - 1, max_times).round().astype(np.int64))]
        ev = stop_events(head, group.klass, group.sequence, group.step, group.end, group.num_chains, s, times=times)
        # The last end of each chain's correct answers: a correct answer still to come after t.
        last_correct = np.full(group.num_chains, -1, np.int64)
        np.maximum.at(last_correct, group.sequence[group.correct], group.end[group.correct])
        # The last end of each chain's answers in full decoding's output class (target "output").
        last_output = np.full(group.num_chains, -1, np.int64)
        if outputs is not None:
            mine = group.klass == outputs[g]
            np.maximum.at(last_output, group.sequence[mine], group.end[mine])
        final, _ = held_answers(int(group.end.max()), group.sequence, group.step, group.end, group.num_chains)
        never = np.full(group.num_chains, NEVER, np.int64)
        for t in times:
            rows = ev.time == t
            status = chain_status(int(t), group.seq_len, never)
            held, _ = held_answers(int(t), group.sequence, group.step, group.end, group.num_chains)
            live = (status == DECODING) & (held >= 0)
            if not live.any():
                continue
            x = chain_features(
                int(t), group.sequence, group.step, group.end, group.klass, ev.klass[rows], ev.confidence[rows], status
            )
            h = np.maximum(held, 0)
            if target == "correct":
                label = ~group.correct[h] & (last_correct > t)
            elif target == "output":
                label = last_output > t
            else:
                label = group.klass[h] != group.klass[np.maximum(final, 0)]
            xs.append(x[live])
            ys.append(label[live])
            gs.append(np.full(int(live.sum()), g))
    if not xs:
        raise ValueError("no chain is still decoding with an answer at any arrival time: nothing to fit on")
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(gs)


def fit_regret(
    groups: Sequence[ReplayGroup],
    scores: Sequence[np.ndarray],
    head: StopHead,
    max_times: int = 48,
    target: str = "correct",
    outputs: Sequence[int] | None = None,
) -> RegretHead:
    """Fit the regret statistic on recorded groups (`regret_rows`; the stop head's own problems).

    Args:
        groups, scores, head, max_times, target, outputs: as `regret_rows`.

    Returns:
        The `RegretHead`.
    """
    x, y, g = regret_rows(groups, scores, head, max_times, target, outputs)
    coef, intercept = fit_logistic(x, y, penalty=1e-3)
    coef = tuple(float(c) for c in coef)
    return RegretHead(coef, float(intercept), int(y.size), int(y.sum()), len(set(g.tolist())), target)
