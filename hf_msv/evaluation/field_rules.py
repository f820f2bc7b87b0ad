"""The field's early-stopping and per-chain pruning rules, replayed on recorded groups as `Schedule`s.

Each rule turns one recorded group (an `AnswerGroup` and the per-chain data of `ChainRecord`) into one
`hf_msv.schedules.Schedule` per point of its parameter grid (`schedules`), so that every rule, the MSV's among
them, is read with the same accounting: chain-of-thought tokens `Schedule.cot_tokens`, all tokens processed
`all_tokens` (chain of thought + the elicitation tokens of the answers elicited before each chain's cut), accuracy
from the chosen answer. A rule's parameter is chosen on validation groups only (`rule_curve` → `choose_settings`:
the cheapest setting within a tolerance of the rule's own full decoding, and the most accurate within token
budgets), then applied to evaluation groups.

The rules (a frozen config per rule; its ``grid()`` lists the settings, the last one always the rule's own full
decoding, so that a curve holds its full-decoding point; any object with ``name``, ``grid`` and ``schedules``, a
`ScheduleRule`, is read the same way):

* `DeepConf` — DeepConf online (Fu et al., 2025): a chain is terminated at the first full window of `window` tokens
  whose mean token confidence falls below a threshold s; s is a percentile of warm-up traces' lowest-group
  confidence (90: DeepConf-low, which keeps the top 10 %; 10: DeepConf-high); the group stops once the
  confidence-weighted vote share of the finished, kept chains reaches τ; the output is that weighted vote. Warm-up
  at N = 16: ``warmup="validation"`` (s fitted on the validation groups' chains, `DeepConf.fit`) or
  ``warmup="first_k"`` (the group's first k chains decode in full first, as the paper's 16 of 512; the rest run
  after them against s from those k).
* `SpeculativeRejection` (Sun et al., 2024): every k tokens the running chains are ranked by a scorer's score of
  their latest answer and the lowest fraction α rejected; the output is the best-scored surviving answer.
* `Dynasor` — Dynasor-CoT (Fu et al., 2024): a chain stops once its last w probed answers agree; output by
  majority vote of the chains' latest answers or by a scorer.
* `SlimSC` — Slim-SC (Hong et al., 2025): every k tokens, of two running chains whose thoughts are more similar than
  θ, the one most similar to the others is pruned; similarity is the cosine of the chains' answer-class histograms
  (what the recorded answers give of a chain's reasoning so far); output by majority vote of the survivors.
* `ESC` — early-stopping self-consistency (Li et al., 2024): chains are decoded in windows of w (draw order), and
  decoding stops after the first window whose w final answers agree; output: the vote of the windows decoded.
* `Consensus` (k of N) and `AdaptiveConsistency` (Aggarwal et al., 2023): group stops on the
  `hf_msv.stop_rules` statistics of the class snapshots, applied by `hf_msv.generation.decide_stop`.

Times are shared decode steps (the `Schedule` convention): chain n has decoded min(t, seq_len_n) tokens at step t.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from ..baselines import best_of_n, deepconf_confidence
from ..data import AnswerGroup
from ..generation import decide_stop
from ..schedules import NEVER, Schedule
from ..stop_rules import stop_events
from .early_stop import BUDGET_FRACTIONS, TradeoffCurve, choose_budget_lambda

__all__ = [
    "DEEPCONF_WINDOW",
    "ChainRecord",
    "DeepConf",
    "SpeculativeRejection",
    "Dynasor",
    "SlimSC",
    "ESC",
    "Consensus",
    "AdaptiveConsistency",
    "FieldRule",
    "ScheduleRule",
    "field_rules",
    "schedules",
    "all_tokens",
    "chain_steps",
    "RuleCurve",
    "rule_curve",
    "SettingChoice",
    "choose_settings",
    "fit_rule",
    "choose_on_validation",
]

DEEPCONF_WINDOW = 32  # tokens per DeepConf group: the paper's 2048 is longer than our chains (≤ 272 tokens)


@dataclass(frozen=True)
class ChainRecord:
    """What the field's rules read of a group beyond its `AnswerGroup`.

    Args:
        step: (A,) each answer's step within its chain (`None`: ranked by start, then end).
        token_confidence: per chain n, its DeepConf token confidences C_i (`hf_msv.baselines.token_confidence`), one
            per chain-of-thought token (at least seq_len_n); `None` when not recorded (DeepConf cannot run).
    """

    step: np.ndarray | None = None
    token_confidence: tuple[np.ndarray, ...] | None = None


# ----------------------------------------------------------------------------------------------------- helpers


def _token_confidence(extras: ChainRecord | None) -> tuple[np.ndarray, ...]:
    """The chains' token confidences, which DeepConf needs (a ValueError when `extras` has none)."""
    if extras is None or extras.token_confidence is None:
        raise ValueError("DeepConf needs the chains' token confidences (ChainRecord.token_confidence)")
    return extras.token_confidence


def chain_steps(group: AnswerGroup, extras: ChainRecord | None = None) -> np.ndarray:
    """(A,) each answer's step within its chain: the recorded one, else its rank by (start, end, index)."""
    if extras is not None and extras.step is not None:
        return np.asarray(extras.step, np.int64).reshape(-1)
    start = group.end if group.start is None else group.start
    order = np.lexsort((np.arange(group.num_answers), group.end, start, group.sequence))
    step = np.zeros(group.num_answers, np.int64)
    seq = group.sequence[order]
    first = np.r_[0, np.flatnonzero(seq[1:] != seq[:-1]) + 1]
    run_start = np.repeat(first, np.diff(np.r_[first, seq.size]))
    step[order] = np.arange(seq.size) - run_start
    return step


def all_tokens(schedule: Schedule, group: AnswerGroup) -> int:
    """Every token the group processed under `schedule`: Σ_n min(cut_n, seq_len_n) chain-of-thought tokens plus, per
    answer elicited before its chain's cut (start ≤ cut), the elicitation tokens (prompt + answer, end − start) fed
    by the cut: an elicitation runs beside its chain, one token per step, and stops with it.

    Args:
        schedule: the rule's outcome on `group`.
        group: the group; without ``start`` only chain-of-thought tokens are counted.

    Returns:
        The token count.
    """
    cot = schedule.cot_tokens(group.seq_len)
    if group.start is None:
        return cot
    cut = schedule.cut[group.sequence]
    fed = np.minimum(group.end, cut) - group.start
    return cot + int(np.maximum(fed, 0).sum())


def _latest(group: AnswerGroup, step: np.ndarray, available: np.ndarray) -> np.ndarray:
    """(N,) each chain's latest answer among `available` (largest step; -1: none)."""
    latest = np.full(group.num_sequences, -1, np.int64)
    rows = np.flatnonzero(available)
    for a in rows[np.lexsort((step[rows], group.sequence[rows]))]:  # ascending step per chain: the last write wins
        latest[group.sequence[a]] = a
    return latest


def _vote(group: AnswerGroup, answers: np.ndarray, weights: np.ndarray | None = None) -> tuple[int, float]:
    """The (weighted) majority of `answers` (indices, one per voting chain): ``(answer, share)``.

    The winner is the class of largest weight (ties: the class whose first vote arrived first, then lowest
    index); its representative is its earliest-arriving answer among `answers`. (-1, nan) with no vote.
    """
    answers = np.asarray(answers, np.int64)
    if answers.size == 0:
        return -1, math.nan
    w = np.ones(answers.size) if weights is None else np.asarray(weights, np.float64)
    klass = group.klass[answers]
    classes, inverse = np.unique(klass, return_inverse=True)
    mass = np.bincount(inverse, weights=w, minlength=classes.size)
    first = np.full(classes.size, np.iinfo(np.int64).max)
    np.minimum.at(first, inverse, group.end[answers] * (group.num_answers + 1) + answers)
    best = np.lexsort((first, -mass))[0]
    total = mass.sum()
    return int(first[best] % (group.num_answers + 1)), float(mass[best] / total) if total > 0 else math.nan


def _best_scored(group: AnswerGroup, available: np.ndarray, scores: np.ndarray) -> tuple[int, float]:
    """The best-scored available answer, terminal answers first: ``(answer, score)``; (-1, nan) with none."""
    for mask in (available & group.is_terminal, available):
        if mask.any():
            a = best_of_n(scores, mask)
            return a, float(scores[a])
    return -1, math.nan


def _output(group, step, cut, keep, output: str) -> tuple[int, float]:
    """The answer a per-chain rule outputs at the end: ``output`` ``"vote"`` (majority of the kept chains' latest
    answers available by their cuts) or a score name (the best-scored such answer, terminal first)."""
    available = (group.end <= cut[group.sequence]) & keep[group.sequence]
    if output == "vote":
        latest = _latest(group, step, available)
        return _vote(group, latest[latest >= 0])
    return _best_scored(group, available, group.scores[output])


def _finish(group: AnswerGroup, cut: np.ndarray, chosen: int, confidence: float) -> Schedule:
    """The `Schedule` of a per-chain rule: a cut at or past a chain's end is no cut; the group ends when its last
    chain does (its last answer, or its cut)."""
    cut = np.where(cut >= group.seq_len, NEVER, cut)
    pruned = cut < NEVER
    last_end = np.zeros(group.num_sequences, np.int64)
    np.maximum.at(last_end, group.sequence, group.end)
    stop = int(np.where(pruned, cut, last_end).max()) if group.num_sequences else 0
    return Schedule(cut, pruned, stop, False, chosen, confidence)


def _group_stop(group: AnswerGroup, statistic: str, lambdas: Sequence[float], step: np.ndarray) -> list[Schedule]:
    """Schedules of a group stop on a `hf_msv.stop_rules` statistic for each λ: `decide_stop` on class snapshots."""
    ev = stop_events(statistic, group.klass, group.sequence, step, group.end, group.num_sequences)
    d = decide_stop(ev.time, ev.statistic, group.is_terminal[ev.answer], list(lambdas), ev.confidence, True)
    out = []
    for stopped, stop, chosen in zip(d.stopped, d.stop_step, d.chosen):
        cut = np.full(group.num_sequences, int(stop) if stopped else NEVER, np.int64)
        answer = int(ev.answer[chosen]) if chosen >= 0 else -1
        conf = float(ev.confidence[chosen]) if chosen >= 0 else math.nan
        out.append(Schedule(cut, np.zeros(group.num_sequences, bool), int(stop), bool(stopped), answer, conf))
    return out


# ------------------------------------------------------------------------------------------------------ rules


@dataclass(frozen=True)
class Consensus:
    """k-of-N consensus: stop when k of the N chains' latest answers agree (statistic ``"consensus"``, λ = k/N).

    Grid: k = 2 … N, then never (full decoding: the class of most chains' latest answers at the end).
    """

    name: str = "consensus"

    def grid(self, num_chains: int) -> list[str]:
        return [f"k={k}" for k in range(2, num_chains + 1)] + ["full"]

    def schedules(self, group: AnswerGroup, extras: ChainRecord | None) -> list[Schedule]:
        n = group.num_sequences
        lambdas = [(k - 0.5) / n for k in range(2, n + 1)] + [math.inf]  # k - ½: k/N without float rounding
        return _group_stop(group, "consensus", lambdas, chain_steps(group, extras))


ADAPTIVE_CONSISTENCY_GRID = (0.6, 0.7, 0.8, 0.9, 0.95, 0.99)  # the paper's default threshold is 0.95


@dataclass(frozen=True)
class AdaptiveConsistency:
    """Adaptive-Consistency: stop when P(leader's share > ½) under the Beta posterior of the chains' latest answers
    reaches the threshold (statistic ``"adaptive-consistency"``).

    Args:
        thresholds: the grid (then never: full decoding).
    """

    thresholds: tuple[float, ...] = ADAPTIVE_CONSISTENCY_GRID
    name: str = "adaptive-consistency"

    def grid(self, num_chains: int) -> list[str]:
        return [f"threshold={t}" for t in self.thresholds] + ["full"]

    def schedules(self, group: AnswerGroup, extras: ChainRecord | None) -> list[Schedule]:
        lambdas = [*self.thresholds, math.inf]
        return _group_stop(group, "adaptive-consistency", lambdas, chain_steps(group, extras))


@dataclass(frozen=True)
class ESC:
    """Early-stopping self-consistency: the chains are decoded window after window (w chains each, in draw order);
    decoding stops after the first window whose w final answers all agree, and the output is the majority of the
    final answers of the windows decoded. The chains of the windows not decoded are cut at 0 (pruned).

    The windows are sequential in ESC, so its latency is the sum of the windows' lengths; `Schedule.stop_step` is
    the last final answer's arrival among the decoded chains on the shared time axis (as if they ran together).

    Args:
        windows: the grid of w (then w = N: one window, full decoding by majority vote).
    """

    windows: tuple[int, ...] = (2, 3, 4, 8)
    name: str = "esc"

    def grid(self, num_chains: int) -> list[str]:
        return [f"w={w}" for w in self.windows if w < num_chains] + ["full"]

    def schedules(self, group: AnswerGroup, extras: ChainRecord | None) -> list[Schedule]:
        n = group.num_sequences
        final = np.full(n, -1, np.int64)
        term = np.flatnonzero(group.is_terminal)
        final[group.sequence[term]] = term
        out = []
        for w in [w for w in self.windows if w < n] + [n]:
            decoded = n
            for lo in range(0, n, w):
                ids = final[lo : lo + w]
                if ids.size == w and (ids >= 0).all() and np.unique(group.klass[ids]).size == 1:
                    decoded = min(n, lo + w)
                    break
            cut = np.where(np.arange(n) < decoded, NEVER, 0).astype(np.int64)
            answers = final[:decoded][final[:decoded] >= 0]
            chosen, share = _vote(group, answers)
            stop = int(group.end[answers].max()) if answers.size else 0
            out.append(Schedule(cut, cut == 0, stop, decoded < n, chosen, share))
        return out


@dataclass(frozen=True)
class Dynasor:
    """Dynasor-CoT's certainty rule per chain: chain n stops when its last w probed answers (every elicited answer
    is a probe) agree, at the arrival of the w-th; the output is the majority of the chains' latest answers
    (``output="vote"``) or the best-scored available answer (``output`` a score name of the group).

    Args:
        windows: the grid of w (default 2–5; Dynasor-CoT's default is `hf_msv.class_events.PROBE_WINDOW` = 3), then
            no stop (full decoding with the same output).
        output: ``"vote"`` or a score name (e.g. ``"probe"``, ``"msv"``).
    """

    windows: tuple[int, ...] = (2, 3, 4, 5)
    output: str = "vote"
    name: str = "dynasor-cot"

    def grid(self, num_chains: int) -> list[str]:
        return [f"w={w}" for w in self.windows] + ["full"]

    def schedules(self, group: AnswerGroup, extras: ChainRecord | None) -> list[Schedule]:
        step = chain_steps(group, extras)
        order = np.lexsort((step, group.sequence))
        out = []
        for w in [*self.windows, None]:
            cut = np.full(group.num_sequences, NEVER, np.int64)
            if w is not None:
                for n in range(group.num_sequences):
                    mine = order[group.sequence[order] == n]
                    k = group.klass[mine]
                    for j in range(w - 1, mine.size):
                        if np.all(k[j - w + 1 : j + 1] == k[j]):
                            cut[n] = group.end[mine[j]]
                            break
            keep = np.ones(group.num_sequences, bool)
            chosen, conf = _output(group, step, cut, keep, self.output)
            out.append(_finish(group, cut, chosen, conf))
        return out


@dataclass(frozen=True)
class SpeculativeRejection:
    """Speculative Rejection: at every checkpoint t = k, 2k, … the running chains with an answer available are
    ranked by `scorer`'s score of their latest answer and the ⌊α · m⌋ lowest of those m are rejected (cut at t);
    a chain without an answer yet has nothing to be judged by and keeps running; at least one chain always
    survives. The output is the best-scored answer of the surviving chains (terminal answers first).

    With the MSV as scorer, the recorded per-answer scores were computed with every chain's answers in the group,
    rejected chains' later ones included; a live rejection would rescore without them.

    Args:
        scorer: the score name (``"probe"``: a single-chain verifier; ``"msv"``: the MSV's per-answer score).
        intervals: the grid of k (tokens between checkpoints).
        fractions: the grid of α.
    """

    scorer: str = "probe"
    intervals: tuple[int, ...] = (32, 64)
    fractions: tuple[float, ...] = (0.25, 0.5, 0.75)
    name: str = "speculative-rejection"

    def grid(self, num_chains: int) -> list[str]:
        return [f"k={k},alpha={a}" for k in self.intervals for a in self.fractions] + ["full"]

    def schedules(self, group: AnswerGroup, extras: ChainRecord | None) -> list[Schedule]:
        step = chain_steps(group, extras)
        scores = group.scores[self.scorer]
        out = []
        for k, alpha in [(k, a) for k in self.intervals for a in self.fractions] + [(None, 0.0)]:
            cut = np.full(group.num_sequences, NEVER, np.int64)
            t = k or 0
            while k is not None and (running := np.flatnonzero((cut == NEVER) & (group.seq_len > t))).size:
                latest = _latest(group, step, group.end <= t)[running]
                judged = running[latest >= 0]
                drop = min(math.floor(alpha * judged.size), int((cut == NEVER).sum()) - 1)
                if drop > 0:
                    rank = np.lexsort((-judged, scores[latest[latest >= 0]]))  # lowest first; ties: later chain
                    cut[judged[rank[:drop]]] = t
                t += k
            chosen, conf = _output(group, step, cut, cut == NEVER, self.scorer)
            out.append(_finish(group, cut, chosen, conf))
        return out


@dataclass(frozen=True)
class SlimSC:
    """Slim-SC's thought pruning: at every checkpoint t = k, 2k, … among the running chains with at least two
    answers, while two are more similar than θ, the one of highest mean similarity to the others is pruned
    (Slim-SC's diversity-based pruning); the output is the majority of the survivors' latest answers.

    A chain's thoughts are what its recorded answers say of them: its histogram over the group's answer classes of
    its answers available at t; similarity is the cosine of two histograms (1 when two chains have held the same
    answers in the same proportions).

    Args:
        thresholds: the grid of θ.
        interval: k, tokens between checkpoints.
    """

    thresholds: tuple[float, ...] = (0.8, 0.9, 0.95, 0.99)
    interval: int = 32
    name: str = "slim-sc"

    def grid(self, num_chains: int) -> list[str]:
        return [f"theta={t}" for t in self.thresholds] + ["full"]

    def schedules(self, group: AnswerGroup, extras: ChainRecord | None) -> list[Schedule]:
        step = chain_steps(group, extras)
        classes, inverse = np.unique(group.klass, return_inverse=True)
        horizon = int(group.seq_len.max()) if group.num_sequences else 0
        out = []
        for theta in [*self.thresholds, None]:
            cut = np.full(group.num_sequences, NEVER, np.int64)
            for t in range(self.interval, horizon, self.interval) if theta is not None else range(0):
                avail = group.end <= t
                hist = np.zeros((group.num_sequences, classes.size))
                np.add.at(hist, (group.sequence[avail], inverse[avail]), 1.0)
                alive = np.flatnonzero((cut == NEVER) & (group.seq_len > t) & (hist.sum(1) >= 2))
                while alive.size >= 2:
                    h = hist[alive] / np.linalg.norm(hist[alive], axis=1, keepdims=True)
                    sim = h @ h.T
                    np.fill_diagonal(sim, -np.inf)
                    if sim.max() < theta:
                        break
                    mean = np.where(np.isinf(sim), 0.0, sim).sum(1) / (alive.size - 1)
                    pair = np.flatnonzero((sim >= theta).any(1))
                    victim = pair[np.lexsort((-alive[pair], -mean[pair]))[0]]  # most similar; ties: later chain
                    cut[alive[victim]] = t
                    alive = np.delete(alive, victim)
            chosen, conf = _output(group, step, cut, cut == NEVER, "vote")
            out.append(_finish(group, cut, chosen, conf))
        return out


DEEPCONF_CONSENSUS = (0.6, 0.8, 0.9, 0.95)  # τ; the paper's default is 0.95


@dataclass(frozen=True)
class DeepConf:
    """DeepConf online: per-chain termination on the sliding-window token confidence, then a consensus stop.

    Chain n is terminated at the first step t ≥ `window` at which the mean token confidence of its last `window`
    tokens is below s (a chain of fewer tokens is never judged); a terminated chain's answers are discarded. Each
    chain that finishes votes, with weight its lowest-group confidence, for its final answer; the group stops at the
    first arrival at which the leading class holds a share ≥ τ of the weight (`decide_stop` on those vote
    snapshots), and outputs the weighted majority (at the end, of every finished chain).

    s is the `percentile` of warm-up traces' lowest-group confidences (`deepconf_confidence`, ``"lowest_group"``):
    90 for DeepConf-low (keep the top 10 %), 10 for DeepConf-high. Warm-up:

    * ``"validation"``: s is fitted once on the validation groups' chains (`fit`), no chain of the group is spent;
    * ``"first_k"``: the group's first `warmup_chains` chains (draw order) are the warm-up: decoded in full and never
      terminated, they vote from the start; the others run after them (their steps count from their own start)
      against s from the warm-up.

    Args:
        percentile: 90 (low) or 10 (high).
        warmup: ``"validation"`` or ``"first_k"``.
        warmup_chains: k for ``"first_k"``.
        window: tokens per group (`DEEPCONF_WINDOW`).
        consensus: the grid of τ; then τ = ∞ (terminations only) and full decoding (no termination, weighted vote).
        threshold: s for ``"validation"`` (`fit` sets it).
    """

    percentile: float = 90.0
    warmup: str = "validation"
    warmup_chains: int = 2
    window: int = DEEPCONF_WINDOW
    consensus: tuple[float, ...] = DEEPCONF_CONSENSUS
    threshold: float | None = None
    name: str = "deepconf"

    def __post_init__(self):
        if self.warmup not in ("validation", "first_k"):
            raise ValueError(f"warmup must be 'validation' or 'first_k', got {self.warmup!r}")

    def grid(self, num_chains: int) -> list[str]:
        return [f"tau={t}" for t in self.consensus] + ["tau=inf", "full"]

    def lowest_group(self, confidence: np.ndarray, length: int) -> float:
        """A chain's lowest-group confidence over its first `length` tokens (C_least)."""
        # deepconf_confidence reads (T, k) top-k log-probs; one column −C_i gives back C_i as the token confidence
        return deepconf_confidence(-np.asarray(confidence[:length], np.float64)[:, None], self.window)

    def fit(self, groups: Sequence[AnswerGroup], extras: Sequence[ChainRecord | None]) -> DeepConf:
        """This rule with s fitted on validation groups: the `percentile` of every chain's lowest-group confidence.

        Args:
            groups, extras: the validation groups and their `ChainRecord`s (with token confidences).

        Returns:
            A copy with ``threshold`` set.
        """
        values = [
            self.lowest_group(_token_confidence(x)[n], int(g.seq_len[n]))
            for g, x in zip(groups, extras)
            for n in range(g.num_sequences)
        ]
        return replace(self, threshold=float(np.percentile(values, self.percentile)))

    def termination(self, confidence: np.ndarray, length: int, threshold: float) -> int:
        """The step at which a chain of `length` tokens is terminated (`NEVER`: it is not)."""
        c = np.asarray(confidence[:length], np.float64)
        if c.size < self.window:
            return NEVER
        cs = np.r_[0.0, np.cumsum(c)]
        means = (cs[self.window :] - cs[: -self.window]) / self.window  # window ending at token i + window
        low = np.flatnonzero(means < threshold)
        return int(low[0] + self.window) if low.size and low[0] + self.window < length else NEVER

    def schedules(self, group: AnswerGroup, extras: ChainRecord | None) -> list[Schedule]:
        n, conf = group.num_sequences, _token_confidence(extras)
        warm = np.arange(n) < (self.warmup_chains if self.warmup == "first_k" else 0)
        if self.warmup == "first_k":
            lows = [self.lowest_group(conf[i], int(group.seq_len[i])) for i in np.flatnonzero(warm)]
            threshold = float(np.percentile(lows, self.percentile)) if lows else -math.inf
        elif self.threshold is None:
            raise ValueError("DeepConf with validation warm-up needs its threshold: call fit() on validation groups")
        else:
            threshold = self.threshold
        weight = np.array([self.lowest_group(conf[i], int(group.seq_len[i])) for i in range(n)])
        terminated = np.array(
            [NEVER if warm[i] else self.termination(conf[i], int(group.seq_len[i]), threshold) for i in range(n)]
        )
        out = [self._stop(group, warm, terminated, weight, tau, extras) for tau in [*self.consensus, math.inf]]
        out.append(self._stop(group, warm, np.full(n, NEVER), weight, math.inf, extras))
        return out

    def _stop(self, group, warm, terminated, weight, tau, extras) -> Schedule:
        """The consensus stop at τ over the finished chains' weighted votes, given the chains' terminations."""
        final = np.full(group.num_sequences, -1, np.int64)
        term = np.flatnonzero(group.is_terminal)
        final[group.sequence[term]] = term
        voters = np.flatnonzero((terminated == NEVER) & (final >= 0))
        arrive = np.where(warm[voters], 0, group.end[final[voters]])  # the warm-up has finished before the rest
        # vote snapshots at each arrival: one row per class, its weighted share of the finished chains
        rows_t, rows_a, rows_s = [], [], []
        for t in np.unique(arrive):
            done = voters[arrive <= t]
            klass = group.klass[final[done]]
            total = weight[done].sum()
            for c in np.unique(klass):
                mine = done[klass == c]
                rows_t.append(t)
                rows_a.append(final[mine[np.argmax(weight[mine])]])
                rows_s.append(weight[mine].sum() / total if total > 0 else 0.0)
        if rows_t:
            s = np.asarray(rows_s)
            d = decide_stop(np.asarray(rows_t), s, np.ones(len(rows_t), bool), tau, s, True)
            stopped, stop = bool(d.stopped[0]), int(d.stop_step[0])
            chosen, share = int(np.asarray(rows_a)[d.chosen[0]]), float(s[d.chosen[0]])
        else:  # no chain finished: the latest answers of every chain, unweighted
            stopped, stop = False, int(group.end.max()) if group.num_answers else 0
            latest = _latest(group, chain_steps(group, extras), group.end <= terminated[group.sequence])
            chosen, share = _vote(group, latest[latest >= 0])
        cut = np.where(warm, NEVER, np.minimum(terminated, stop if stopped else NEVER))
        cut = np.where(cut >= group.seq_len, NEVER, cut)
        pruned = (terminated < NEVER) & (~stopped | (terminated < stop))
        return Schedule(cut, pruned & (cut < NEVER), stop, stopped, chosen, share)


class ScheduleRule(Protocol):
    """What `rule_curve` and `choose_on_validation` read of a rule: the field's rules here, and any other rule that
    outputs `Schedule`s (the MSV's stop or pruning) to be compared on the same accounting."""

    name: str

    def grid(self, num_chains: int) -> list[str]:
        """The labels of the settings for groups of `num_chains` chains; the last is the rule's full decoding."""
        ...

    def schedules(self, group: AnswerGroup, extras: ChainRecord | None) -> list[Schedule]:
        """One `Schedule` per setting, in grid order."""
        ...


FieldRule = Consensus | AdaptiveConsistency | ESC | Dynasor | SpeculativeRejection | SlimSC | DeepConf | ScheduleRule


def field_rules(scorers: Sequence[str] = ("probe", "msv")) -> dict[str, FieldRule]:
    """The rules of the study, by label: DeepConf-low / -high with the validation warm-up and with the first 2 or 4
    chains as warm-up, Speculative Rejection and Dynasor-CoT (vote and best-scored) per scorer in `scorers`, Slim-SC,
    ESC, consensus and Adaptive-Consistency."""
    rules: dict[str, FieldRule] = {}
    for label, p in (("low", 90.0), ("high", 10.0)):
        rules[f"deepconf-{label} (validation warm-up)"] = DeepConf(percentile=p, warmup="validation")
        for k in (2, 4):
            rules[f"deepconf-{label} (first {k} chains)"] = DeepConf(percentile=p, warmup="first_k", warmup_chains=k)
    for s in scorers:
        rules[f"speculative-rejection ({s})"] = SpeculativeRejection(scorer=s)
    rules["dynasor-cot (vote)"] = Dynasor()
    for s in scorers:
        rules[f"dynasor-cot ({s})"] = Dynasor(output=s)
    rules["slim-sc"] = SlimSC()
    rules["esc"] = ESC()
    rules["consensus"] = Consensus()
    rules["adaptive-consistency"] = AdaptiveConsistency()
    return rules


def schedules(rule: FieldRule, group: AnswerGroup, extras: ChainRecord | None = None) -> list[Schedule]:
    """One `Schedule` per point of `rule`'s grid (``rule.grid(N)``, the last one its full decoding) on `group`.

    Args:
        rule: a rule config (fitted first where it needs validation: `DeepConf.fit`).
        group: the recorded group.
        extras: its per-chain data (`ChainRecord`).

    Returns:
        The schedules, in grid order.
    """
    return rule.schedules(group, extras)


# --------------------------------------------------------------------------------- curves and parameter choice


@dataclass(frozen=True)
class RuleCurve:
    """A rule's grid replayed on groups: per group and setting, all (G, K).

    Attributes:
        settings: (K,) the grid's labels (the last: full decoding).
        correct: the output is correct.
        cot_tokens: chain-of-thought tokens (`Schedule.cot_tokens`).
        all_tokens: chain-of-thought + elicitation tokens (`all_tokens`).
        full_cot, full_all: (G,) the same two with no rule at all (every chain and answer to its end).
        problem: (G,) each group's problem id.
        pruned: mean chains pruned per group.
    """

    settings: tuple[str, ...]
    correct: np.ndarray
    cot_tokens: np.ndarray
    all_tokens: np.ndarray
    full_cot: np.ndarray
    full_all: np.ndarray
    problem: tuple[str, ...]
    pruned: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def accuracy(self) -> np.ndarray:
        return self.correct.mean(0)

    def fraction(self, all_tokens: bool = False) -> np.ndarray:
        """(K,) mean tokens ÷ mean tokens with no rule."""
        tokens, full = (self.all_tokens, self.full_all) if all_tokens else (self.cot_tokens, self.full_cot)
        return tokens.mean(0) / full.mean()

    def tradeoff(self) -> TradeoffCurve:
        """The curve as a `TradeoffCurve` over chain-of-thought tokens, settings standing for λ (the last, full
        decoding, the largest), for `choose_budget_lambda` and `interpolated_curve`."""
        k = len(self.settings)
        zero = np.zeros(k)
        lam = np.arange(k, dtype=np.float64)
        return TradeoffCurve(lam, self.accuracy, self.cot_tokens.mean(0).astype(np.float64), zero, zero, zero)


def rule_curve(
    rule: FieldRule, groups: Sequence[AnswerGroup], extras: Sequence[ChainRecord | None] | None = None
) -> RuleCurve:
    """`rule`'s grid replayed on `groups`.

    Args:
        rule: a rule config (fitted where it needs it).
        groups: the groups (all of one N).
        extras: one `ChainRecord` per group (`None`: none).

    Returns:
        The `RuleCurve`.
    """
    if not groups:
        raise ValueError("no groups")
    extras = list(extras) if extras is not None else [None] * len(groups)
    correct, cot, every, full_cot, full_all, pruned = [], [], [], [], [], []
    for g, x in zip(groups, extras):
        sched = schedules(rule, g, x)
        correct.append([s.chosen >= 0 and bool(g.correct[s.chosen]) for s in sched])
        cot.append([s.cot_tokens(g.seq_len) for s in sched])
        every.append([all_tokens(s, g) for s in sched])
        pruned.append([s.num_pruned for s in sched])
        none = Schedule(np.full(g.num_sequences, NEVER), np.zeros(g.num_sequences, bool), 0, False, -1)
        full_cot.append(none.cot_tokens(g.seq_len))
        full_all.append(all_tokens(none, g))
    settings = tuple(rule.grid(groups[0].num_sequences))
    if len(settings) != len(correct[0]):
        raise AssertionError(f"{rule.name}: {len(correct[0])} schedules for {len(settings)} settings")
    return RuleCurve(
        settings,
        np.asarray(correct, bool),
        np.asarray(cot, np.int64),
        np.asarray(every, np.int64),
        np.asarray(full_cot, np.int64),
        np.asarray(full_all, np.int64),
        tuple(g.problem_id or f"group {i}" for i, g in enumerate(groups)),
        np.asarray(pruned, np.float64).mean(0),
    )


@dataclass(frozen=True)
class SettingChoice:
    """A setting chosen on validation for one target.

    Attributes:
        target: ``"within 1 pp"`` (the cheapest setting whose accuracy is within the tolerance of the rule's full
            decoding) or ``"budget 0.3"`` (the most accurate setting within 30 % of full decoding's CoT tokens).
        index: the setting's position in the grid.
        setting: its label.
        accuracy: its validation accuracy.
        token_fraction: its validation CoT token fraction.
        fits: whether a setting met the target (False: the cheapest setting for a budget, full decoding for the
            tolerance).
    """

    target: str
    index: int
    setting: str
    accuracy: float
    token_fraction: float
    fits: bool


def choose_settings(
    curve: RuleCurve, tolerance: float = 0.01, budgets: Sequence[float] = BUDGET_FRACTIONS
) -> list[SettingChoice]:
    """The settings a study applies to evaluation, chosen on `curve` only (give it the validation groups' curve).

    Args:
        curve: the rule's curve on validation groups.
        tolerance: the accuracy a setting may lose against the rule's own full decoding (the last setting).
        budgets: CoT token budgets, fractions of full decoding's (`choose_budget_lambda` on `curve.tradeoff()`).

    Returns:
        One `SettingChoice` for the tolerance, then one per budget.
    """
    accuracy, fraction = curve.accuracy, curve.fraction()
    ok = np.flatnonzero(accuracy >= accuracy[-1] - tolerance - 1e-12)
    index = int(ok[np.lexsort((-accuracy[ok], fraction[ok]))[0]])  # cheapest, then most accurate
    label = f"within {tolerance * 100:g} pp"
    out = [SettingChoice(label, index, curve.settings[index], float(accuracy[index]), float(fraction[index]), True)]
    tradeoff = curve.tradeoff()
    for b in budgets:
        c = choose_budget_lambda(tradeoff, b)
        out.append(
            SettingChoice(f"budget {b:g}", c.index, curve.settings[c.index], c.accuracy, c.used_fraction, c.fits)
        )
    return out


def fit_rule(rule: FieldRule, groups: Sequence[AnswerGroup], extras: Sequence[ChainRecord | None]) -> FieldRule:
    """`rule` with what it fits on validation set from `groups` (DeepConf's validation warm-up threshold); any other
    rule unchanged."""
    if isinstance(rule, DeepConf) and rule.warmup == "validation":
        return rule.fit(groups, extras)
    return rule


def choose_on_validation(
    rule: FieldRule,
    groups: Sequence[AnswerGroup],
    extras: Sequence[ChainRecord | None] | None = None,
    tolerance: float = 0.01,
    budgets: Sequence[float] = BUDGET_FRACTIONS,
) -> tuple[FieldRule, RuleCurve, list[SettingChoice]]:
    """Everything a study decides before it reads evaluation: the rule fitted (`fit_rule`), its curve and its
    settings (`choose_settings`), all from the validation `groups`.

    Returns:
        ``(fitted rule, validation curve, choices)``.
    """
    extras = list(extras) if extras is not None else [None] * len(groups)
    fitted = fit_rule(rule, groups, extras)
    curve = rule_curve(fitted, groups, extras)
    return fitted, curve, choose_settings(curve, tolerance, budgets)
