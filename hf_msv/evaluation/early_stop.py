"""Replay of the paper's parallel early-stopping rule over recorded answer streams (`replay`, `replay_many`), trade-off
curves (`tradeoff_curve`), AUTC (`autc`), λ for a budget (`select_lambda_validation`) and the λ rules of
`hf_msv.lambda_rule` on replayed groups (`choose_on_groups`, applied with `replay_at`).

The rule itself is `hf_msv.generation.decide_stop`, the one the generation hook applies live. What is counted at
the stop (token position, summed tokens, latency) and how AUTC is normalised is described in
``docs/evaluation.md``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..data import AnswerGroup
from ..generation import decide_stop
from ..lambda_rule import LAMBDAS, LambdaChoice, choose_lambda
from ..metrics import resolve_scores

__all__ = [
    "AnswerGroup",
    "LatencyCosts",
    "StopResult",
    "TradeoffCurve",
    "DEFAULT_LAMBDAS",
    "replay",
    "replay_many",
    "tradeoff_curve",
    "autc",
    "early_stop_token_fraction",
    "select_lambda_validation",
    "choose_on_groups",
    "replay_at",
    "BUDGET_FRACTIONS",
    "budget_accuracy",
]

DEFAULT_LAMBDAS = LAMBDAS  # the one grid (hf_msv.lambda_rule): every curve contains the full-decoding point


@dataclass(frozen=True)
class LatencyCosts:
    """Measured per-unit costs in seconds: one shared CoT decode step, eliciting one answer, scoring one answer."""

    decode_step_s: float = 0.0
    elicit_s: float = 0.0
    verify_s: float = 0.0


@dataclass(frozen=True)
class StopResult:
    """Per-λ replay outcome of one group; every field has shape (Λ,)."""

    chosen: np.ndarray  # int, answer index output
    correct: np.ndarray  # bool
    stopped: np.ndarray  # bool, λ was reached (False: ran to completion, best terminal answer)
    steps: np.ndarray  # int, t*
    tokens: np.ndarray  # int, Σ_n min(t*, seq_len[n])
    n_available: np.ndarray  # int, answers with end ≤ t*
    latency: np.ndarray  # float seconds


@dataclass(frozen=True)
class TradeoffCurve:
    """λ sweep averaged over groups; all arrays (Λ,). ``stop_rate`` is the fraction of groups that stopped early."""

    lambdas: np.ndarray
    accuracy: np.ndarray
    tokens: np.ndarray
    steps: np.ndarray
    latency: np.ndarray
    stop_rate: np.ndarray

    def x(self, axis: str) -> np.ndarray:
        if axis not in ("tokens", "steps", "latency"):
            raise ValueError(f"x axis must be 'tokens', 'steps' or 'latency', not {axis!r}")
        return getattr(self, axis)


def replay_many(
    group: AnswerGroup, scores, lambdas=DEFAULT_LAMBDAS, costs: LatencyCosts | None = None, select=None
) -> StopResult:
    """Replay the stopping rule on one group for every λ in `lambdas` (Λ,), given (A,) `scores` (nan never wins)
    and the (A,) `select` that picks the output (`None`: the scores; for a stop head, `AnswerGroup.confidences`).

    The rule is `hf_msv.generation.decide_stop`, the one the generation hook applies live, so a recorded
    `MSVResult` replays to the decision it made. O(A log A + Λ·N). A group without terminal answers falls back to
    the best answer overall when λ is never reached; a group without any score outputs no answer (chosen = -1,
    counted as wrong).
    """
    lam = np.asarray(lambdas, dtype=np.float64).reshape(-1)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if s.shape[0] != group.num_answers or group.num_answers == 0:
        raise ValueError(f"need {group.num_answers} > 0 scores, got {s.shape[0]}")
    costs = costs or LatencyCosts()
    d = decide_stop(group.end, s, group.is_terminal, lam, select=select)
    steps, n_avail = d.stop_step, d.num_available
    tokens = np.minimum(steps[:, None], group.seq_len[None, :]).sum(1)
    latency = steps * costs.decode_step_s + n_avail * (costs.elicit_s + costs.verify_s)
    correct = np.where(d.chosen >= 0, group.correct[np.maximum(d.chosen, 0)], False)
    return StopResult(
        chosen=d.chosen,
        correct=correct,
        stopped=d.stopped,
        steps=steps,
        tokens=tokens,
        n_available=n_avail,
        latency=latency.astype(np.float64),
    )


def replay(group: AnswerGroup, scores, lam: float, costs: LatencyCosts | None = None, select=None) -> dict:
    """Replay one λ on one group (`select` as in `replay_many`): {"chosen", "correct", "stopped", "steps",
    "tokens", "n_available", "latency"}."""
    r = replay_many(group, scores, [lam], costs, select)
    return {k: v[0].item() for k, v in vars(r).items()}


def _replay_all(groups, scores, lambdas, costs) -> list[StopResult]:
    # A method name brings what picks its output: its stop head's confidence, else its scores.
    picks = [g.confidence_of(scores) if isinstance(scores, str) else None for g in groups]
    return [replay_many(g, s, lambdas, costs, c) for g, s, c in zip(groups, resolve_scores(groups, scores), picks)]


def _curve(results: list[StopResult], lambdas) -> TradeoffCurve:
    def mean(name):
        return np.mean([getattr(r, name) for r in results], axis=0).astype(np.float64)

    return TradeoffCurve(
        np.asarray(lambdas, np.float64).reshape(-1),
        mean("correct"),
        mean("tokens"),
        mean("steps"),
        mean("latency"),
        mean("stopped"),
    )


def tradeoff_curve(
    groups: Sequence[AnswerGroup],
    scores: str | Sequence[np.ndarray],
    lambdas=DEFAULT_LAMBDAS,
    costs: LatencyCosts | None = None,
) -> TradeoffCurve:
    """Accuracy / mean tokens / mean steps / mean latency per λ over `groups` (scores: verifier name or arrays)."""
    if not groups:
        raise ValueError("no groups")
    return _curve(_replay_all(groups, scores, lambdas, costs), lambdas)


def autc(curve: TradeoffCurve, x: str = "tokens", normalize: bool = False) -> float:
    """Area under the accuracy-vs-budget curve up to the full-decoding budget (definition in the module doc)."""
    xs, acc = curve.x(x).astype(np.float64), curve.accuracy.astype(np.float64)
    ux = np.unique(xs)
    best = np.array([acc[xs == u].max() for u in ux])
    if ux[0] > 0:
        ux, best = np.concatenate([[0.0], ux]), np.concatenate([[0.0], best])
    area = float(np.trapezoid(best, ux))
    return area / ux[-1] if normalize and ux[-1] > 0 else area


BUDGET_FRACTIONS = (0.3, 0.5, 0.7)  # matched budgets, fractions of full decoding's tokens


def budget_accuracy(curve: TradeoffCurve, fraction: float, x: str = "tokens") -> float:
    """The best accuracy on `curve` at a mean budget ``x`` ≤ `fraction` × full decoding's (the λ = ∞ point's);
    0 when no λ is that cheap."""
    xs = curve.x(x)
    ok = xs <= fraction * xs[np.argmax(curve.lambdas)] + 1e-9
    return float(curve.accuracy[ok].max()) if ok.any() else 0.0


def _min_budget(curve: TradeoffCurve, x: str, target: float) -> float:
    ok = curve.accuracy >= target - 1e-12
    return float(curve.x(x)[ok].min()) if ok.any() else math.inf


def early_stop_token_fraction(curve_msv: TradeoffCurve, curve_baseline: TradeoffCurve, x: str = "tokens") -> float:
    """Budget MSV needs to reach the baseline's peak accuracy ÷ budget the baseline needs for that peak.

    < 1 means MSV matches the baseline's best with less. Returns inf (with a warning) when MSV never reaches the
    peak, nan (with a warning) when the baseline's peak needs zero budget.
    """
    peak = float(curve_baseline.accuracy.max())
    need_base = _min_budget(curve_baseline, x, peak)
    need_msv = _min_budget(curve_msv, x, peak)
    if math.isinf(need_msv):
        warnings.warn(
            f"MSV never reaches the baseline's peak accuracy {peak:.4f} (its best is "
            f"{curve_msv.accuracy.max():.4f}); token fraction is inf",
            RuntimeWarning,
            stacklevel=2,
        )
        return math.inf
    if need_base <= 0:
        warnings.warn(
            "the baseline reaches its peak with zero budget; token fraction is undefined (nan)",
            RuntimeWarning,
            stacklevel=2,
        )
        return math.nan
    return need_msv / need_base


def select_lambda_validation(curve: TradeoffCurve, token_budget: float | None = None, x: str = "tokens") -> float:
    """λ on a curve for a budget: the most accurate λ whose mean budget ``x`` ≤ `token_budget` (ties: cheaper, then
    larger λ; the cheapest λ, with a warning, when none fits); without a budget the most accurate λ (ties: cheaper).
    Targets in accuracy and guarantees are `hf_msv.lambda_rule.choose_lambda`'s (`choose_on_groups`)."""
    xs, acc, lam = curve.x(x), curve.accuracy, curve.lambdas
    key_acc = np.lexsort((-lam, xs, -acc))  # most accurate, then cheapest, then largest λ
    if token_budget is not None:
        ok = xs <= token_budget
        if not ok.any():
            warnings.warn(f"no λ fits the budget {token_budget}; using the cheapest", RuntimeWarning, stacklevel=2)
            return float(lam[np.lexsort((-lam, -acc, xs))[0]])
        return float(lam[[i for i in key_acc if ok[i]][0]])
    return float(lam[key_acc[0]])


def choose_on_groups(
    groups: Sequence[AnswerGroup],
    scores: str | Sequence[np.ndarray],
    lambdas=DEFAULT_LAMBDAS,
    costs: LatencyCosts | None = None,
    **rule,
) -> LambdaChoice:
    """`choose_lambda` over the replay of `groups` (problems from ``problem_id``; a group without one is its own
    problem); `rule`: its keyword arguments."""
    res = _replay_all(groups, scores, lambdas, costs)
    return choose_lambda(
        lambdas,
        np.stack([r.correct for r in res]),
        np.stack([r.tokens for r in res]),
        [g.problem_id or f"group {i}" for i, g in enumerate(groups)],
        **rule,
    )


def replay_at(groups: Sequence[AnswerGroup], scores, lam: float, costs: LatencyCosts | None = None) -> StopResult:
    """One λ replayed on every group: a `StopResult` whose fields are (G,) arrays, one entry per group."""
    res = _replay_all(groups, scores, [lam], costs)
    return StopResult(*(np.concatenate([getattr(r, f) for r in res]) for f in StopResult.__dataclass_fields__))
