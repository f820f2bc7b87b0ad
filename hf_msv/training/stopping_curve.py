"""A trained streaming verifier's stopping rule, fitted on validation (`fit_early_stopping`): the stop head
(`hf_msv.stop_rules.StopHead`: the verifier's score with its class's support among the N chains), fitted on one
part of the validation problems, and the λ chosen by `hf_msv.lambda_rule.choose_lambda` on the other part
(`ProblemSplit`), with the guarantee it carries: full decoding (λ = ∞) when nothing is certified. Written to the
verifier's config
(``early_stopping``, what `generate` and `MSVEarlyStop.from_verifier` read) and to
``training_log.json["early_stopping"]``. The rule is `hf_msv.generation.decide_stop`; ``hf-msv evaluate`` replays
the same rule. See ``docs/early_stopping.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import expit

from ..class_events import class_events
from ..errors import UserError
from ..generation.stopping import decide_stop
from ..lambda_rule import (
    CALIBRATION_FRACTION,
    DELTA,
    EPSILON,
    LAMBDA_RULES,
    LAMBDAS,
    TARGET_FRACTION,
    LambdaChoice,
    choose_lambda,
    lambda_index,
)
from ..metrics import ece
from ..stop_rules import FEATURES, PenaltyChoice, StopHead, StopRuleFit, fit_stop_rule, stop_features

__all__ = [
    "EarlyStoppingFit",
    "GroupReplay",
    "ProblemSplit",
    "ValidationEvents",
    "fit_early_stopping",
    "group_rows",
    "replay_groups",
    "stop_head_events",
    "stop_head_features",
]


@dataclass(frozen=True)
class GroupReplay:
    """The stopping rule replayed on G groups over `LAMBDAS` (Λ,): ``correct``, ``tokens``, ``stopped`` and the
    statistic of the chosen answer ``confidence``, all (G, Λ); ``problem`` (G,) the group's problem."""

    correct: np.ndarray
    tokens: np.ndarray
    stopped: np.ndarray
    confidence: np.ndarray
    problem: np.ndarray

    def curve(self) -> dict:
        """{"lambdas", "accuracy", "tokens"} as lists (λ = ∞ as None)."""
        return {
            "lambdas": [None if math.isinf(x) else float(x) for x in LAMBDAS],
            "accuracy": self.correct.mean(0).tolist(),
            "tokens": self.tokens.mean(0).tolist(),
        }

    def at_stop(self, lam: float) -> dict:
        """Stop-time calibration at `lam`: over the groups that stopped, accuracy, mean confidence and ECE."""
        j = lambda_index(lam)
        hit = self.stopped[:, j]
        conf, right = self.confidence[hit, j], self.correct[hit, j]
        return {
            "stopped": float(hit.mean()),
            "accuracy": float(right.mean()) if hit.any() else math.nan,
            "confidence": float(conf.mean()) if hit.any() else math.nan,
            "ece": ece(conf, right) if hit.any() else math.nan,
        }


@dataclass(frozen=True)
class EarlyStoppingFit:
    """What `fit_early_stopping` found: the `head` (fitted on the split's head problems), the deployed `choice`
    (the guarantee's λ, ∞ when it certifies nothing, or the target rule's when asked for), both rules' choices,
    and the replays of the head and of the raw score on the calibration problems.

    Args:
        head: the fitted `StopHead`.
        choice: the deployed `LambdaChoice`.
        guarantee: the guarantee rule's choice.
        target: the target rule's choice.
        replay: the head's `GroupReplay` on the calibration problems.
        raw: the raw score's `GroupReplay` on them.
        penalty: the cross-validated ridge penalty of the head's statistic.
        confidence_penalty: that of its confidence.
        split: which problems fit the head and which calibrated λ.
    """

    head: StopHead
    choice: LambdaChoice
    guarantee: LambdaChoice
    target: LambdaChoice
    replay: GroupReplay
    raw: GroupReplay
    penalty: PenaltyChoice
    confidence_penalty: PenaltyChoice
    split: ProblemSplit

    def config_entry(self) -> dict:
        """``MSVConfig.early_stopping``: what generation reads, and the guarantee's outcome (what was certified)."""
        return {
            "stop_head": self.head.to_dict(),
            "lambda": self.choice.to_dict(),
            "guarantee": self.guarantee.to_dict(),
        }

    def to_dict(self) -> dict:
        """``training_log.json["early_stopping"]``."""
        raw_target = _target_choice(self.raw)
        return {
            "stop_head": self.head.to_dict(),
            "stop_head_penalty": self.penalty.to_dict(),
            "stop_head_confidence_penalty": self.confidence_penalty.to_dict(),
            "split": self.split.to_dict(),
            "lambda": self.choice.to_dict(),
            "guarantee": self.guarantee.to_dict(),
            "target": self.target.to_dict(),
            "at_stop": self.replay.at_stop(self.choice.lam),
            "curve": self.replay.curve(),
            "raw_score": {
                "target": raw_target.to_dict(),
                "at_stop": self.raw.at_stop(raw_target.lam),
                "curve": self.raw.curve(),
            },
        }


def group_rows(structure: dict) -> list[np.ndarray]:
    """The answer rows of each validation group, in group order."""
    return [np.flatnonzero(structure["group"] == g) for g in np.unique(structure["group"])]


@dataclass(frozen=True)
class ValidationEvents:
    """The class snapshots (`hf_msv.class_events`) of the validation groups, rows (E,): the stop head's
    `features` (E, F), each row's `group`, `time`, representative `answer` (a row of the validation answers),
    and `terminal` (its answer is terminal and the row is in its group's last snapshot: full decoding's candidates)."""

    features: np.ndarray
    group: np.ndarray
    time: np.ndarray
    answer: np.ndarray
    terminal: np.ndarray

    def take(self, rows: np.ndarray) -> ValidationEvents:
        return ValidationEvents(*(x[rows] for x in (self.features, self.group, self.time, self.answer, self.terminal)))


def stop_head_events(p: np.ndarray, structure: dict, num_chains: int) -> ValidationEvents:
    """The `ValidationEvents` of every validation group, computed within the group from its answers' (m,)
    verifier probabilities `p` (`hf_msv.stop_rules.stop_events`' rows)."""
    parts = []
    for rows in group_rows(structure):
        ev = class_events(
            structure["klass"][rows],
            structure["sequence"][rows],
            structure["step"][rows],
            structure["end"][rows],
            num_chains,
            scores=p[rows],
        )
        assert ev.features is not None
        last = ev.time == ev.time.max(initial=0)
        terminal = structure["terminal"][rows][ev.answer].astype(bool) & last
        parts.append((ev.features, np.full(ev.size, structure["group"][rows[0]]), ev.time, rows[ev.answer], terminal))
    if not parts:
        empty = np.zeros(0, np.int64)
        return ValidationEvents(np.zeros((0, len(FEATURES))), empty, empty, empty, np.zeros(0, bool))
    features, group, time, answer, terminal = (np.concatenate(column) for column in zip(*parts))
    return ValidationEvents(features, group, time, answer, terminal)


def stop_head_features(p: np.ndarray, structure: dict, num_chains: int) -> np.ndarray:
    """(m, F) `hf_msv.stop_rules.stop_features` of every validation answer (its class at its arrival), computed
    within its group."""
    x = np.zeros((p.size, len(FEATURES)))
    for rows in group_rows(structure):
        x[rows] = stop_features(
            p[rows],
            structure["klass"][rows],
            structure["sequence"][rows],
            structure["step"][rows],
            structure["end"][rows],
            num_chains,
        )
    return x


def _chain_lengths(structure: dict, rows: np.ndarray) -> np.ndarray:
    """A group's chain lengths, each read as its last answer's end."""
    end, sequence = structure["end"][rows], structure["sequence"][rows]
    return np.array([end[sequence == s].max() for s in np.unique(sequence)])


def replay_groups(
    stats: np.ndarray,
    labels: np.ndarray,
    structure: dict,
    problems: np.ndarray,
    confidence: np.ndarray | None = None,
    events: ValidationEvents | None = None,
) -> GroupReplay:
    """Replay `decide_stop` over `LAMBDAS` on each validation group. With `events`, `stats` and `confidence` are
    per snapshot row (E,) and the rule reads the class snapshots; without, they are per answer (m,) (a raw score).
    The `confidence` picks the output and is what the stop reports (default: `stats`). A chain's length is read as
    its last answer's end."""
    confidence_of = stats if confidence is None else confidence
    correct, tokens, stopped, reported, problem = [], [], [], [], []
    for rows in group_rows(structure):
        if events is None:
            entries, answer_of = rows, rows
            end, terminal = structure["end"][rows], structure["terminal"][rows].astype(bool)
        else:
            entries = np.flatnonzero(events.group == structure["group"][rows[0]])
            answer_of, end, terminal = events.answer[entries], events.time[entries], events.terminal[entries]
        d = decide_stop(end, stats[entries], terminal, LAMBDAS, confidence_of[entries], snapshots=events is not None)
        chosen = np.maximum(d.chosen, 0)
        correct.append(np.where(d.chosen >= 0, labels[answer_of[chosen]] > 0.5, False))
        tokens.append(np.minimum(d.stop_step[:, None], _chain_lengths(structure, rows)[None, :]).sum(1))
        stopped.append(d.stopped)
        reported.append(confidence_of[entries][chosen])
        problem.append(problems[rows[0]])
    return GroupReplay(
        *(np.asarray(x) for x in (correct, tokens, stopped, reported)), problem=np.asarray(problem, dtype=object)
    )


def _target_choice(replay: GroupReplay, target_fraction: float = TARGET_FRACTION) -> LambdaChoice:
    return choose_lambda(LAMBDAS, replay.correct, replay.tokens, replay.problem, target_fraction=target_fraction)


@dataclass(frozen=True)
class ProblemSplit:
    """Which validation problems fit the stop head and which calibrate λ (disjoint).

    Args:
        head: the problems the head and its penalties are fitted on.
        calibration: the problems Learn-then-Test (and the target rule) choose λ on.
    """

    head: tuple[str, ...]
    calibration: tuple[str, ...]

    @property
    def size(self) -> int:
        """The calibration problems λ is chosen on."""
        return len(self.calibration)

    @classmethod
    def of(cls, problems, calibration_fraction: float = CALIBRATION_FRACTION, seed: int = 0) -> ProblemSplit:
        """A seeded split of the distinct `problems`: ⌈`calibration_fraction` × P⌉ of them calibrate λ, the rest fit
        the head (a single problem does both: nothing can be certified on it anyway).

        Args:
            problems: problem ids (repeats allowed).
            calibration_fraction: the share of problems held out for λ, in (0, 1).
            seed: the permutation's seed.

        Returns:
            The `ProblemSplit`.
        """
        ids = np.unique(np.asarray(problems).astype(str))
        order = np.random.default_rng(seed).permutation(ids.size)
        k = min(ids.size - 1, math.ceil(calibration_fraction * ids.size)) if ids.size > 1 else ids.size
        calibration = tuple(sorted(ids[order[:k]]))
        head = tuple(sorted(ids[order[k:]])) or calibration
        return cls(head, calibration)

    def to_dict(self) -> dict:
        return {
            "head_problems": len(self.head),
            "calibration_problems": len(self.calibration),
            "head_problem_ids": list(self.head),
            "calibration_problem_ids": list(self.calibration),
        }


def fit_early_stopping(
    predictions,
    num_chains: int,
    epsilon: float = EPSILON,
    delta: float = DELTA,
    target_fraction: float = TARGET_FRACTION,
    statistic: str = "no-loss",
    lambda_rule: str = "guarantee",
    split: ProblemSplit | None = None,
    calibration=None,
) -> EarlyStoppingFit:
    """Fit the stop head on one part of the validation `predictions` (streaming, with ``structure``) and choose λ
    on its statistic over the other part: the guarantee is tested on problems the head was not fitted on.

    The head (`fit_stop_rule`, on the class snapshots of `stop_head_events`) fires on "stopping loses nothing
    against full decoding" (``statistic="no-loss"``) or on "the class is correct" (``"correctness"``), and reports
    "the class is correct". Each part's ridge penalty is chosen by cross-validation over the head's problems
    (`choose_stop_penalty`): near its prior (Platt scaling of the class's mean logit at the stop) when they are few.

    The λ saved is the guarantee's (Learn-then-Test at ε, δ on the calibration problems); when it certifies nothing,
    λ = ∞: the verifier decodes in full unless `lambda_rule` is ``"target"`` (the cheapest λ reaching
    `target_fraction` × full decoding's calibration accuracy, a user's explicit choice).

    Args:
        predictions: `ValidationPredictions` of a streaming verifier.
        num_chains: N of the validation groups.
        epsilon, delta: the guarantee's tolerance and risk (`choose_lambda`).
        target_fraction: the target rule's target, × full-decoding accuracy.
        statistic: what the head fires on (`hf_msv.stop_rules.STOP_STATISTICS`).
        lambda_rule: ``"guarantee"`` or ``"target"`` (`LAMBDA_RULES`).
        split: which problems fit the head and which calibrate λ (default: `ProblemSplit.of` the problems).
        calibration: `ValidationPredictions` of a separate calibration collection: λ is chosen on it and the head
            is fitted on all of `predictions` (`split` is then ignored).

    Returns:
        The `EarlyStoppingFit`.

    Raises:
        UserError: an unknown `lambda_rule`.
    """
    if lambda_rule not in LAMBDA_RULES:
        raise UserError(f"lambda_rule must be one of {LAMBDA_RULES}, got {lambda_rule!r}")
    head_part, calibration_part, split = _parts(predictions, split, calibration)
    head, penalties = _fit_head(head_part, num_chains, statistic)  # on problems λ is not chosen on
    p, structure, labels = _probabilities(calibration_part), calibration_part.structure, calibration_part.labels
    events = stop_head_events(p, structure, num_chains)
    replay = replay_groups(
        head.predict(events.features),
        labels,
        structure,
        calibration_part.problems,
        head.confidence(events.features),
        events,
    )
    guarantee = choose_lambda(LAMBDAS, replay.correct, replay.tokens, replay.problem, epsilon=epsilon, delta=delta)
    target = _target_choice(replay, target_fraction)
    return EarlyStoppingFit(
        head=head,
        choice=target if lambda_rule == "target" else guarantee,
        guarantee=guarantee,
        target=target,
        replay=replay,
        raw=replay_groups(p, labels, structure, calibration_part.problems),
        penalty=penalties.penalty,
        confidence_penalty=penalties.confidence_penalty,
        split=split,
    )


def _probabilities(predictions) -> np.ndarray:
    return expit(np.asarray(predictions.logits, dtype=np.float64))


def _parts(predictions, split: ProblemSplit | None, calibration):
    """(head predictions, calibration predictions, the split)."""
    if calibration is not None:
        ids = lambda x: tuple(sorted(set(np.asarray(x.problems).astype(str))))
        return predictions, calibration, ProblemSplit(ids(predictions), ids(calibration))
    split = split or ProblemSplit.of(predictions.problems)
    return _subset(predictions, split.head), _subset(predictions, split.calibration), split


@dataclass(frozen=True)
class _Part:
    """The validation answers of some problems: what fitting and replaying the rule read (per answer)."""

    logits: np.ndarray
    labels: np.ndarray
    problems: np.ndarray
    structure: dict


def _subset(predictions, problems: tuple[str, ...]) -> _Part:
    """The validation answers of `problems` (whole groups)."""
    keep = np.isin(np.asarray(predictions.problems).astype(str), np.asarray(problems))
    return _Part(
        np.asarray(predictions.logits)[keep],
        np.asarray(predictions.labels)[keep],
        np.asarray(predictions.problems)[keep],
        {key: np.asarray(value)[keep] for key, value in predictions.structure.items()},
    )


def _fit_head(predictions, num_chains: int, statistic: str) -> tuple[StopHead, StopRuleFit]:
    """The stop head fitted on the class snapshots of `predictions`."""
    structure, labels = predictions.structure, predictions.labels
    ev = stop_head_events(_probabilities(predictions), structure, num_chains)
    fit = fit_stop_rule(
        ev.features,
        labels[ev.answer],
        ev.group,
        ev.time,
        ev.terminal,
        np.asarray(predictions.problems)[ev.answer],
        num_chains,
        statistic,
    )
    return fit.head, fit
