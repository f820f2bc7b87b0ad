"""Stopping statistics over a prompt's N chains: what the one stopping rule (`hf_msv.generation.decide_stop`: stop at
the first time the best available statistic reaches λ) is fed besides a verifier's raw score.

Every statistic is a *class* statistic, computed on the group's class snapshots (`hf_msv.class_events`): at
each arrival time, every class's value is refreshed, whichever class arrived, since any arrival can move every class
(a chain leaving the runner-up raises the leader's Adaptive-Consistency value). Each is causal (a snapshot reads the
answers with end ≤ t), so the same rows come out live in ``generate``, on vLLM, in the offline replay and in
training (`stop_events`). Each counts *every* chain of the prompt, so a lone early answer cannot look like a
consensus. The training-free rules are `STOP_RULES` (k-of-N consensus, Adaptive-Consistency, probe stability);
`StopHead` is the verifier's rule, two logistic regressions on the class's mean and best verifier logits, its
support among the N chains, the share of chains that have answered and the runner-up class's mean logit and
support (`FEATURES`): the *statistic* the stop fires on, P(stopping on the class loses nothing against full
decoding: the class is correct, or full decoding's answer is wrong), and the *confidence*, P(the class is
correct), which picks the output at the stop (`decide_stop`'s ``select``) and is what `MSVResult.confidence`
reports. Both are fitted on validation snapshots and refitted on the statistic's leader events (`fit_stop_rule`).
Design and measurements: ``docs/early_stopping.md``.

`stop_statistic`, `consensus_share`, `adaptive_consistency`, `probe_stability` and `stop_features` are per-answer
views (each answer's class at its own arrival, what `MSVAnswer.score` shows); they take ``only`` (indices of the
answers whose values are needed; the others are left at 0).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from .baselines import arrival_times, chain_support, fit_logistic, logistic, logit
from .class_events import PROBE_WINDOW, ClassEvents, class_events, snapshot_rows
from .errors import UserError

__all__ = [
    "ConfidenceMap",
    "FEATURES",
    "FLOOR_SCALE",
    "STOP_PENALTIES",
    "PenaltyChoice",
    "STOP_RULES",
    "STOP_TIME_FEATURES",
    "STOP_STATISTICS",
    "StopEvents",
    "StopHead",
    "StopRuleFit",
    "adaptive_consistency",
    "choose_stop_penalty",
    "chain_support",
    "consensus_share",
    "fit_stop_head",
    "fit_stop_rule",
    "no_loss_labels",
    "leader_events",
    "probe_stability",
    "current_leaders",
    "running_argmax",
    "stop_events",
    "stop_features",
    "stop_statistic",
    "stop_time_features",
]


@dataclass(frozen=True)
class StopEvents:
    """A stopping statistic over a group's class snapshots (`hf_msv.class_events.ClassEvents`), what the stop rule
    reads (`hf_msv.generation.decide_stop` with ``snapshots=True``); every array (E,), rows sorted by time.

    Args:
        time: the snapshot's arrival time.
        answer: the row's representative answer (what a stop on it outputs).
        statistic: what the stop fires on.
        confidence: what picks the output and is reported (the statistic for a training-free rule).
        klass: the row's class.
    """

    time: np.ndarray
    answer: np.ndarray
    statistic: np.ndarray
    confidence: np.ndarray
    klass: np.ndarray

    @property
    def size(self) -> int:
        return int(self.time.size)

    def at_answers(self, klass, end) -> tuple[np.ndarray, np.ndarray]:
        """(A,) statistic and (A,) confidence of each answer's class at its own arrival (what `MSVAnswer.score`
        shows and what per-answer metrics read)."""
        rows = snapshot_rows(self.time, self.klass, klass, end)
        return self.statistic[rows], self.confidence[rows]


def _consensus(ev: ClassEvents, num_chains: int) -> np.ndarray:
    return ev.support / float(num_chains)


def _adaptive_consistency(ev: ClassEvents, num_chains: int) -> np.ndarray:
    from scipy.stats import beta

    return beta.sf(0.5, ev.support + 1, ev.runner_up + 1)


def _probe_stability(ev: ClassEvents, num_chains: int) -> np.ndarray:
    return ev.steady / float(num_chains)


# The training-free rules, each a function of a snapshot's counts:
# * consensus — k-of-N consensus (ESC / Adaptive-Consistency style): the share of the N chains whose latest answer
#   is in the class; chains that have not answered count against. λ = k / N stops when k chains agree.
# * adaptive-consistency — Adaptive-Consistency's Beta criterion (Aggarwal et al., 2023) over the chains' latest
#   answers: P(p > ½) under p ~ Beta(v₁ + 1, v₂ + 1), v₁ the chains backing the class, v₂ the runner-up's (it counts
#   the chains that have answered, as the paper's sequential sampler does).
# * probe-stability — Dynasor-CoT style (Fu et al., 2024): the share of the N chains whose last `PROBE_WINDOW`
#   probed answers all are the class.
STOP_RULES = {
    "consensus": _consensus,
    "adaptive-consistency": _adaptive_consistency,
    "probe-stability": _probe_stability,
}


def stop_events(rule: str | StopHead, klass, sequence, step, end, num_chains: int, scores=None, times=None):
    """The `StopEvents` of a rule on one group: every class refreshed at every arrival (`class_events`).

    Args:
        rule: a key of `STOP_RULES`, or a `StopHead` (read with `scores`).
        klass, sequence, step, end: (A,) the group's answers (`class_events`).
        num_chains: N.
        scores: (A,) verifier probabilities (a `StopHead` needs them).
        times: the arrival times whose snapshots are needed (default all; a live caller passes the new ones).

    Returns:
        The `StopEvents`.

    Raises:
        UserError: an unknown rule name.
    """
    if isinstance(rule, StopHead):
        ev = class_events(klass, sequence, step, end, num_chains, scores=scores, times=times)
        assert ev.features is not None
        statistic, confidence = rule.predict(ev.features), rule.confidence(ev.features)
    else:
        if rule not in STOP_RULES:
            raise UserError(f"unknown stop rule {rule!r}; choose one of {sorted(STOP_RULES)}")
        ev = class_events(klass, sequence, step, end, num_chains, times=times)
        statistic = confidence = np.asarray(STOP_RULES[rule](ev, num_chains), dtype=np.float64)
    return StopEvents(ev.time, ev.answer, statistic, confidence, ev.klass)


def stop_statistic(rule: str, klass, sequence, step, end, num_chains: int, only=None) -> np.ndarray:
    """(A,) statistic of the training-free rule named `rule` (a key of `STOP_RULES`) for each answer's class at its
    arrival: the per-answer view of `stop_events`.

    Args:
        rule: a key of `STOP_RULES`.
        klass, sequence, step, end: (A,) the group's answers.
        num_chains: N.
        only: indices of the answers whose values are needed (the others are left at 0); `None`: all.

    Returns:
        (A,) float statistic.

    Raises:
        UserError: if `rule` is unknown.
    """
    return _per_answer(rule, klass, sequence, step, end, num_chains, None, only)[0]


def _per_answer(rule, klass, sequence, step, end, num_chains, scores, only) -> tuple[np.ndarray, np.ndarray]:
    end = np.asarray(end, np.int64).reshape(-1)
    klass = np.asarray(klass, np.int64).reshape(-1)
    wanted = np.arange(end.size) if only is None else np.asarray(only, np.int64)
    events = stop_events(rule, klass, sequence, step, end, num_chains, scores, arrival_times(end, only))
    statistic, confidence = np.zeros(end.size), np.zeros(end.size)
    statistic[wanted], confidence[wanted] = events.at_answers(klass[wanted], end[wanted])
    return statistic, confidence


def consensus_share(klass, sequence, step, end, num_chains: int, only=None) -> np.ndarray:
    """(A,) `stop_statistic` ``"consensus"``: share of the N chains whose latest answer is in a's class."""
    return stop_statistic("consensus", klass, sequence, step, end, num_chains, only)


def probe_stability(klass, sequence, step, end, num_chains: int, window: int = PROBE_WINDOW, only=None) -> np.ndarray:
    """(A,) share of the N chains whose last `window` answers at end_a all are a's class."""
    ev = class_events(
        klass, sequence, step, end, num_chains, times=arrival_times(np.asarray(end), only), window=window
    )
    return _answer_view(ev, ev.steady / float(num_chains), klass, end, only)


def adaptive_consistency(klass, sequence, step, end, num_chains: int | None = None, only=None) -> np.ndarray:
    """(A,) `stop_statistic` ``"adaptive-consistency"`` (`num_chains` is unused by the criterion)."""
    return stop_statistic("adaptive-consistency", klass, sequence, step, end, num_chains or 1, only)


def _answer_view(ev: ClassEvents, values: np.ndarray, klass, end, only) -> np.ndarray:
    klass, end = np.asarray(klass, np.int64).reshape(-1), np.asarray(end, np.int64).reshape(-1)
    wanted = np.arange(end.size) if only is None else np.asarray(only, np.int64)
    out = np.zeros(end.size)
    out[wanted] = values[ev.rows_of_answers(klass[wanted], end[wanted])]
    return out


FEATURES = (
    "mean logit of the class's latest answers",
    "class support ÷ N",
    "answered ÷ N",
    "runner-up's mean logit",
    "runner-up's support ÷ N",
    "best logit of the class",
)


def stop_features(scores, klass, sequence, step, end, num_chains: int, only=None) -> np.ndarray:
    """(A, 6) features of the stop head (`FEATURES`) for answer a's *class* at end_a: the class's mean verifier
    logit over the chains standing by it (every supporting chain counted, so one chain's upward noise moves it by
    1/k), its support ÷ N, the share of chains that have answered, the same two of the runner-up (the other class of
    highest mean logit), and the best logit among the class's available answers: the per-answer view of the class
    snapshots (`class_events`), whose rows the stop rule reads.

    Args:
        scores: (A,) verifier probabilities of the answers.
        klass, sequence, step, end: (A,) the group's answers.
        num_chains: N.
        only: indices of the answers whose rows are needed (the others stay 0); `None`: all.

    Returns:
        (A, 6) float64 features.
    """
    end = np.asarray(end, np.int64).reshape(-1)
    ev = class_events(klass, sequence, step, end, num_chains, scores=scores, times=arrival_times(end, only))
    assert ev.features is not None
    klass = np.asarray(klass, np.int64).reshape(-1)
    wanted = np.arange(end.size) if only is None else np.asarray(only, np.int64)
    out = np.zeros((end.size, len(FEATURES)))
    out[wanted] = ev.features[ev.rows_of_answers(klass[wanted], end[wanted])]
    return out


# What the support floor (`StopHead.min_share`) multiplies a small class's statistic and confidence by: far below
# any λ and any floored class's confidence, while the small classes keep their order among themselves (when no
# class reaches the floor, the output is the one it would be without it).
FLOOR_SCALE = 1e-3


@dataclass(frozen=True)
class StopHead:
    """The verifier's stopping rule on `stop_features`: the statistic σ(coef · x + intercept) the stop fires on, and
    the confidence σ(confidence_coef · x + confidence_intercept) that picks the output among the available answers
    and is reported with it.

    Args:
        coef: one weight per `FEATURES` entry.
        intercept: the bias.
        num_chains: N of the validation groups it was fitted on.
        confidence_coef: the confidence's weights; `None`: the statistic is the confidence (a head fitted on
            correctness alone).
        confidence_intercept: the confidence's bias.
        min_share: the support floor: a class held by less than this share of the N chains has its statistic and
            confidence scaled by `FLOOR_SCALE`, so it neither fires the stop nor is output while a class held by
            more chains has any confidence (0: no floor). With pruning, a class's pruned chains hold answers scored
            early, and a class one chain decoded to the end would otherwise outrank it (docs/pruning.md).
        floor_below: the floor holds only in runs whose λ is below this (`None`: at every λ). Above it, and in
            full decoding, the head has no floor: a tight budget gains from it, full decoding loses a class one chain
            holds (docs/pruning.md). Read the head of a run with `at`; unresolved, it is the head without the floor.
    """

    coef: tuple[float, ...]
    intercept: float
    num_chains: int
    confidence_coef: tuple[float, ...] | None = None
    confidence_intercept: float | None = None
    min_share: float = 0.0
    floor_below: float | None = None

    def at(self, threshold: float | None) -> StopHead:
        """The head in effect in a run stopping at λ = `threshold` (`None`: full decoding): with `floor_below`, the
        floor holds below it and is off at and above it; every engine and replay reads the head of a run here.

        Args:
            threshold: the run's λ, or `None`.

        Returns:
            A `StopHead` without `floor_below`.
        """
        if self.floor_below is None:
            return self
        floored = threshold is not None and not math.isnan(threshold) and threshold < self.floor_below
        return replace(self, min_share=self.min_share if floored else 0.0, floor_below=None)

    @property
    def switches(self) -> bool:
        """Whether the head differs between λ below and above `floor_below` (`at`)."""
        return self.floor_below is not None and self.min_share > 0

    def __call__(self, scores, klass, sequence, step, end, num_chains: int | None = None, only=None) -> np.ndarray:
        """(A,) stopping statistic of a group's answers (same arguments as `stop_features`).

        Args:
            scores, klass, sequence, step, end, only: as `stop_features`.
            num_chains: N; `None`: the head's own `num_chains`.

        Returns:
            (A,) float probabilities.
        """
        return _per_answer(self, klass, sequence, step, end, num_chains or self.num_chains, scores, only)[0]

    def statistic_and_confidence(
        self, scores, klass, sequence, step, end, num_chains: int | None = None, only=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(A,) statistic and (A,) confidence of a group's answers, each answer's class at its arrival (arguments as
        `__call__`)."""
        return _per_answer(self, klass, sequence, step, end, num_chains or self.num_chains, scores, only)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """(m,) statistic of (m, F) `stop_features` rows.

        Args:
            features: (m, F) rows of `stop_features`.

        Returns:
            (m,) float probabilities.
        """
        return self._floor(features, logistic(features, self.coef, self.intercept))

    def _floor(self, features: np.ndarray, values: np.ndarray) -> np.ndarray:
        if self.min_share <= 0 or self.floor_below is not None:  # a switching head unresolved: no floor (`at`)
            return values
        # A tiny margin: support ÷ N is a float, and a class of exactly min_share · N chains is above the floor.
        return np.where(features[:, 1] < self.min_share - 1e-9, values * FLOOR_SCALE, values)

    def confidence(self, features: np.ndarray) -> np.ndarray:
        """(m,) P(the class is correct) of (m, F) `stop_features` rows: what the stop reports.

        Args:
            features: (m, F) rows of `stop_features`.

        Returns:
            (m,) float probabilities.
        """
        if self.confidence_coef is None or self.confidence_intercept is None:
            return self.predict(features)
        return self._floor(features, logistic(features, self.confidence_coef, self.confidence_intercept))

    def to_dict(self) -> dict:
        d = asdict(self) | {"coef": list(self.coef)}
        if not self.min_share:  # a head without the floor is written as before
            del d["min_share"]
        if self.floor_below is None:
            del d["floor_below"]
        if self.confidence_coef is None:  # a correctness-only head is written as before
            del d["confidence_coef"], d["confidence_intercept"]
        else:
            d["confidence_coef"] = list(self.confidence_coef)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> StopHead:
        """The head written by `to_dict`.

        Args:
            d: a dict with ``coef``, ``intercept`` and ``num_chains`` (and, for a two-part head,
                ``confidence_coef`` and ``confidence_intercept``).

        Returns:
            The `StopHead`.
        """
        confidence = d.get("confidence_coef")
        return cls(
            coef=tuple(float(c) for c in d["coef"]),
            intercept=float(d["intercept"]),
            num_chains=int(d["num_chains"]),
            confidence_coef=None if confidence is None else tuple(float(c) for c in confidence),
            confidence_intercept=None if confidence is None else float(d["confidence_intercept"]),
            min_share=float(d.get("min_share", 0.0)),
            floor_below=None if d.get("floor_below") is None else float(d["floor_below"]),
        )

    @classmethod
    def of(cls, config) -> StopHead | None:
        """The stop head a verifier's config carries (``config.early_stopping["stop_head"]``), else None.

        Args:
            config: a verifier config (any object; a missing ``early_stopping`` means no head).

        Returns:
            The `StopHead`, or None.
        """
        stored = (getattr(config, "early_stopping", None) or {}).get("stop_head")
        return None if stored is None else cls.from_dict(stored)


# The prior the head shrinks toward: Platt scaling of the class's mean logit over the chains standing by it,
# calibrated at the stop (on the testbed it picks the raw score's answers at full decoding). The other features enter
# only as far as cross-validation over the validation problems says they help, so a head fitted on few problems
# stays near it (measured in docs/early_stopping.md).
_FREE = (0,)
# Ridge penalties on the other (standardised) features, ∞ last: the prior alone.
STOP_PENALTIES = (0.0, 1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, math.inf)


def fit_stop_head(
    features: np.ndarray,
    labels: np.ndarray,
    group: np.ndarray,
    end: np.ndarray,
    num_chains: int,
    rounds: int = 2,
    penalty: float = 0.0,
    snapshots: bool = True,
) -> StopHead:
    """Fit a `StopHead` on validation answers: (m, F) `stop_features` rows, 0/1 `labels`, and each answer's
    `group` and `end` (m,).

    The stop fires on the leading class, so the head is fitted on *leader events* alone: per group and arrival
    time, the current row a head ranks first; first the prior's (the class's mean logit), then `rounds` times the
    previous fit's. Class snapshots hold every class at every arrival, about ten times the leader rows: fitting
    on the leaders keeps the fit's cost that of the rows the stop can fire on.
    Its output is then calibrated for the answer a stop would output, not for the average answer (measured in
    ``docs/early_stopping.md``). `penalty` is a ridge on the standardised features other than the class's
    mean logit (0: none; ∞: Platt scaling of the class's mean logit alone); `choose_stop_penalty` picks it.

    Args:
        features: (m, F) `stop_features` rows.
        labels: (m,) 0/1 correctness (values > 0.5 count as correct).
        group: (m,) group id of each answer.
        end: (m,) end time of each answer.
        num_chains: N of the groups.
        rounds: refits on the leader events.
        penalty: the ridge penalty (`STOP_PENALTIES`).
        snapshots: the rows are class snapshots (`hf_msv.class_events`; `leader_events`), as training passes.

    Returns:
        The fitted `StopHead`.
    """
    x, y = np.asarray(features, dtype=np.float64), np.asarray(labels) > 0.5
    # The first leaders are the prior's: Platt scaling of the class's mean logit ranks rows by that feature alone.
    rows = leader_events(x[:, _FREE[0]], group, end, snapshots)
    head = StopHead(*_fit(x[rows], y[rows], penalty), num_chains=int(num_chains))
    for _ in range(rounds):
        rows = leader_events(head.predict(x), group, end, snapshots)
        head = StopHead(*_fit(x[rows], y[rows], penalty), num_chains=int(num_chains))
    return head


@dataclass(frozen=True)
class PenaltyChoice:
    """The stop head's ridge penalty chosen by `choose_stop_penalty`.

    Args:
        penalty: the chosen entry of `penalties`.
        penalties: the candidates, in `STOP_PENALTIES` order.
        losses: cross-fitted Brier score at the leader events per candidate (mean over problems).
        standard_errors: per candidate, the standard error over problems of its excess over the best candidate.
        folds: the number of problem folds.
    """

    penalty: float
    penalties: tuple[float, ...]
    losses: tuple[float, ...]
    standard_errors: tuple[float, ...]
    folds: int

    def to_dict(self) -> dict:
        inf = lambda v: None if math.isinf(v) else v  # JSON has no ∞: None stands for the prior alone
        return {
            "penalty": inf(self.penalty),
            "penalties": [inf(v) for v in self.penalties],
            "losses": list(self.losses),
            "standard_errors": list(self.standard_errors),
            "folds": self.folds,
        }


def choose_stop_penalty(
    features: np.ndarray,
    labels: np.ndarray,
    group: np.ndarray,
    end: np.ndarray,
    problem: np.ndarray,
    num_chains: int,
    rounds: int = 2,
    folds: int = 4,
    snapshots: bool = True,
) -> PenaltyChoice:
    """The stop head's penalty by K-fold cross-validation over problems: each candidate's head is fitted on the
    other folds, and scored by the Brier score at the held-out fold's leader events (the answers its stops would
    output; bounded, unlike the log loss, whose few confident misses decide a small split). The one-standard-error
    rule keeps the largest penalty whose excess over the best is within its standard error (paired over problems):
    on a small validation split the head stays near the prior, on a large one the data decide.

    Args:
        features, labels, group, end, num_chains, rounds: as `fit_stop_head`.
        problem: (m,) problem id of each answer (folds never split a problem).
        folds: K.
        snapshots: as `fit_stop_head`.

    Returns:
        The `PenaltyChoice`.
    """
    x, y = np.asarray(features, dtype=np.float64), np.asarray(labels) > 0.5
    group, end = np.asarray(group), np.asarray(end)
    problems, index = np.unique(np.asarray(problem).astype(str), return_inverse=True)
    k = min(folds, problems.size)
    if k < 2:
        nan = (math.nan,) * len(STOP_PENALTIES)
        return PenaltyChoice(math.inf, STOP_PENALTIES, nan, nan, k)
    fold = index % k  # problems in sorted order, dealt round-robin: deterministic
    loss = np.zeros((len(STOP_PENALTIES), problems.size))
    for j, penalty in enumerate(STOP_PENALTIES):
        for f in range(k):
            held, train = np.flatnonzero(fold == f), np.flatnonzero(fold != f)
            head = fit_stop_head(x[train], y[train], group[train], end[train], num_chains, rounds, penalty, snapshots)
            stat = head.predict(x[held])
            leaders = leader_events(stat, group[held], end[held], snapshots)
            rows = held[leaders]
            brier = (stat[leaders] - y[rows]) ** 2
            counts = np.maximum(np.bincount(index[rows], minlength=problems.size), 1)
            loss[j] += np.bincount(index[rows], brier, problems.size) / counts
    mean = loss.mean(1)
    best = int(np.argmin(mean))
    # Paired over problems: a candidate is as good as the best when their difference is within its standard error.
    excess = loss - loss[best]
    se = excess.std(1, ddof=1) / math.sqrt(problems.size)
    chosen = max(j for j in range(len(STOP_PENALTIES)) if excess[j].mean() <= se[j])
    return PenaltyChoice(STOP_PENALTIES[chosen], STOP_PENALTIES, tuple(map(float, mean)), tuple(map(float, se)), k)


def no_loss_labels(statistic, labels, group, terminal) -> np.ndarray:
    """(m,) 1 where stopping on answer a's class loses nothing against full decoding: a's class is correct, or the
    answer full decoding outputs (its group's terminal answer of highest `statistic`; the best answer overall in a
    group without one) is wrong. 0 exactly where the guarantee's loss 1[full decoding right ∧ stopped wrong] is 1.

    Args:
        statistic: (m,) the statistic full decoding picks by (the correctness head's).
        labels: (m,) 0/1 correctness.
        group: (m,) group id of each answer.
        terminal: (m,) bool, the answer its chain ended with.

    Returns:
        (m,) bool labels.
    """
    stat, y = np.asarray(statistic, dtype=np.float64), np.asarray(labels) > 0.5
    group, terminal = np.asarray(group), np.asarray(terminal, dtype=bool)
    out = y.copy()
    for g in np.unique(group):
        rows = np.flatnonzero(group == g)
        final = rows[terminal[rows]] if terminal[rows].any() else rows
        if not y[final[np.argmax(stat[final])]]:
            out[rows] = True  # full decoding is wrong: no stop can lose anything
    return out


# What a fitted stop head fires on (`fit_stop_rule`); both report P(the class is correct).
STOP_STATISTICS = ("no-loss", "correctness")


@dataclass(frozen=True)
class StopRuleFit:
    """What `fit_stop_rule` found: the two-part `head` and the cross-validated penalties of its statistic and of
    its confidence."""

    head: StopHead
    penalty: PenaltyChoice
    confidence_penalty: PenaltyChoice


def fit_stop_rule(
    features,
    labels,
    group,
    end,
    terminal,
    problem,
    num_chains: int,
    statistic: str = "no-loss",
    snapshots: bool = True,
) -> StopRuleFit:
    """Fit the `StopHead` on validation answers.

    1. The confidence: "a's class is correct", fitted and refitted on its own leader events (`fit_stop_head`).
       With ``statistic="correctness"`` this is the head: it fires on its confidence.
    2. ``"no-loss"``: the statistic "stopping on a's class loses nothing against full decoding" (`no_loss_labels`,
       full decoding read with the head of step 1), fitted the same way. A stop on it fires on the loss the
       guarantee bounds, not on correctness: where the chains settle on an answer the verifier doubts, stopping
       costs nothing.
    3. The confidence is refitted on the statistic's leader events (the moments and classes its stops fire on);
       it picks the output at the stop and is reported with it (`decide_stop`'s ``select``).

    Each part's ridge penalty is chosen by `choose_stop_penalty`.

    Args:
        features: (m, F) `stop_features` rows.
        labels: (m,) 0/1 correctness.
        group, end: (m,) group id and end time of each answer.
        terminal: (m,) bool, the answer its chain ended with.
        problem: (m,) problem id of each answer (cross-validation folds).
        num_chains: N of the groups.
        statistic: an entry of `STOP_STATISTICS`.
        snapshots: as `fit_stop_head`.

    Returns:
        The `StopRuleFit`.

    Raises:
        UserError: an unknown `statistic`.
    """
    if statistic not in STOP_STATISTICS:
        raise UserError(f"statistic must be one of {STOP_STATISTICS}, got {statistic!r}")
    x, y = np.asarray(features, dtype=np.float64), np.asarray(labels) > 0.5
    confidence_penalty = choose_stop_penalty(x, y, group, end, problem, num_chains, snapshots=snapshots)
    correctness = fit_stop_head(x, y, group, end, num_chains, penalty=confidence_penalty.penalty, snapshots=snapshots)
    if statistic == "correctness":
        return StopRuleFit(correctness, confidence_penalty, confidence_penalty)
    target = no_loss_labels(correctness.predict(x), y, group, terminal)
    penalty = choose_stop_penalty(x, target, group, end, problem, num_chains, snapshots=snapshots)
    no_loss = fit_stop_head(x, target, group, end, num_chains, penalty=penalty.penalty, snapshots=snapshots)
    rows = leader_events(no_loss.predict(x), group, end, snapshots)
    coef, intercept = _fit(x[rows], y[rows], confidence_penalty.penalty)
    head = replace(no_loss, confidence_coef=coef, confidence_intercept=intercept)
    return StopRuleFit(head, penalty, confidence_penalty)


def leader_events(stat: np.ndarray, group: np.ndarray, end: np.ndarray, snapshots: bool = False) -> np.ndarray:
    """Indices of the rows that lead their group at each of its arrival times, one per (group, distinct end t): the
    row of highest `stat` among those current at t (ties: the earliest, then the lower index). Answers stay current
    once available; snapshot rows (``snapshots=True``: `class_events`) only until the group's next time.

    Args:
        stat: (m,) statistic of each row.
        group: (m,) group id of each row.
        end: (m,) time of each row.
        snapshots: the rows are class snapshots.

    Returns:
        1-D int array of row indices.
    """
    stat, group, end = np.asarray(stat), np.asarray(group), np.asarray(end)
    rows = []
    for g in np.unique(group):
        members = np.flatnonzero(group == g)
        order = members[np.lexsort((members, end[members]))]  # arrival order
        rows.append(order[current_leaders(stat[order], end[order], snapshots)])
    return np.concatenate(rows) if rows else np.zeros(0, np.int64)


def current_leaders(values: np.ndarray, end: np.ndarray, snapshots: bool) -> np.ndarray:
    """For rows in arrival order (`end` ascending), the position of the leader at each distinct end time (ascending):
    the first maximum of `values` among the rows current then (all rows so far; with `snapshots`, that time's)."""
    last = np.r_[end[1:] != end[:-1], True]  # the last row of each time
    if not snapshots:
        return running_argmax(values)[last]
    starts = np.flatnonzero(np.r_[True, last[:-1]])
    best = np.repeat(np.maximum.reduceat(values, starts), np.diff(np.r_[starts, values.size]))
    position = np.where(values == best, np.arange(values.size), values.size)  # a run's maxima, first one wins
    return np.minimum.reduceat(position, starts).astype(np.int64)


def running_argmax(values: np.ndarray) -> np.ndarray:
    """(n,) index of the first maximum of values[:i+1]: it moves only on a strictly larger value, so in arrival
    order ties stay with the earliest arrival (`decide_stop` and `leader_events` pick leaders with it)."""
    run = np.maximum.accumulate(values)
    is_new = np.r_[True, values[1:] > run[:-1]]
    return np.maximum.accumulate(np.where(is_new, np.arange(values.size), 0))


def _fit(x: np.ndarray, y: np.ndarray, penalty: float = 0.0) -> tuple[tuple[float, ...], float]:
    """(coef, intercept) of the logistic regression of `y` on `x` with a ridge `penalty` on the standardised
    features outside `_FREE` (the intercept and `_FREE` are not penalised)."""
    free = np.zeros(x.shape[1], bool)
    free[list(_FREE)] = True
    coef = np.zeros(x.shape[1])
    if math.isinf(penalty):
        coef[free], intercept = _ridge_logistic(x[:, free], y, 0.0, np.ones(int(free.sum()), bool))
    else:
        coef, intercept = _ridge_logistic(x, y, penalty, free)
    return tuple(float(c) for c in coef), float(intercept)


def _ridge_logistic(x: np.ndarray, y: np.ndarray, penalty: float, free: np.ndarray) -> tuple[np.ndarray, float]:
    """Logistic regression with ½ · penalty · ‖w‖² on the standardised weights outside `free` (Newton's method: the
    objective is convex in 7 parameters, so a few exact steps replace a quasi-Newton run's dozens). A constant
    column carries nothing the intercept does not: its weight is 0."""
    from scipy.special import expit

    if y.all() or not y.any():
        return fit_logistic(x, y)
    mu, sd = x.mean(0), x.std(0)
    keep = sd > 1e-9
    z = np.c_[(x[:, keep] - mu[keep]) / sd[keep], np.ones(len(x))]
    ridge = np.r_[np.where(free[keep], 0.0, penalty), 0.0]
    t = y.astype(np.float64)

    def objective(theta):
        eta = z @ theta
        return np.logaddexp(0.0, eta).sum() - t @ eta + 0.5 * ridge @ theta**2

    theta = np.zeros(z.shape[1])
    for _ in range(100):
        p = expit(z @ theta)
        gradient = z.T @ (p - t) + ridge * theta
        # A vanishing ridge on every weight keeps the Hessian invertible on separable data.
        hessian = (z * (p * (1 - p))[:, None]).T @ z + np.diag(ridge + 1e-9 * len(z))
        step = np.linalg.solve(hessian, gradient)
        size, value = 1.0, objective(theta)
        while size > 1e-4 and objective(theta - size * step) > value:  # damped: never uphill
            size /= 2
        theta = theta - size * step
        if np.abs(size * step).max() < 1e-10:
            break
    coef = np.zeros(x.shape[1])
    coef[keep] = theta[:-1] / sd[keep]
    return coef, float(theta[-1] - coef[keep] @ mu[keep])


# What a `ConfidenceMap` may read beside the stop head's confidence: the chosen class's `FEATURES` at the stop (the
# snapshot the stop fired on), then two of the group's state then. The head fits its weights on every arrival, not
# on the stops; a map fitted on the calibration stops can reweigh them (docs/pruning.md, "Stop-time confidence":
# on the testbed they lower the log loss on new problems, not their ECE, and the shipped maps weigh none).
STOP_TIME_FEATURES = (
    *FEATURES,
    "classes held ÷ N",
    "log(1 + stop time)",
)


def stop_time_features(scores, klass, sequence, step, end, num_chains: int, time: int, answer: int) -> np.ndarray:
    """(F,) `STOP_TIME_FEATURES` of a stop at `time` that outputs answer `answer`: its class's snapshot row then,
    over the answers available (end ≤ time).

    Args:
        scores: (A,) verifier probabilities of the answers.
        klass, sequence, step, end: (A,) the group's answers.
        num_chains: N.
        time: the stop's time (its last arrival).
        answer: the index (into the A answers) of the output.

    Returns:
        (F,) float64 features.
    """
    klass, end = np.asarray(klass, np.int64).reshape(-1), np.asarray(end, np.int64).reshape(-1)
    avail = np.flatnonzero(end <= time)
    pick = lambda x: np.asarray(x).reshape(-1)[avail]
    ev = class_events(pick(klass), pick(sequence), pick(step), pick(end), num_chains, pick(scores), times=[time])
    assert ev.features is not None
    row = int(np.flatnonzero(ev.klass == klass[answer])[0])
    held = int((ev.support > 0).sum())
    return np.r_[ev.features[row], held / num_chains, math.log1p(max(time, 0))]


@dataclass(frozen=True)
class ConfidenceMap:
    """Platt scaling of the confidence a stop reports, σ(slope · logit(c) + weights · x + intercept), optionally
    followed by an isotonic step, fitted on the stops of the calibration problems at the deployed operating point
    (`fit`): the stop head's confidence is fitted on the leader events at every arrival of the head's problems, which
    are not the moments a stop at λ fires on. x are the stop's `STOP_TIME_FEATURES` (`stop_time_features`), read only
    when some weight is not 0. The isotonic step (`knots`) bends the Platt output where accuracy is not logistic in
    it (docs/pruning.md, "Stop-time confidence").

    Args:
        slope: the weight of logit(c).
        intercept: the bias.
        weights: one per `STOP_TIME_FEATURES` entry; empty: the confidence alone.
        knots: ``((p, q), ...)`` with p increasing: the Platt output p maps to q, linearly between knots and to the
            end knot's q beyond them; empty: the Platt output as is.
    """

    slope: float
    intercept: float
    weights: tuple[float, ...] = ()
    knots: tuple[tuple[float, float], ...] = ()

    @property
    def needs_features(self) -> bool:
        return any(w != 0 for w in self.weights)

    def __call__(self, confidence, features=None) -> np.ndarray:
        """(m,) the recalibrated confidences of (m,) confidences (nan stays nan).

        Args:
            confidence: (m,) what the stop reported.
            features: (m, F) their `STOP_TIME_FEATURES`; needed when the map weighs them.

        Raises:
            ValueError: if the map weighs features and none (or the wrong number) are given.
        """
        c = np.asarray(confidence, dtype=np.float64).reshape(-1)
        x = logit(np.nan_to_num(c, nan=0.5))[:, None]
        coef = [self.slope]
        if self.needs_features:
            if features is None:
                raise ValueError("this ConfidenceMap weighs the stop-time features: pass them (stop_time_features)")
            f = np.asarray(features, dtype=np.float64).reshape(c.size, -1)
            if f.shape[1] != len(self.weights):
                raise ValueError(f"{f.shape[1]} stop-time features given, the map weighs {len(self.weights)}")
            x, coef = np.concatenate([x, f], 1), [*coef, *self.weights]
        p = logistic(x, coef, self.intercept)
        if self.knots:
            p = np.interp(p, *np.asarray(self.knots, np.float64).T)
        return np.where(np.isnan(c), np.nan, p)

    @classmethod
    def fit(cls, confidence, correct, features=None, columns=(), isotonic: bool = False) -> ConfidenceMap:
        """Fit on (m,) reported confidences and (m,) 0/1 correctness of the stops.

        Args:
            confidence: (m,) what the stop reported.
            correct: (m,) whether the stopped answer was right.
            features: (m, F) the stops' `STOP_TIME_FEATURES`; needed when `columns` is not empty.
            columns: which of the F features the map weighs (the others get 0); empty: the confidence alone.
            isotonic: also fit the isotonic step on the Platt outputs (its values kept within
                [1 / (m + 2), 1 − 1 / (m + 2)], so no stop reports certainty).

        Returns:
            The `ConfidenceMap`.
        """
        c = logit(np.asarray(confidence, dtype=np.float64).reshape(-1))[:, None]
        if not columns:
            coef, intercept = fit_logistic(c, correct)
            cmap = cls(float(coef[0]), float(intercept))
        else:
            f = np.asarray(features, dtype=np.float64).reshape(c.shape[0], -1)
            coef, intercept = fit_logistic(np.concatenate([c, f[:, list(columns)]], 1), correct)
            weights = np.zeros(f.shape[1])
            weights[list(columns)] = coef[1:]
            cmap = cls(float(coef[0]), float(intercept), tuple(float(w) for w in weights))
        if not isotonic:
            return cmap
        from sklearn.isotonic import IsotonicRegression

        edge = 1.0 / (c.shape[0] + 2)
        iso = IsotonicRegression(y_min=edge, y_max=1 - edge, out_of_bounds="clip")
        iso.fit(cmap(confidence, features), np.asarray(correct, np.float64).reshape(-1))
        knots = tuple((float(p), float(q)) for p, q in zip(iso.X_thresholds_, iso.y_thresholds_))
        return replace(cmap, knots=knots)

    def to_dict(self) -> dict:
        d = asdict(self) | {"weights": list(self.weights), "knots": [list(k) for k in self.knots]}
        for key, used in (("weights", self.needs_features), ("knots", bool(self.knots))):
            if not used:  # a Platt map of the confidence alone is written as before
                del d[key]
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> ConfidenceMap | None:
        if not d:
            return None
        knots = tuple((float(p), float(q)) for p, q in d.get("knots", ()))
        return cls(float(d["slope"]), float(d["intercept"]), tuple(float(w) for w in d.get("weights", ())), knots)

    @classmethod
    def of(cls, config) -> ConfidenceMap | None:
        """The map a verifier's config carries for the stop at its λ (``config.early_stopping["confidence_map"]``);
        None (report the head's confidence) when absent.

        Args:
            config: a verifier config (any object).

        Returns:
            The `ConfidenceMap`, or None.
        """
        return cls.from_dict((getattr(config, "early_stopping", None) or {}).get("confidence_map"))
