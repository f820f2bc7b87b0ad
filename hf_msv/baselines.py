"""Verifier-free and aggregation baselines of the paper, on plain per-group numpy arrays.

All functions score the answers of ONE group (one problem, N sequences); arrays are aligned by answer index (A,).

* `self_consistency` — vote fraction among the N terminal answers (Wang et al., 2022).
* `weighted_voting` / `streaming_weighted_voting` — WV (Li et al., 2022), paper appendix "Aggregation Baselines".
* `token_prob_score` — geometric mean of the answer-token probabilities (Token-Probs).
* `token_confidence`, `deepconf_confidence`, `deepconf_streaming` — DeepConf's trace confidence
  (Fu et al., 2025, "Deep Think with Confidence", arXiv:2508.15260); `fit_platt`/`platt` map it to [0, 1].
* `latest_answer_vote` — the streaming vote over each sequence's *latest available* answer (γ without a verifier),
  from `chain_support`: per answer, how many chains stand by its class and how many have answered (the counts the
  stopping rules of `hf_msv.stop_rules` read too).
* `fit_logistic` / `logistic` — logistic regression on a few features: calibrated self-consistency (Platt on the
  vote share) and the stacked baseline (vote share and a Probe logit).
* `best_of_n` — argmax selection with deterministic ties.
* `WV_THRESHOLD` — the default R of streaming weighted voting, for every caller.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "WV_THRESHOLD",
    "best_of_n",
    "self_consistency",
    "weighted_voting",
    "streaming_weighted_voting",
    "token_prob_score",
    "token_confidence",
    "deepconf_confidence",
    "deepconf_streaming",
    "fit_platt",
    "platt",
    "latest_answer_vote",
    "fit_logistic",
    "logistic",
    "logit",
    "arrival_times",
    "chain_counts",
    "chain_support",
    "steady_classes",
]


def best_of_n(scores, mask=None) -> int:
    """Index of the highest-scoring answer among `mask` (A,) bool (all when None); -1 if there is none.

    Ties go to the lowest answer index (np.argmax keeps the first maximum), so picks are reproducible;
    nan scores never win.

    Args:
        scores: (A,) per-answer scores.
        mask: (A,) bool, the candidate answers; `None`: all.

    Returns:
        The index (int) of the pick, or -1.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    s = np.where(np.isnan(s), -np.inf, s)
    ok = np.ones(s.shape, bool) if mask is None else np.asarray(mask, bool).reshape(-1)
    if not ok.any():
        return -1
    return int(np.flatnonzero(ok)[np.argmax(s[ok])])


def _inverse(klass) -> tuple[np.ndarray, int]:
    _, inv = np.unique(np.asarray(klass).reshape(-1), return_inverse=True)
    return inv.reshape(-1), int(inv.max()) + 1 if inv.size else 0


def self_consistency(klass, is_terminal=None) -> np.ndarray:
    """(A,) vote fraction: s = Σ_m 1[a ~ a^(m)] / N over the N terminal answers (`is_terminal` (A,); all if None).

    Non-terminal answers get the vote fraction of their class among the terminal answers too.

    Args:
        klass: (A,) equivalence-class ids of one group.
        is_terminal: (A,) bool, the answers that vote; `None`: all.

    Returns:
        (A,) float vote fractions (all 0 when no answer votes).
    """
    inv, c = _inverse(klass)
    term = np.ones(inv.shape, bool) if is_terminal is None else np.asarray(is_terminal, bool).reshape(-1)
    n = term.sum()
    votes = np.bincount(inv[term], minlength=c)
    return votes[inv] / n if n else np.zeros(inv.shape)


WV_THRESHOLD = 16
"""R of streaming weighted voting: an answer's class share is used only once more than R answers are available at
its end (`streaming_weighted_voting`). The default of the evaluation, the weighted-vote scorer and the MSV's vote
pathway alike."""


def weighted_voting(scores, klass, mask=None, rows=None) -> np.ndarray:
    """WV probability: class mass Σ_{b ~ a} p_b normalised over classes, Σ over answers in `mask` (all if None).

    Best-of-N on these is weighted best-of-N (the class with the largest summed probability). If every score is 0
    the classes carry no mass and all answers get 0.

    Args:
        scores, klass: `(A,)` per-answer probabilities and class ids of one group.
        mask: `(A,)` bool, the answers that vote (e.g. the terminal ones); `None`: all.
        rows: indices of the answers to return (online scoring of new answers); `None`: all.

    Returns:
        `(A,)` float (or `(len(rows),)`).
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    inv, c = _inverse(klass)
    m = np.ones(s.shape, bool) if mask is None else np.asarray(mask, bool).reshape(-1)
    mass = np.bincount(inv[m], weights=s[m], minlength=c)
    total = mass.sum()
    out = mass[inv] / total if total > 0 else np.zeros(s.shape)
    return out if rows is None else out[np.asarray(rows, dtype=int)]


def streaming_weighted_voting(scores, klass, end, R: int = WV_THRESHOLD, rows=None) -> np.ndarray:
    """Streaming WV: for answer a, aggregate over the answers available when a is (end_b ≤ end_a, a included).

    Only when more than R candidates are available (count > R) is WV applied; otherwise a keeps its own score,
    because normalising over a handful of early candidates gives, e.g., the very first answer probability 1.
    "Before time τ" in the paper is read as availability at a's own availability time τ+L, the same causal rule
    the MSV masks and γ use. Costs O(A²) memory (O(len(rows)·A) with `rows`), fine for A ≲ 10⁴.

    Args:
        scores, klass, end: `(A,)` per-answer probabilities, class ids and availability times of one group.
        R: the availability count above which the vote applies.
        rows: indices of the answers to return (online scoring of new answers); `None`: all.

    Returns:
        `(A,)` float (or `(len(rows),)`).
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    e = np.asarray(end).reshape(-1)
    inv, _ = _inverse(klass)
    at = np.arange(len(s)) if rows is None else np.asarray(rows, dtype=int)
    avail = e[None, :] <= e[at, None]  # (rows, A): row a sees column b
    same = avail & (inv[None, :] == inv[at, None])
    num, den = same @ s, avail @ s
    with np.errstate(invalid="ignore", divide="ignore"):
        wv = np.where(den > 0, num / den, 0.0)
    return np.where(avail.sum(1) > R, wv, s[at])


def token_prob_score(token_logprobs, token_answer, num_answers: int | None = None) -> np.ndarray:
    """(A,) Token-Probs: geometric mean of answer-token probabilities, s = exp(mean_i log p(a_i | <a_i)).

    Args:
        token_logprobs: (T,) log-probability of each answer token under the LM, answers packed.
        token_answer: (T,) answer index in [0, A) of each token.
        num_answers: A (default max(token_answer) + 1). Answers without tokens get nan.

    Returns:
        (A,) float64 scores.
    """
    lp = np.asarray(token_logprobs, dtype=np.float64).reshape(-1)
    ta = np.asarray(token_answer, dtype=np.int64).reshape(-1)
    a = int(ta.max()) + 1 if num_answers is None else num_answers
    n = np.bincount(ta, minlength=a)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.exp(np.bincount(ta, weights=lp, minlength=a) / n)


def token_confidence(topk_logprobs) -> np.ndarray:
    """(T,) DeepConf token confidence C_i = −(1/k) Σ_{j≤k} log P_i(j) from (T, k) top-k log-probs of the CoT.

    High when the model is sure: the top-1 log-prob is ≈ 0 but the other k−1 are very negative.

    Args:
        topk_logprobs: (T, k) top-k log-probabilities of each CoT token.

    Returns:
        (T,) float64 token confidences.
    """
    return -np.asarray(topk_logprobs, dtype=np.float64).mean(axis=-1)


def _window_means(conf: np.ndarray, window: int) -> np.ndarray:
    cs = np.concatenate([[0.0], np.cumsum(conf)])
    return (cs[window:] - cs[:-window]) / window  # (T - window + 1,) means of conf[i:i+window]


def deepconf_confidence(
    topk_logprobs, window: int = 2048, stat: str = "lowest_group", bottom_frac: float = 0.1
) -> float:
    """DeepConf trace confidence (raw, ≥ 0) of one chain of thought from its (T, k) top-k log-probs.

    Group confidences C_G are means of `token_confidence` over sliding windows of `window` tokens (DeepConf: 2048,
    k = 20); a trace shorter than one window is one group. ``stat``:
    "lowest_group" (default; DeepConf's C_least = min_G C_G), "bottom10" (mean of the lowest `bottom_frac` of group
    confidences), "tail" (mean over the last `window` tokens), "mean" (mean token confidence). Empty trace -> 0.

    Args:
        topk_logprobs: (T, k) top-k log-probabilities of the chain's tokens.
        window: group size in tokens.
        stat: one of the statistics above.
        bottom_frac: fraction of groups averaged by "bottom10".

    Returns:
        The trace confidence (float).

    Raises:
        ValueError: if `stat` is unknown.
    """
    if stat not in ("lowest_group", "bottom10", "tail", "mean"):
        raise ValueError(f"unknown DeepConf statistic {stat!r}")
    conf = token_confidence(topk_logprobs).reshape(-1)
    if conf.size == 0:
        return 0.0
    if stat == "mean":
        return float(conf.mean())
    if stat == "tail":
        return float(conf[-window:].mean())
    g = _window_means(conf, window) if conf.size >= window else conf.mean(keepdims=True)
    if stat == "lowest_group":
        return float(g.min())
    return float(np.sort(g)[: max(1, int(np.ceil(bottom_frac * g.size)))].mean())


def deepconf_streaming(
    token_conf: Sequence[np.ndarray], sequence, start, window: int = 2048, stat: str = "lowest_group"
) -> np.ndarray:
    """(A,) raw DeepConf confidence of each answer's CoT prefix: sequence n's tokens [0, τ) when the answer fired.

    Args:
        token_conf: per sequence n, (T_n,) `token_confidence` of its chain of thought.
        sequence, start: (A,) sequence index and τ of each answer.
        window: group size in tokens.
        stat: "lowest_group", "tail" or "mean" (prefix versions of `deepconf_confidence`). Empty prefix -> 0.

    Returns:
        (A,) float64 confidences.

    Raises:
        ValueError: if `stat` is unknown.
    """
    seq = np.asarray(sequence, dtype=np.int64).reshape(-1)
    tau = np.asarray(start, dtype=np.int64).reshape(-1)
    out = np.zeros(seq.shape, dtype=np.float64)
    for n in np.unique(seq):
        c = np.asarray(token_conf[n], dtype=np.float64).reshape(-1)
        cs = np.concatenate([[0.0], np.cumsum(c)])
        rows = np.flatnonzero(seq == n)
        t = np.minimum(tau[rows], c.size)
        with np.errstate(invalid="ignore", divide="ignore"):
            prefix_mean = np.where(t > 0, cs[t] / np.maximum(t, 1), 0.0)
        if stat == "mean":
            out[rows] = prefix_mean
            continue
        if stat == "tail":
            lo = np.maximum(t - window, 0)
            out[rows] = np.where(t > 0, (cs[t] - cs[lo]) / np.maximum(t - lo, 1), 0.0)
            continue
        if stat != "lowest_group":
            raise ValueError(f"unknown streaming DeepConf statistic {stat!r}")
        run_min = np.minimum.accumulate(_window_means(c, window)) if c.size >= window else np.zeros(0)
        # windows fully inside [0, t) are those starting at i ≤ t - window
        full = t >= window
        out[rows] = prefix_mean
        out[rows[full]] = run_min[t[full] - window]
    return out


def fit_platt(raw, labels) -> tuple[float, float]:
    """(a, b) of Platt scaling σ(a·raw + b) fitted by logistic regression on validation (raw (m,), labels (m,)).

    Args:
        raw: (m,) raw confidences.
        labels: (m,) 0/1 correctness.

    Returns:
        ``(a, b)`` floats; with one class only, a = 0 and b the logit of the (clipped) base rate.
    """
    coef, intercept = fit_logistic(np.asarray(raw, dtype=np.float64).reshape(-1, 1), labels)
    return float(coef[0]), intercept


def platt(raw, a: float, b: float) -> np.ndarray:
    """σ(a·raw + b): map raw confidences (e.g. DeepConf C_least) to probabilities in (0, 1).

    Args:
        raw: raw confidences, any shape.
        a, b: the Platt parameters (`fit_platt`).

    Returns:
        Probabilities of the shape of `raw`.
    """
    return 1.0 / (1.0 + np.exp(-(a * np.asarray(raw, dtype=np.float64) + b)))


def latest_answer_vote(klass, sequence, step, end) -> np.ndarray:
    """(A,) streaming vote share of each answer a at its availability time t = end_a: among the sequences with an
    answer available at t (end_b ≤ t), the share whose latest available answer (largest step) is in a's class.

    Each sequence votes once, with the answer it currently stands by, so superseded answers do not count (unlike
    `streaming_weighted_voting`, which pools every earlier answer). This is the agreement feature γ that
    `hf_msv.modeling_msv.compute_gamma` feeds the MSV (same tie rule: within a sequence the largest step wins), here
    as a baseline: `chain_support` over the chains that have answered. In a group of terminal answers only, it is
    self-consistency's vote share.

    Args:
        klass: (A,) equivalence-class ids.
        sequence: (A,) sequence index of each answer.
        step: (A,) answer step within its sequence.
        end: (A,) end time τ + L.

    Returns:
        (A,) float vote shares.
    """
    support, answered = chain_support(klass, sequence, step, end)
    return support / np.maximum(answered, 1)


def chain_support(klass, sequence, step, end, window: int = 1, only=None) -> tuple[np.ndarray, np.ndarray]:
    """Per answer a, at its time end_a: how many chains stand by a's class, and how many have answered.

    A chain stands by a class when its last `window` available answers (largest steps among end_b ≤ end_a) all
    belong to it; with ``window=1`` that is its latest answer.

    Args:
        klass, sequence, step, end: (A,) ints: equivalence class, chain, answer step within its chain, end time.
        window: how many of a chain's latest answers must agree (≥ 1).
        only: indices of the answers whose values are needed (the others may be left at 0); `None`: all.

    Returns:
        (support (A,), answered (A,)) ints.
    """
    support, answered, _ = chain_counts(klass, sequence, step, end, window, only)
    return support, answered


def arrival_times(end: np.ndarray, only=None) -> np.ndarray:
    """The distinct availability times of the answers `only` (all if `None`), ascending.

    Args:
        end: (A,) end times of the answers.
        only: indices of the answers to consider; `None`: all.

    Returns:
        The sorted distinct times (1-D array).
    """
    return np.unique(end if only is None else end[np.asarray(only, dtype=np.int64)])


def chain_counts(klass, sequence, step, end, window: int, only=None) -> tuple[np.ndarray, ...]:
    """`chain_support` plus (A,) the runner-up: the most chains standing by one class other than a's.

    Args:
        klass, sequence, step, end, window, only: as `chain_support`.

    Returns:
        ``(support, answered, runner_up)``, each an (A,) int64 array.

    Raises:
        ValueError: if `window` < 1.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    klass, sequence, step, end = (np.asarray(x, dtype=np.int64).reshape(-1) for x in (klass, sequence, step, end))
    support, answered, runner_up = (np.zeros(klass.size, np.int64) for _ in range(3))
    by_chain = np.lexsort((np.arange(klass.size), step, sequence))  # chain-major, then step: runs of one chain
    for t in arrival_times(end, only):
        avail = by_chain[end[by_chain] <= t]
        chains, _, steady = steady_classes(avail, sequence, klass, window)
        held, count = np.unique(steady, return_counts=True)  # steady chains' classes
        now = np.flatnonzero(end == t)
        mine = (held[None, :] == klass[now, None]) * count[None, :]  # (now, classes)
        support[now] = mine.sum(1)
        others = np.where(held[None, :] == klass[now, None], 0, count[None, :])
        runner_up[now] = others.max(1) if held.size else 0
        answered[now] = chains.size
    return support, answered, runner_up


def steady_classes(avail, sequence, klass, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of the available answers `avail` (indices in chain-major, then step order): the chains that have answered,
    each one's latest answer, and the class of every chain whose last `window` answers all are that class.

    Args:
        avail: indices of the available answers, chain-major then step.
        sequence, klass: (A,) chain and class of every answer.
        window: how many of a chain's latest answers must agree (≥ 1).

    Returns:
        ``(chains, latest, steady)``: 1-D int arrays.
    """
    chains, first, length = np.unique(sequence[avail], return_index=True, return_counts=True)
    run = np.repeat(np.arange(chains.size), length)
    tail = np.arange(avail.size) >= np.repeat(first + length - window, length)  # each chain's last `window`
    low = np.full(chains.size, np.iinfo(np.int64).max)
    high = np.full(chains.size, np.iinfo(np.int64).min)
    np.minimum.at(low, run[tail], klass[avail][tail])
    np.maximum.at(high, run[tail], klass[avail][tail])
    return chains, avail[first + length - 1], low[(length >= window) & (low == high)]


def logit(p, eps: float = 1e-6) -> np.ndarray:
    """log(p / (1 − p)) of probabilities clipped to [eps, 1 − eps].

    Args:
        p: probabilities, any shape.
        eps: clipping bound.

    Returns:
        Logits of the shape of `p`.
    """
    q = np.clip(np.asarray(p, dtype=np.float64), eps, 1 - eps)
    return np.log(q) - np.log1p(-q)


def fit_logistic(features, labels, penalty: float = 1e-6) -> tuple[np.ndarray, float]:
    """(coef (F,), intercept) of a logistic regression of 0/1 `labels` (m,) on `features` (m, F), (almost)
    unregularised by default: Platt scaling when F = 1, the stacked baseline when F = 2. One class only: zero
    weights and the base rate (clipped) as intercept.

    Args:
        features: (m, F) features (a 1-D array is one feature).
        labels: (m,) 0/1 labels.
        penalty: the ridge ½ · penalty · ‖coef‖² (sklearn's 1 / C).

    Returns:
        ``(coef, intercept)``: (F,) float64 weights and a float.
    """
    from sklearn.linear_model import LogisticRegression

    x = np.asarray(features, dtype=np.float64)
    x = x.reshape(len(x), -1)
    y = np.asarray(labels, dtype=bool).reshape(-1)
    if y.all() or not y.any():
        q = np.clip(y.mean() if y.size else 0.5, 1e-3, 1 - 1e-3)
        return np.zeros(x.shape[1]), float(np.log(q / (1 - q)))
    lr = LogisticRegression(C=1.0 / penalty, max_iter=1000).fit(x, y)
    return lr.coef_[0].astype(np.float64), float(lr.intercept_[0])


def logistic(features, coef, intercept: float) -> np.ndarray:
    """(m,) σ(features @ coef + intercept) of `features` (m, F).

    Args:
        features: (m, F) features (a 1-D array is one feature).
        coef: (F,) weights.
        intercept: the bias.

    Returns:
        (m,) probabilities.
    """
    from scipy.special import expit  # σ without overflow for large |logits|

    x = np.asarray(features, dtype=np.float64)
    x = x.reshape(len(x), -1)
    return expit(x @ np.asarray(coef, dtype=np.float64) + intercept)
