"""A trained streaming verifier's stopping rule, fitted on validation (`fit_early_stopping`): the stop head
(`hf_msv.stop_rules.StopHead`: the verifier's score with its answer's support among the N chains) and the λ chosen
by `hf_msv.lambda_rule.choose_lambda`, with the guarantee it carries. Written to the verifier's config
(``early_stopping``, what `generate` and `MSVEarlyStop.from_verifier` read) and to
``training_log.json["early_stopping"]``. The rule is `hf_msv.generation.decide_stop`; ``hf-msv evaluate`` replays
the same rule. See ``docs/early_stopping.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..generation.stopping import decide_stop
from ..lambda_rule import DELTA, EPSILON, LAMBDAS, TARGET_FRACTION, LambdaChoice, choose_lambda
from ..metrics import ece
from ..stop_rules import FEATURES, PenaltyChoice, StopHead, fit_stop_rule, stop_features

__all__ = [
    "EarlyStoppingFit",
    "GroupReplay",
    "fit_early_stopping",
    "group_rows",
    "replay_groups",
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
        j = int(np.flatnonzero(LAMBDAS == lam)[0]) if np.isfinite(lam) else LAMBDAS.size - 1
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
    """What `fit_early_stopping` found: the `head` (fitted on the validation answers), the deployed `choice`
    (the guarantee's λ when it certifies one, else the target rule's), both rules' choices, and the replays of
    the head and of the raw score on validation.

    Args:
        head: the fitted `StopHead`.
        choice: the deployed `LambdaChoice`.
        guarantee: the guarantee rule's choice.
        target: the target rule's choice.
        replay: the head's `GroupReplay` on validation.
        raw: the raw score's `GroupReplay` on validation.
        penalty: the cross-validated ridge penalty of the head's statistic.
        confidence_penalty: that of its confidence.
    """

    head: StopHead
    choice: LambdaChoice
    guarantee: LambdaChoice
    target: LambdaChoice
    replay: GroupReplay
    raw: GroupReplay
    penalty: PenaltyChoice
    confidence_penalty: PenaltyChoice

    def config_entry(self) -> dict:
        """``MSVConfig.early_stopping``: what generation reads."""
        return {"stop_head": self.head.to_dict(), "lambda": self.choice.to_dict()}

    def to_dict(self) -> dict:
        """``training_log.json["early_stopping"]``."""
        raw_target = _target_choice(self.raw)
        return {
            "stop_head": self.head.to_dict(),
            "stop_head_penalty": self.penalty.to_dict(),
            "stop_head_confidence_penalty": self.confidence_penalty.to_dict(),
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


def replay_groups(
    stats: np.ndarray, labels: np.ndarray, structure: dict, problems: np.ndarray, confidence: np.ndarray | None = None
) -> GroupReplay:
    """Replay `decide_stop` over `LAMBDAS` on each validation group's (m,) `stats`; a chain's length is read as its
    last answer's end. The (m,) `confidence` picks the output and is what the stop reports (default: `stats`)."""
    confidence_of = stats if confidence is None else confidence
    correct, tokens, stopped, reported, problem = [], [], [], [], []
    for rows in group_rows(structure):
        end, sequence = structure["end"][rows], structure["sequence"][rows]
        terminal = structure["terminal"][rows].astype(bool)
        d = decide_stop(end, stats[rows], terminal, LAMBDAS, select=confidence_of[rows])
        lengths = np.array([end[sequence == s].max() for s in np.unique(sequence)])
        chosen = np.maximum(d.chosen, 0)
        correct.append(np.where(d.chosen >= 0, labels[rows][chosen] > 0.5, False))
        tokens.append(np.minimum(d.stop_step[:, None], lengths[None, :]).sum(1))
        stopped.append(d.stopped)
        reported.append(confidence_of[rows][chosen])
        problem.append(problems[rows[0]])
    return GroupReplay(
        *(np.asarray(x) for x in (correct, tokens, stopped, reported)), problem=np.asarray(problem, dtype=object)
    )


def stop_head_features(p: np.ndarray, structure: dict, num_chains: int) -> np.ndarray:
    """(m, F) `hf_msv.stop_rules.stop_features` of every validation answer, computed within its group."""
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


def _target_choice(replay: GroupReplay, target_fraction: float = TARGET_FRACTION) -> LambdaChoice:
    return choose_lambda(LAMBDAS, replay.correct, replay.tokens, replay.problem, target_fraction=target_fraction)


def fit_early_stopping(
    predictions,
    num_chains: int,
    epsilon: float = EPSILON,
    delta: float = DELTA,
    target_fraction: float = TARGET_FRACTION,
    statistic: str = "no-loss",
) -> EarlyStoppingFit:
    """Fit the stop head on the validation `predictions` (streaming, with ``structure``) and choose λ on its
    statistic over the same groups.

    The head (`fit_stop_rule`) fires on "stopping loses nothing against full decoding" (``statistic="no-loss"``) or
    on "the class is correct" (``"correctness"``), and reports "the class is correct". Each part's ridge penalty is
    chosen by cross-validation over the validation problems (`choose_stop_penalty`): near its prior (Platt scaling of
    the class's mean logit at the stop) when they are few.

    λ is chosen for the head that is saved: heads cross-fitted on parts of a small validation split differ from the
    one fitted on all of it, and their λ does not transfer (measured in ``docs/early_stopping.md``); the head's seven
    parameters are fitted on the same problems, so the guarantee holds for the fitted head up to that optimism.

    Args:
        predictions: `ValidationPredictions` of a streaming verifier.
        num_chains: N of the validation groups.
        epsilon, delta: the guarantee's tolerance and risk (`choose_lambda`).
        target_fraction: the plain rule's target, × full-decoding accuracy.
        statistic: what the head fires on (`hf_msv.stop_rules.STOP_STATISTICS`).

    Returns:
        The `EarlyStoppingFit`.
    """
    structure, labels = predictions.structure, predictions.labels
    p = 1.0 / (1.0 + np.exp(-predictions.logits))
    x = stop_head_features(p, structure, num_chains)
    terminal = structure["terminal"].astype(bool)
    fit = fit_stop_rule(
        x, labels, structure["group"], structure["end"], terminal, predictions.problems, num_chains, statistic
    )
    head = fit.head
    replay = replay_groups(head.predict(x), labels, structure, predictions.problems, head.confidence(x))
    guarantee = choose_lambda(LAMBDAS, replay.correct, replay.tokens, replay.problem, epsilon=epsilon, delta=delta)
    target = _target_choice(replay, target_fraction)
    return EarlyStoppingFit(
        head=head,
        choice=guarantee if guarantee.reached else target,
        guarantee=guarantee,
        target=target,
        replay=replay,
        raw=replay_groups(p, labels, structure, predictions.problems),
        penalty=fit.penalty,
        confidence_penalty=fit.confidence_penalty,
    )
