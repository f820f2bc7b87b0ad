"""Calibration and best-of-N metrics on plain numpy arrays and `AnswerGroup`s.

Definitions follow the paper's appendix "Details on metrics": AUROC, Brier, NLL, ECE (J=10 equal-width bins),
best-of-N accuracy, and best-of-N ECE / Brier over the (p†, y†) pairs of the answers a verifier picks; and the
paired bootstrap over problems that turns a comparison of two methods into a 95 % interval.

The best-of-N metrics read groups duck-typed (`hf_msv.data.AnswerGroup`: ``scores``, ``labels``, ``is_terminal``),
so this module sits below `data` and imports nothing above `baselines`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .baselines import best_of_n

if TYPE_CHECKING:  # annotations only: the groups are read by attribute
    from .data.groups import AnswerGroup

__all__ = [
    "resolve_scores",
    "auroc",
    "brier",
    "nll",
    "ece",
    "reliability_bins",
    "calibration_metrics",
    "best_of_n_pairs",
    "best_of_n_accuracy",
    "best_of_n_metrics",
    "mean_std",
    "seed_stat",
    "format_mean_std",
    "bootstrap_interval",
    "paired_bootstrap",
    "bce_with_logits",
    "fold_by_problem",
    "difficulty_scores",
    "per_problem_auroc",
    "within_problem_auroc",
]


def resolve_scores(groups: Sequence[AnswerGroup], scores: str | Sequence[np.ndarray]) -> list[np.ndarray]:
    """Per-group (A,) score arrays: ``scores`` is a verifier name looked up in ``group.scores`` or the arrays.

    Args:
        groups: the answer groups.
        scores: a verifier name (a key of each ``group.scores``) or one (A,) score array per group.

    Returns:
        One float64 (A,) array per group.

    Raises:
        ValueError: if the arrays are not one (A,) array per group.
    """
    if isinstance(scores, str):
        return [g.scores[scores] for g in groups]
    out = [np.asarray(s, dtype=np.float64).reshape(-1) for s in scores]
    if len(out) != len(groups) or any(s.shape[0] != g.num_answers for s, g in zip(out, groups)):
        raise ValueError("need one (A,) score array per group")
    return out


def _py(p, y) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if p.shape != y.shape:
        raise ValueError(f"probabilities {p.shape} and labels {y.shape} differ in shape")
    if np.any((p < 0) | (p > 1)) or np.isnan(p).any():
        raise ValueError("probabilities must lie in [0, 1]")
    if np.any((y != 0) & (y != 1)):
        raise ValueError("labels must be 0/1")
    return p, y


def auroc(p, y) -> float:
    """AUROC = P[p+ > p-] + ½ P[p+ = p-] over (m,) scores `p` and 0/1 labels `y` (sklearn's `roc_auc_score`).

    Undefined when only one class is present: returns nan and warns (UndefinedMetricWarning) saying so, because a
    0.5 or 1.0 there would silently bias means over datasets where a verifier sees only correct answers.

    Args:
        p: (m,) scores.
        y: (m,) 0/1 labels.

    Returns:
        The AUROC (float), nan when only one class is present.
    """
    # scikit-learn is imported on first use: it takes about a second, which `hf-msv --help` should not pay
    from sklearn.exceptions import UndefinedMetricWarning
    from sklearn.metrics import roc_auc_score

    p = np.asarray(p, dtype=np.float64).reshape(-1)
    y = np.asarray(y).astype(bool).reshape(-1)
    if y.size == 0 or y.all() or not y.any():
        warnings.warn(
            f"AUROC is undefined: all {y.size} labels are {'positive' if y.all() and y.size else 'negative'}"
            " (need both classes); returning nan",
            UndefinedMetricWarning,
            stacklevel=2,
        )
        return math.nan
    return float(roc_auc_score(y, p))


def brier(p, y) -> float:
    """Brier score (1/m) Σ (p_i - y_i)^2 over (m,) probabilities and 0/1 labels.

    Args:
        p: (m,) probabilities in [0, 1].
        y: (m,) 0/1 labels.

    Returns:
        The Brier score (float; nan when m = 0).

    Raises:
        ValueError: if the shapes differ, a probability lies outside [0, 1] or is nan, or a label is not 0/1.
    """
    p, y = _py(p, y)
    return float(np.mean((p - y) ** 2)) if p.size else math.nan


def bce_with_logits(z, y) -> np.ndarray:
    """Per-answer binary cross-entropy (m,) of 0/1 labels under logits (m,), computed stably from the logits
    (``log(1 + e^z) - y z``): a sigmoid first would saturate and turn a confident mistake into ``inf``.

    Args:
        z: (m,) logits.
        y: (m,) 0/1 labels.

    Returns:
        (m,) float64 array of per-answer losses.
    """
    z, y = np.asarray(z, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return np.logaddexp(0.0, z) - y * z


def fold_by_problem(problems, folds: int = 2) -> np.ndarray:
    """The fold (m,) in ``0..folds-1`` of each item, by its problem: problems in order of first appearance are dealt
    round-robin, so every answer of a problem lands in one fold (answers of a problem are not independent).

    Args:
        problems: (m,) problem id of each item.
        folds: number of folds.

    Returns:
        (m,) int64 array of fold indices.
    """
    problems = np.asarray(problems, dtype=object)
    _, first, inverse = np.unique(problems, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    return rank[inverse.reshape(-1)] % folds


def difficulty_scores(labels: Sequence) -> list[np.ndarray]:
    """Per problem (a list of 0/1 label arrays), every answer scored by its problem's accuracy.

    Pooled, their AUROC is the most that any scorer giving all answers of a problem one score can reach (telling easy
    problems from hard ones and nothing else): ranking problems by accuracy orders every pair of problems the best
    way, and pairs within a problem tie. A verifier above it tells right from wrong answers of the same problem.

    Args:
        labels: one (m_i,) 0/1 label array per problem.

    Returns:
        One (m_i,) array per problem, filled with that problem's accuracy (nan for an empty problem).
    """
    return [np.full(len(y), np.mean(y) if len(y) else math.nan) for y in labels]


def per_problem_auroc(scores: Sequence, labels: Sequence) -> np.ndarray:
    """(P,) AUROC among each problem's answers: `scores[i]` and 0/1 `labels[i]` are problem i's (m_i,) arrays; nan for
    a problem whose answers are all right or all wrong (nothing to rank).

    Args:
        scores: one (m_i,) score array per problem.
        labels: one (m_i,) 0/1 label array per problem.

    Returns:
        (P,) float64 array of per-problem AUROCs.
    """
    from sklearn.metrics import roc_auc_score

    return np.array(
        [
            roc_auc_score(np.asarray(y).astype(bool), np.asarray(p, dtype=np.float64))
            if 0 < np.sum(y) < len(y)
            else math.nan
            for p, y in zip(scores, labels)
        ],
        dtype=np.float64,
    )


def within_problem_auroc(scores: Sequence, labels: Sequence) -> float:
    """Mean over problems of the AUROC among one problem's answers (problems with right and wrong answers only):
    whether a scorer tells a problem's right answers from its wrong ones, which no difficulty estimate can (nan
    when no problem has both classes). A bootstrap over problems can resample :func:`per_problem_auroc` instead of
    calling this per resample: the mean of the resampled defined values is the same number.

    Args:
        scores: one (m_i,) score array per problem.
        labels: one (m_i,) 0/1 label array per problem.

    Returns:
        The mean per-problem AUROC (float).
    """
    values = per_problem_auroc(scores, labels)
    values = values[~np.isnan(values)]
    return float(np.mean(values)) if values.size else math.nan


def nll(p, y, eps: float = 1e-7) -> float:
    """Mean negative log-likelihood of 0/1 labels under (m,) probabilities clipped to [eps, 1 - eps].

    A float32 sigmoid saturates to exactly 0 or 1; clipping keeps one confidently wrong answer finite (−log 1e-7 ≈ 16)
    instead of making the whole mean infinite.

    Args:
        p: (m,) probabilities in [0, 1].
        y: (m,) 0/1 labels.
        eps: clipping bound.

    Returns:
        The mean NLL (float; nan when m = 0).

    Raises:
        ValueError: if the shapes differ, a probability lies outside [0, 1] or is nan, or a label is not 0/1.
    """
    p, y = _py(p, y)
    p = np.clip(p, eps, 1 - eps)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p))) if p.size else math.nan


def reliability_bins(p, y, n_bins: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Equal-width reliability bins over [0, 1]: returns (conf (J,), acc (J,), count (J,)).

    Bin j holds p in [j/J, (j+1)/J), with p = 1 in the last bin. Here the "confidence" is the predicted probability of
    correctness itself (a binary verifier), as in the paper. Empty bins have nan conf/acc and count 0.

    Args:
        p: (m,) probabilities in [0, 1].
        y: (m,) 0/1 labels.
        n_bins: number of bins J.

    Returns:
        ``(conf, acc, count)``, each of shape (J,): mean probability, accuracy and size of each bin.

    Raises:
        ValueError: if the shapes differ, a probability lies outside [0, 1] or is nan, or a label is not 0/1.
    """
    p, y = _py(p, y)
    idx = np.minimum((p * n_bins).astype(np.int64), n_bins - 1)
    count = np.bincount(idx, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = np.bincount(idx, weights=p, minlength=n_bins) / count
        acc = np.bincount(idx, weights=y, minlength=n_bins) / count
    return conf, acc, count


def ece(p, y, n_bins: int = 10) -> float:
    """ECE = Σ_j |B_j|/m · |acc(B_j) − conf(B_j)| with J = `n_bins` equal-width bins (paper: J = 10).

    Args:
        p: (m,) probabilities in [0, 1].
        y: (m,) 0/1 labels.
        n_bins: number of bins J.

    Returns:
        The ECE (float; nan when m = 0).

    Raises:
        ValueError: as `reliability_bins`.
    """
    conf, acc, count = reliability_bins(p, y, n_bins)
    m = count.sum()
    if m == 0:
        return math.nan
    nz = count > 0
    return float(np.sum(count[nz] / m * np.abs(acc[nz] - conf[nz])))


def calibration_metrics(p, y, n_bins: int = 10) -> dict[str, float]:
    """{"auroc", "brier", "ece", "nll"} of (m,) probabilities against (m,) 0/1 labels.

    Args:
        p: (m,) probabilities in [0, 1].
        y: (m,) 0/1 labels.
        n_bins: number of ECE bins.

    Returns:
        A dict of the four floats.

    Raises:
        ValueError: as `brier` / `nll`.
    """
    return {"auroc": auroc(p, y), "brier": brier(p, y), "ece": ece(p, y, n_bins), "nll": nll(p, y)}


def best_of_n_pairs(
    groups: Sequence[AnswerGroup], scores: str | Sequence[np.ndarray], terminal_only: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(p† (Q,), y† (Q,)): per group, the score and correctness of the verifier's best-of-N pick.

    The pick is `hf_msv.baselines.best_of_n` over the group's terminal answers (all answers when
    ``terminal_only=False``): highest score, ties to the lowest answer index.

    Args:
        groups: Q answer groups.
        scores: a verifier name (a key of ``group.scores``) or one (A,) score array per group.
        terminal_only: pick among terminal answers only.

    Returns:
        ``(p, y)``: (Q,) float64 scores and (Q,) bool correctness of the picks.

    Raises:
        ValueError: if a group has no candidate answer, or `scores` is not one (A,) array per group.
    """
    ps, ys = [], []
    for g, s in zip(groups, resolve_scores(groups, scores)):
        i = best_of_n(s, g.is_terminal if terminal_only else None)
        if i < 0:
            raise ValueError(f"group {g.problem_id!r} has no candidate answer")
        ps.append(s[i])
        ys.append(g.correct[i])
    return np.asarray(ps, dtype=np.float64), np.asarray(ys, dtype=bool)


def best_of_n_accuracy(groups: Sequence[AnswerGroup], scores: str | Sequence[np.ndarray]) -> float:
    """Fraction of groups whose best-of-N pick (terminal answers) is correct: (1/|Q|) Σ_q y†_q.

    Args:
        groups: Q answer groups.
        scores: a verifier name (a key of ``group.scores``) or one (A,) score array per group.

    Returns:
        The accuracy (float; nan when there is no group).

    Raises:
        ValueError: as `best_of_n_pairs`.
    """
    _, y = best_of_n_pairs(groups, scores)
    return float(y.mean()) if y.size else math.nan


def best_of_n_metrics(
    groups: Sequence[AnswerGroup], scores: str | Sequence[np.ndarray], n_bins: int = 10
) -> dict[str, float]:
    """{"accuracy", "ece", "brier"} of best-of-N over terminal answers: ECE and Brier on the (p†, y†) pairs.

    Args:
        groups: Q answer groups.
        scores: a verifier name (a key of ``group.scores``) or one (A,) score array per group.
        n_bins: number of ECE bins.

    Returns:
        A dict of the three floats.

    Raises:
        ValueError: as `best_of_n_pairs`.
    """
    p, y = best_of_n_pairs(groups, scores)
    return {"accuracy": float(y.mean()) if y.size else math.nan, "ece": ece(p, y, n_bins), "brier": brier(p, y)}


def mean_std(values, ddof: int = 1) -> tuple[float, float]:
    """(mean, std) over seeds, ignoring nan; sample std (ddof=1) as for "mean ± std over five seeds"; std 0 for one.

    Args:
        values: per-seed values (flattened).
        ddof: delta degrees of freedom of the std.

    Returns:
        ``(mean, std)`` floats; both nan when no value is finite.
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return math.nan, math.nan
    return float(v.mean()), float(v.std(ddof=ddof)) if v.size > ddof else 0.0


def seed_stat(values) -> dict:
    """``{"mean", "std", "values"}`` of per-seed values (`mean_std`; nan ignored, silently), as results JSON stores
    every number.

    Args:
        values: per-seed values.

    Returns:
        ``{"mean": float, "std": float, "values": list[float]}``.
    """
    v = [float(x) for x in values]
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m, s = mean_std(v)
    return {"mean": m, "std": s, "values": v}


def format_mean_std(values, digits: int = 3) -> str:
    """The one "mean ± std" formatter of reports, e.g. "0.348 ± 0.007".

    ``values`` is a list of per-seed values (`mean_std` of them), a `seed_stat` dict (``{"mean", "std"}``, e.g. read
    back from results JSON: "—" when missing or its mean is null, a null std counts as 0), a single number (no
    "±"; "—" when nan) or None ("—").

    Args:
        values: as above.
        digits: decimals of mean and std.

    Returns:
        The formatted string.
    """
    if values is None:
        return "—"
    if isinstance(values, Mapping):
        if values.get("mean") is None:
            return "—"
        return f"{values['mean']:.{digits}f} ± {(values.get('std') or 0.0):.{digits}f}"
    if isinstance(values, (int, float)):
        return "—" if math.isnan(values) else f"{values:.{digits}f}"
    m, s = mean_std(values)
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def bootstrap_interval(
    statistic, num_problems: int, n_boot: int = 2000, confidence: float = 0.95, seed: int = 0
) -> dict:
    """Percentile bootstrap over problems: ``{"estimate", "low", "high", "n_boot"}`` of ``statistic(idx)``.

    ``statistic`` maps an index array (P,) of problems (drawn with replacement; ``arange(P)`` for the estimate) to a
    float; a comparison of two methods computes both on the *same* resampled problems, which makes it paired.
    Non-finite resamples (e.g. a fraction that is ∞ when one method never reaches a target) count as +∞ in the
    percentiles, so an interval may be unbounded above.

    Args:
        statistic: callable from a (P,) int index array to a float.
        num_problems: P.
        n_boot: number of resamples (0: the interval is nan).
        confidence: the interval's coverage, in (0, 1).
        seed: seed of the resampling generator.

    Returns:
        ``{"estimate", "low", "high", "n_boot"}``.

    Raises:
        ValueError: if `num_problems` < 1 or `confidence` is not in (0, 1).
    """
    if num_problems < 1:
        raise ValueError("the bootstrap needs at least one problem")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    rng = np.random.default_rng(seed)
    est = float(statistic(np.arange(num_problems)))
    draws = np.array([statistic(rng.integers(0, num_problems, num_problems)) for _ in range(n_boot)], dtype=float)
    draws = np.where(np.isnan(draws), np.inf, draws)
    alpha = (1 - confidence) / 2
    # order statistics, no interpolation (which would subtract ∞ from ∞); the interval is the slightly wider one
    low, high = (
        (np.quantile(draws, alpha, method="lower"), np.quantile(draws, 1 - alpha, method="higher"))
        if n_boot
        else (math.nan, math.nan)
    )
    return {"estimate": est, "low": float(low), "high": float(high), "n_boot": int(n_boot)}


def paired_bootstrap(
    a, b, weights=None, statistic: str = "difference", n_boot: int = 2000, confidence: float = 0.95, seed: int = 0
) -> dict:
    """Paired bootstrap interval over problems of method A against method B (`bootstrap_interval`).

    Args:
        a, b: (P,) per-problem values of the two methods on the same problems and groups (e.g. a problem's mean
            Brier over its answers, or its best-of-N accuracy over its groups).
        weights: (P,) per-problem weights (e.g. answers per problem, so the mean is the pooled mean over answers);
            default 1.
        statistic: "difference" (mean_A − mean_B) or "ratio" (mean_A / mean_B), means weighted by `weights`.
        n_boot, confidence, seed: as `bootstrap_interval`.

    Returns:
        ``{"estimate", "low", "high", "n_boot"}``; e.g. A's Brier is lower at 95 % when ``high < 0``.

    Raises:
        ValueError: if `a`, `b` and `weights` differ in shape, or `statistic` is unknown.
    """
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    w = np.ones_like(a) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if not (a.shape == b.shape == w.shape):
        raise ValueError(f"need one value per problem for both methods: {a.shape}, {b.shape}, weights {w.shape}")
    if statistic not in ("difference", "ratio"):
        raise ValueError(f"statistic must be 'difference' or 'ratio', not {statistic!r}")

    def stat(idx):
        ww = w[idx]
        ma, mb = (a[idx] * ww).sum() / ww.sum(), (b[idx] * ww).sum() / ww.sum()
        if statistic == "difference":
            return ma - mb
        return ma / mb if mb != 0 else math.inf

    return bootstrap_interval(stat, a.size, n_boot, confidence, seed)
