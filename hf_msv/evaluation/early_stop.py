"""Replay of the paper's parallel early-stopping rule over recorded answer streams (`replay`, `replay_many`), trade-off
curves (`tradeoff_curve`), AUTC (`autc`) and the λ rules (`select_lambda_validation`, `select_lambda_ltt`).

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

from ..generation import decide_stop
from ..data import AnswerGroup
from ..metrics import resolve_scores

__all__ = [
    "AnswerGroup", "LatencyCosts", "StopResult", "TradeoffCurve", "LTTResult", "DEFAULT_LAMBDAS", "replay",
    "replay_many", "tradeoff_curve", "autc", "early_stop_token_fraction", "select_lambda_validation",
    "select_lambda_ltt", "ltt_p_values",
]

# 0..1 in 0.01 steps plus ∞ (never stop), so every curve contains the full-decoding point that bounds AUTC.
DEFAULT_LAMBDAS = np.concatenate([np.linspace(0.0, 1.0, 101), [np.inf]])


@dataclass(frozen=True)
class LatencyCosts:
    """Measured per-unit costs in seconds: one shared CoT decode step, eliciting one answer, scoring one answer."""

    decode_step_s: float = 0.0
    elicit_s: float = 0.0
    verify_s: float = 0.0


@dataclass(frozen=True)
class StopResult:
    """Per-λ replay outcome of one group; every field has shape (Λ,)."""

    chosen: np.ndarray       # int, answer index output
    correct: np.ndarray      # bool
    stopped: np.ndarray      # bool, λ was reached (False: ran to completion, best terminal answer)
    steps: np.ndarray        # int, t*
    tokens: np.ndarray       # int, Σ_n min(t*, seq_len[n])
    n_available: np.ndarray  # int, answers with end ≤ t*
    latency: np.ndarray      # float seconds


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


def replay_many(group: AnswerGroup, scores, lambdas=DEFAULT_LAMBDAS, costs: LatencyCosts | None = None) -> StopResult:
    """Replay the stopping rule on one group for every λ in `lambdas` (Λ,), given (A,) `scores` (nan never wins).

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
    d = decide_stop(group.end, s, group.is_terminal, lam)
    steps, n_avail = d.stop_step, d.num_available
    tokens = np.minimum(steps[:, None], group.seq_len[None, :]).sum(1)
    latency = steps * costs.decode_step_s + n_avail * (costs.elicit_s + costs.verify_s)
    correct = np.where(d.chosen >= 0, group.correct[np.maximum(d.chosen, 0)], False)
    return StopResult(chosen=d.chosen, correct=correct, stopped=d.stopped, steps=steps, tokens=tokens,
                      n_available=n_avail, latency=latency.astype(np.float64))


def replay(group: AnswerGroup, scores, lam: float, costs: LatencyCosts | None = None) -> dict:
    """Replay one λ on one group: {"chosen", "correct", "stopped", "steps", "tokens", "n_available", "latency"}."""
    r = replay_many(group, scores, [lam], costs)
    return {k: v[0].item() for k, v in vars(r).items()}


def _replay_all(groups, scores, lambdas, costs) -> list[StopResult]:
    return [replay_many(g, s, lambdas, costs) for g, s in zip(groups, resolve_scores(groups, scores))]


def _curve(results: list[StopResult], lambdas) -> TradeoffCurve:
    def mean(name):
        return np.mean([getattr(r, name) for r in results], axis=0).astype(np.float64)

    return TradeoffCurve(np.asarray(lambdas, np.float64).reshape(-1), mean("correct"), mean("tokens"), mean("steps"),
                         mean("latency"), mean("stopped"))


def tradeoff_curve(groups: Sequence[AnswerGroup], scores: str | Sequence[np.ndarray], lambdas=DEFAULT_LAMBDAS,
                   costs: LatencyCosts | None = None) -> TradeoffCurve:
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
        warnings.warn(f"MSV never reaches the baseline's peak accuracy {peak:.4f} (its best is "
                      f"{curve_msv.accuracy.max():.4f}); token fraction is inf", RuntimeWarning, stacklevel=2)
        return math.inf
    if need_base <= 0:
        warnings.warn("the baseline reaches its peak with zero budget; token fraction is undefined (nan)",
                      RuntimeWarning, stacklevel=2)
        return math.nan
    return need_msv / need_base


def select_lambda_validation(curve: TradeoffCurve, token_budget: float | None = None,
                             target_accuracy: float | None = None, x: str = "tokens") -> float:
    """λ picked on a validation curve (the paper: "selected via cross-validation to target an operating point").

    * ``token_budget``: the most accurate λ whose mean budget ``x`` ≤ token_budget (ties: cheaper, then larger λ);
    * ``target_accuracy``: the cheapest λ whose validation accuracy ≥ target (ties: more accurate, then larger λ);
    * neither: the most accurate λ (ties: cheaper).
    When nothing qualifies it warns and falls back to the cheapest λ (budget) or, for a target, the closest
    trade-off that stops early: the most accurate λ cheaper than full decoding (λ = ∞ only when none is).
    """
    if token_budget is not None and target_accuracy is not None:
        raise ValueError("give token_budget or target_accuracy, not both")
    xs, acc, lam = curve.x(x), curve.accuracy, curve.lambdas
    key_acc = np.lexsort((-lam, xs, -acc))               # most accurate, then cheapest, then largest λ
    if token_budget is not None:
        ok = xs <= token_budget
        if not ok.any():
            warnings.warn(f"no λ fits the budget {token_budget}; using the cheapest", RuntimeWarning, stacklevel=2)
            return float(lam[np.lexsort((-lam, -acc, xs))[0]])
        return float(lam[[i for i in key_acc if ok[i]][0]])
    if target_accuracy is not None:
        ok = acc >= target_accuracy - 1e-12
        if not ok.any():
            # The closest trade-off that still stops early: the most accurate λ cheaper than full decoding.
            stops = np.isfinite(lam) & (xs < xs[np.argmax(lam)])
            pick = [i for i in key_acc if stops[i]] or list(key_acc)
            warnings.warn(f"no λ reaches accuracy {target_accuracy}; using the closest trade-off that stops early, "
                          f"λ = {lam[pick[0]]} (accuracy {acc[pick[0]]:.4f})", RuntimeWarning, stacklevel=2)
            return float(lam[pick[0]])
        key_cheap = np.lexsort((-lam, -acc, xs))
        return float(lam[[i for i in key_cheap if ok[i]][0]])
    return float(lam[key_acc[0]])


def ltt_p_values(n_correct: np.ndarray, n: int, target_accuracy: float, method: str = "binomial") -> np.ndarray:
    """p-values for H0(λ): accuracy(λ) < target, from `n_correct` (Λ,) correct outputs out of `n` groups.

    With risk α = 1 − target and k errors: binomial tail p = P[Bin(n, α) ≤ k] (exact); Hoeffding
    p = exp(−2n·(α − k/n)₊²). Both are valid (super-uniform) under any risk > α since the tail shrinks as risk grows.
    """
    from scipy.stats import binom

    alpha = 1.0 - target_accuracy
    k = n - np.asarray(n_correct, dtype=np.int64)
    if method == "binomial":
        return binom.cdf(k, n, alpha)
    if method == "hoeffding":
        return np.exp(-2.0 * n * np.maximum(alpha - k / n, 0.0) ** 2)
    raise ValueError(f"unknown p-value method {method!r}")


@dataclass(frozen=True)
class LTTResult:
    """Risk-controlled λ. ``certified`` is False when even the first (largest) λ is not rejected; then ``lam`` = ∞
    (full decoding) and nothing is guaranteed. Eval fields are nan without an evaluation split."""

    lam: float
    certified: bool
    lambdas: np.ndarray      # (Λ,) tested order, high -> low
    p_values: np.ndarray     # (Λ,)
    val_accuracy: float
    val_tokens: float
    eval_accuracy: float = math.nan
    eval_tokens: float = math.nan
    eval_latency: float = math.nan


def select_lambda_ltt(val_groups: Sequence[AnswerGroup], val_scores: str | Sequence[np.ndarray],
                      target_accuracy: float, delta: float = 0.1, lambdas=DEFAULT_LAMBDAS, method: str = "binomial",
                      eval_groups: Sequence[AnswerGroup] | None = None,
                      eval_scores: str | Sequence[np.ndarray] | None = None,
                      costs: LatencyCosts | None = None) -> LTTResult:
    """Learn-then-Test (Angelopoulos et al., 2021) with fixed-sequence testing: the cheapest λ whose accuracy is
    ≥ `target_accuracy` with probability ≥ 1 − `delta` over the draw of the validation problems.

    λs are tested from high to low (high λ stops later, so it is the likeliest to meet the target; stopping time and
    tokens are non-decreasing in λ) at level δ each, stopping at the first non-rejection; the family-wise error is
    ≤ δ without a multiplicity correction. Among rejected λ the last (lowest) one is the cheapest. Accuracy here is
    per problem (the output answer is correct), i.e. a {0,1} loss. Optionally replays the chosen λ on an
    evaluation split.
    """
    lam = np.sort(np.unique(np.asarray(lambdas, dtype=np.float64)))[::-1]
    res = _replay_all(val_groups, val_scores, lam, costs)
    n_correct = np.sum([r.correct for r in res], axis=0)
    p = ltt_p_values(n_correct, len(res), target_accuracy, method)
    rejected = np.cumprod(p <= delta).astype(bool)       # fixed sequence: stop at the first failure
    certified = bool(rejected.any())
    i = int(np.flatnonzero(rejected)[-1]) if certified else 0
    chosen = float(lam[i]) if certified else math.inf
    hit = np.flatnonzero(lam == chosen)                   # λ = ∞ is usually in the grid; replay it otherwise
    vc = _curve(res, lam) if hit.size else tradeoff_curve(val_groups, val_scores, [chosen], costs)
    vi = int(hit[0]) if hit.size else 0
    out = dict(lam=chosen, certified=certified, lambdas=lam, p_values=p,
               val_accuracy=float(vc.accuracy[vi]), val_tokens=float(vc.tokens[vi]))
    if eval_groups is not None:
        ev = tradeoff_curve(eval_groups, eval_scores if eval_scores is not None else val_scores, [chosen], costs)
        out |= dict(eval_accuracy=float(ev.accuracy[0]), eval_tokens=float(ev.tokens[0]),
                    eval_latency=float(ev.latency[0]))
    return LTTResult(**out)
