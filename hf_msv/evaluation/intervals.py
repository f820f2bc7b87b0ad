"""Paired comparisons of the primary MSV with each baseline: per-problem numbers (`problem_numbers`,
`problem_curves`), budgets with λ chosen on validation (`chosen_budget`) and 95 % bootstrap intervals over problems
(`metric_intervals`, `fraction_interval`, `chosen_budget_interval`, `interpolated_interval`; one resample of problems
applied to both methods), each an `Interval`. The intervals and their keys are described in ``docs/evaluation.md``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..metrics import bootstrap_interval, ece, paired_bootstrap
from .early_stop import (
    BudgetChoice,
    LatencyCosts,
    TradeoffCurve,
    choose_budget_lambda,
    early_stop_token_fraction,
    interpolated_curve,
    replay_many,
)
from .results import Interval

__all__ = [
    "AXES",
    "ProblemNumbers",
    "ProblemCurves",
    "ChosenBudget",
    "problem_numbers",
    "problem_curves",
    "chosen_budget",
    "metric_intervals",
    "fraction_interval",
    "chosen_budget_interval",
    "interpolated_interval",
]

AXES = ("steps", "tokens", "latency")  # token position t* (the paper's axis), summed tokens, latency


@dataclass
class ProblemNumbers:
    """Per-problem numbers of one method on one training seed's groups (P problems, G groups each).

    ``sq_err`` (P,) sum of squared errors over the problem's answers, ``count`` (P,) its answers,
    ``bon_p`` / ``bon_y`` (P, G) score and correctness of each group's best-of-N pick (terminal answers).
    """

    sq_err: np.ndarray
    count: np.ndarray
    bon_p: np.ndarray
    bon_y: np.ndarray


@dataclass
class ProblemCurves:
    """Per-problem early-stopping curves of one method on one training seed: every array (P, Λ), the mean over the
    problem's groups of correctness and each budget axis (`AXES`) at each λ."""

    lambdas: np.ndarray
    correct: np.ndarray
    steps: np.ndarray
    tokens: np.ndarray
    latency: np.ndarray
    stopped: np.ndarray

    def curve(self, idx=None) -> TradeoffCurve:
        """The trade-off curve over problems `idx` (all when None; repeats allowed, for the bootstrap)."""
        sel = slice(None) if idx is None else idx
        mean = lambda a: a[sel].mean(axis=0)
        return TradeoffCurve(
            self.lambdas,
            mean(self.correct),
            mean(self.tokens),
            mean(self.steps),
            mean(self.latency),
            mean(self.stopped),
        )


def _per_problem(values: np.ndarray, problem_of: np.ndarray, num_problems: int) -> np.ndarray:
    """(P, ...) mean over each problem's groups of per-group `values` (G_total, ...)."""
    total = np.zeros((num_problems,) + values.shape[1:])
    np.add.at(total, problem_of, values)
    return total / np.bincount(problem_of, minlength=num_problems).reshape((-1,) + (1,) * (values.ndim - 1))


def problem_numbers(groups, problem_of: np.ndarray, num_problems: int, method: str) -> ProblemNumbers:
    """`ProblemNumbers` of `method` over `groups` (``problem_of`` (G_total,): each group's problem, problem-major
    with the same number of groups per problem)."""
    from ..baselines import best_of_n

    claims = [g.confidence_of(method) for g in groups]
    sq = np.array([np.sum((c - g.correct) ** 2) for g, c in zip(groups, claims)])
    cnt = np.array([g.num_answers for g in groups], dtype=np.float64)
    picks = [best_of_n(c, g.is_terminal) for g, c in zip(groups, claims)]
    bp = np.array([c[i] if i >= 0 else math.nan for c, i in zip(claims, picks)])
    by = np.array([bool(g.correct[i]) if i >= 0 else False for g, i in zip(groups, picks)])
    per = len(groups) // max(num_problems, 1)
    return ProblemNumbers(
        np.bincount(problem_of, sq, num_problems),
        np.bincount(problem_of, cnt, num_problems),
        bp.reshape(num_problems, per),
        by.reshape(num_problems, per),
    )


def problem_curves(
    groups, problem_of: np.ndarray, num_problems: int, method: str, lambdas, costs: LatencyCosts | None
) -> ProblemCurves:
    """Replay the stopping rule on every group (`replay_many`) and average per problem."""
    res = [replay_many(g, g.scores[method], lambdas, costs, g.confidence_of(method)) for g in groups]
    stack = lambda name: _per_problem(
        np.array([getattr(r, name) for r in res], dtype=np.float64),
        problem_of,
        num_problems,
    )
    return ProblemCurves(
        np.asarray(lambdas, np.float64).reshape(-1),
        stack("correct"),
        stack("steps"),
        stack("tokens"),
        stack("latency"),
        stack("stopped"),
    )


def metric_intervals(
    msv: list[ProblemNumbers], base: list[ProblemNumbers], n_boot: int = 1000, seed: int = 0
) -> dict[str, Interval]:
    """Paired intervals of MSV against one baseline (module docstring), metric -> `Interval`; lists are per training
    seed."""
    count = msv[0].count
    sq_m = np.mean([x.sq_err for x in msv], axis=0) / np.maximum(count, 1)
    sq_b = np.mean([x.sq_err for x in base], axis=0) / np.maximum(count, 1)
    acc_m = np.mean([x.bon_y.mean(1) for x in msv], axis=0)
    acc_b = np.mean([x.bon_y.mean(1) for x in base], axis=0)

    def ece_diff(idx):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(
                np.mean(
                    [
                        ece(np.nan_to_num(m.bon_p[idx].ravel()), m.bon_y[idx].ravel())
                        - ece(np.nan_to_num(b.bon_p[idx].ravel()), b.bon_y[idx].ravel())
                        for m, b in zip(msv, base)
                    ]
                )
            )

    intervals = {
        "brier": paired_bootstrap(sq_m, sq_b, count, n_boot=n_boot, seed=seed),
        "brier_ratio": paired_bootstrap(sq_m, sq_b, count, statistic="ratio", n_boot=n_boot, seed=seed),
        "bon_accuracy": paired_bootstrap(acc_m, acc_b, n_boot=n_boot, seed=seed),
        "bon_ece": bootstrap_interval(ece_diff, len(count), n_boot=n_boot, seed=seed),
    }
    return {name: Interval.from_dict(interval) for name, interval in intervals.items()}


def _seed_mean(curves: list[ProblemCurves]) -> ProblemCurves:
    mean = lambda name: np.mean([getattr(c, name) for c in curves], axis=0)
    return ProblemCurves(
        curves[0].lambdas, mean("correct"), mean("steps"), mean("tokens"), mean("latency"), mean("stopped")
    )


def fraction_interval(
    msv: list[ProblemCurves], base: list[ProblemCurves], axis: str, n_boot: int = 1000, seed: int = 0
) -> Interval:
    """Paired interval of the early-stop budget fraction on `axis` (`early_stop_token_fraction`: < 1 means MSV
    reaches the baseline's peak accuracy with less); curves averaged over training seeds, then over the resampled
    problems. A resample where MSV never reaches the peak counts as ∞."""
    m, b = _seed_mean(msv), _seed_mean(base)

    def frac(idx):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return early_stop_token_fraction(m.curve(idx), b.curve(idx), axis)

    return Interval.from_dict(bootstrap_interval(frac, m.correct.shape[0], n_boot=n_boot, seed=seed))


def interpolated_interval(
    msv: list[ProblemCurves], base: list[ProblemCurves], fraction: float, n_boot: int = 1000, seed: int = 0
) -> Interval:
    """Paired interval of the difference of the interpolated curves (`interpolated_curve`, tokens) at `fraction` of
    full decoding's tokens, MSV − baseline; curves averaged over training seeds, both hulls recomputed on every
    resample of problems."""
    m, b = _seed_mean(msv), _seed_mean(base)
    interval = bootstrap_interval(
        lambda idx: interpolated_curve(m.curve(idx)).at(fraction) - interpolated_curve(b.curve(idx)).at(fraction),
        m.correct.shape[0],
        n_boot=n_boot,
        seed=seed,
    )
    return Interval.from_dict(interval)


@dataclass(frozen=True)
class ChosenBudget:
    """One method at one budget, λ chosen on each training seed's validation curve and applied to that seed's
    evaluation problems (`chosen_budget`); S training seeds, P evaluation problems.

    Attributes:
        choices: (S,) the `BudgetChoice` of each seed, made on validation.
        eval_accuracy: (S,) evaluation accuracy at each seed's λ.
        eval_fraction: (S,) evaluation tokens at that λ ÷ evaluation full decoding's: the budget realised.
        problem_accuracy: (P,) each evaluation problem's accuracy at the chosen λ, mean over seeds (what the paired
            intervals resample).
    """

    choices: tuple[BudgetChoice, ...]
    eval_accuracy: np.ndarray
    eval_fraction: np.ndarray
    problem_accuracy: np.ndarray


def _column(curves: ProblemCurves, lam: float) -> int:
    """The position of `lam` in the λ grid of `curves` (it must be there: validation and evaluation share it)."""
    hit = np.flatnonzero(curves.lambdas == lam)
    if not hit.size:
        raise ValueError(f"λ = {lam} is not on the evaluation curves' grid")
    return int(hit[0])


def chosen_budget(
    val_curves: Sequence[TradeoffCurve], eval_curves: Sequence[ProblemCurves], fraction: float
) -> ChosenBudget:
    """λ for `fraction` of full decoding's tokens chosen on each seed's validation curve (`choose_budget_lambda`),
    then read on that seed's evaluation curves at that λ alone: no other evaluation λ is looked at.

    Args:
        val_curves: (S,) the validation groups' trade-off curve per training seed.
        eval_curves: (S,) the evaluation problems' curves per training seed, on the same λ grid.
        fraction: the budget, a fraction of full decoding's tokens.

    Returns:
        The `ChosenBudget`.
    """
    if len(val_curves) != len(eval_curves) or not val_curves:
        raise ValueError(
            f"need one validation curve per seed's evaluation curves: {len(val_curves)}, {len(eval_curves)}"
        )
    choices = tuple(choose_budget_lambda(c, fraction) for c in val_curves)
    correct, realised = [], []
    for choice, pc in zip(choices, eval_curves):
        j, full = _column(pc, choice.lam), int(np.argmax(pc.lambdas))
        correct.append(pc.correct[:, j])
        full_tokens = float(pc.tokens[:, full].mean())
        realised.append(float(pc.tokens[:, j].mean()) / full_tokens if full_tokens > 0 else 0.0)
    return ChosenBudget(
        choices,
        np.array([c.mean() for c in correct]),
        np.array(realised),
        np.mean(correct, axis=0),
    )


def chosen_budget_interval(msv: ChosenBudget, base: ChosenBudget, n_boot: int = 1000, seed: int = 0) -> Interval:
    """Paired interval over evaluation problems of the accuracy difference MSV − baseline, each at its own
    validation-chosen λ (held fixed: only the problems are resampled)."""
    return Interval.from_dict(paired_bootstrap(msv.problem_accuracy, base.problem_accuracy, n_boot=n_boot, seed=seed))


def target_fraction_interval(
    msv: list[ProblemCurves], base: list[ProblemCurves], axis: str, n_boot: int = 1000, seed: int = 0
) -> Interval:
    """Paired interval of the budget fraction on `axis` MSV needs to reach the baseline's *full-decoding* accuracy
    (÷ full decoding's budget, the same for every method on the same groups; ∞ when it never does)."""
    m, b = _seed_mean(msv), _seed_mean(base)

    def frac(idx):
        mc, bc = m.curve(idx), b.curve(idx)
        xs, target = mc.x(axis), bc.accuracy[np.argmax(bc.lambdas)]
        ok = mc.accuracy >= target - 1e-12
        full = xs[np.argmax(mc.lambdas)]
        return float(xs[ok].min() / full) if ok.any() and full > 0 else math.inf

    return Interval.from_dict(bootstrap_interval(frac, m.correct.shape[0], n_boot=n_boot, seed=seed))
