"""Replay of the paper's parallel early-stopping rule over recorded answer streams (`replay`, `replay_many`), trade-off
curves (`tradeoff_curve`), curve summaries (`autc`, `early_stop_token_fraction`, the interpolated curve
`interpolated_curve`), λ for a budget chosen on validation (`choose_budget_lambda`) and the λ rules of
`hf_msv.lambda_rule` on replayed groups (`choose_on_groups`, applied with `replay_at`), all on the one λ grid
`LAMBDAS`.

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

from ..data import AnswerGroup, StopInputs
from ..generation import decide_stop
from ..lambda_rule import LAMBDAS, LambdaChoice, choose_lambda
from ..metrics import resolve_scores

__all__ = [
    "AnswerGroup",
    "LatencyCosts",
    "StopResult",
    "TradeoffCurve",
    "LAMBDAS",
    "replay",
    "replay_many",
    "tradeoff_curve",
    "autc",
    "early_stop_token_fraction",
    "choose_on_groups",
    "replay_at",
    "BUDGET_FRACTIONS",
    "BudgetChoice",
    "choose_budget_lambda",
    "InterpolatedCurve",
    "interpolated_curve",
]


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
    group: AnswerGroup,
    scores,
    lambdas: Sequence[float] | np.ndarray = LAMBDAS,
    costs: LatencyCosts | None = None,
    select=None,
) -> StopResult:
    """Replay the stopping rule on one group for every λ in `lambdas` (Λ,). `scores` is a method name (the group's
    stop inputs for it, `AnswerGroup.stop_inputs`: its class snapshots where it is a class-level statistic, else its
    scores with its confidence picking) or (A,) scores (nan never wins) with the (A,) `select` that picks the output
    (`None`: the scores).

    The rule is `hf_msv.generation.decide_stop`, the one the generation hook applies live, so a recorded
    `MSVResult` replays to the decision it made. O(A log A + Λ·N). A group without terminal answers falls back to
    the best answer overall when λ is never reached; a group without any score outputs no answer (chosen = -1,
    counted as wrong).
    """
    lam = np.asarray(lambdas, dtype=np.float64).reshape(-1)
    if isinstance(scores, str):
        inputs = group.stop_inputs(scores)
    else:
        s = np.asarray(scores, dtype=np.float64).reshape(-1)
        if s.shape[0] != group.num_answers:
            raise ValueError(f"need {group.num_answers} > 0 scores, got {s.shape[0]}")
        inputs = StopInputs(group.end, s, group.is_terminal, s if select is None else select, None)
    if group.num_answers == 0:
        raise ValueError("need a group with answers")
    costs = costs or LatencyCosts()
    d = decide_stop(inputs.end, inputs.scores, inputs.terminal, lam, inputs.select, snapshots=inputs.snapshots)
    chosen, steps = inputs.answer_of(d.chosen), d.stop_step
    tokens = np.minimum(steps[:, None], group.seq_len[None, :]).sum(1)
    n_avail = (group.end[None, :] <= steps[:, None]).sum(1)  # answers elicited and scored by t*
    latency = steps * costs.decode_step_s + n_avail * (costs.elicit_s + costs.verify_s)
    correct = np.where(chosen >= 0, group.correct[np.maximum(chosen, 0)], False)
    return StopResult(
        chosen=chosen,
        correct=correct,
        stopped=d.stopped,
        steps=steps,
        tokens=tokens,
        n_available=n_avail,
        latency=latency.astype(np.float64),
    )


def replay(
    group: AnswerGroup, scores, lam: float, costs: LatencyCosts | None = None, select=None
) -> dict[str, int | float | bool]:
    """Replay one λ on one group (`scores`, `select` as in `replay_many`): {"chosen", "correct", "stopped", "steps",
    "tokens", "n_available", "latency"}."""
    r = replay_many(group, scores, [lam], costs, select)
    return {k: v[0].item() for k, v in vars(r).items()}


def _replay_all(groups, scores, lambdas, costs) -> list[StopResult]:
    # A method name brings its stop inputs: class snapshots, or its scores with its confidence picking the output.
    per_group = [scores] * len(groups) if isinstance(scores, str) else resolve_scores(groups, scores)
    return [replay_many(g, s, lambdas, costs) for g, s in zip(groups, per_group)]


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
    lambdas=LAMBDAS,
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


BUDGET_FRACTIONS = (0.3, 0.5, 0.7)  # budgets reported, fractions of full decoding's tokens
_BUDGET_SLACK = 1e-9  # a λ exactly at the budget fits despite float rounding of the means


@dataclass(frozen=True)
class InterpolatedCurve:
    """Upper concave hull of a curve's operating points (budget fraction of full decoding, accuracy), (0, 0) included:
    what a randomised mix of two λ (one per problem, drawn with fixed odds) realises in expectation. A curve
    summary of the curve it is read from, not a budgeted accuracy: no λ is chosen.

    Attributes:
        fraction: (K,) the hull's vertices' budget fractions, ascending, 0 first.
        accuracy: (K,) their accuracies.
    """

    fraction: np.ndarray
    accuracy: np.ndarray

    def at(self, budget: float) -> float:
        """The best accuracy a mix of two operating points realises at a mean budget ≤ `budget` (a fraction of full
        decoding's): the hull at `budget`, flat past its peak, so non-decreasing in `budget`."""
        return float(np.interp(budget, self.fraction, np.maximum.accumulate(self.accuracy)))


def _upper_hull(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of the upper concave hull of the points (xs, ys), ascending in x (monotone chain)."""
    ux, inverse = np.unique(xs, return_inverse=True)
    uy = np.full(ux.shape, -np.inf)
    np.maximum.at(uy, inverse, ys)  # equal budgets: the best accuracy
    hull: list[tuple[float, float]] = []
    for p in zip(ux.tolist(), uy.tolist()):
        # drop the last vertex while it lies on or under the chord from the one before it to p
        while len(hull) >= 2 and (
            (hull[-1][0] - hull[-2][0]) * (p[1] - hull[-2][1]) - (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0])
            >= 0
        ):
            hull.pop()
        hull.append(p)
    hx, hy = zip(*hull)
    return np.array(hx), np.array(hy)


def interpolated_curve(curve: TradeoffCurve, x: str = "tokens") -> InterpolatedCurve:
    """The `InterpolatedCurve` of `curve` on axis `x`, budgets as fractions of full decoding's (the λ = ∞ point's).

    Args:
        curve: a λ sweep containing full decoding.
        x: the budget axis (``"tokens"``, ``"steps"`` or ``"latency"``).

    Returns:
        The hull; answering nothing at no cost, (0, 0), is one of its points, so it is defined at every budget.
    """
    xs = curve.x(x).astype(np.float64)
    full = float(xs[np.argmax(curve.lambdas)])
    fraction = xs / full if full > 0 else np.zeros_like(xs)
    hx, hy = _upper_hull(np.r_[0.0, fraction], np.r_[0.0, curve.accuracy.astype(np.float64)])
    return InterpolatedCurve(hx, hy)


@dataclass(frozen=True)
class BudgetChoice:
    """λ chosen on one curve (the validation groups') for a budget: `choose_budget_lambda`.

    Attributes:
        fraction: the budget, a fraction of full decoding's mean budget.
        lam: the chosen λ (∞: full decoding).
        index: its position in the curve's λ grid.
        accuracy: the curve's accuracy at it.
        used_fraction: its mean budget ÷ full decoding's (≤ `fraction` when `fits`).
        fits: whether some λ fit the budget (False: the cheapest λ was taken).
    """

    fraction: float
    lam: float
    index: int
    accuracy: float
    used_fraction: float
    fits: bool


def _select_index(curve: TradeoffCurve, token_budget: float, x: str) -> int | None:
    """Index of the most accurate λ with mean budget ``x`` ≤ `token_budget` (ties: cheaper, then larger λ); None
    when no λ fits."""
    xs, acc, lam = curve.x(x), curve.accuracy, curve.lambdas
    order = np.lexsort((-lam, xs, -acc))  # most accurate, then cheapest, then largest λ
    order = order[xs[order] <= token_budget]
    return int(order[0]) if order.size else None


def choose_budget_lambda(curve: TradeoffCurve, fraction: float, x: str = "tokens") -> BudgetChoice:
    """The most accurate λ of `curve` whose mean budget ``x`` ≤ `fraction` × full decoding's (ties: cheaper, then
    larger λ); the cheapest λ (``fits`` False) when none is that cheap. Only `curve` is read: give it the
    validation groups' curve and apply the λ to evaluation.

    Args:
        curve: a λ sweep containing full decoding.
        fraction: the budget, a fraction of full decoding's.
        x: the budget axis.

    Returns:
        The `BudgetChoice`.
    """
    xs = curve.x(x)
    full = float(xs[np.argmax(curve.lambdas)])
    index = _select_index(curve, fraction * full + _BUDGET_SLACK, x)
    fits = index is not None
    if index is None:
        index = int(np.lexsort((-curve.lambdas, -curve.accuracy, xs))[0])
    return BudgetChoice(
        fraction=float(fraction),
        lam=float(curve.lambdas[index]),
        index=index,
        accuracy=float(curve.accuracy[index]),
        used_fraction=float(xs[index] / full) if full > 0 else 0.0,
        fits=fits,
    )


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


def choose_on_groups(
    groups: Sequence[AnswerGroup],
    scores: str | Sequence[np.ndarray],
    lambdas=LAMBDAS,
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
