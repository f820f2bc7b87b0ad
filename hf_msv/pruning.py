"""Per-chain pruning driven by the verifier: which of a prompt's N chains stop decoding while the group goes on.

The group stop (`hf_msv.generation.decide_stop`) ends every chain at once when a class's statistic reaches λ.
Pruning ends single chains earlier, at an arrival time t of the group (a time some answer becomes available), on
what is known at t: the answers available so far (end ≤ t) and the current class snapshot (`hf_msv.class_events`:
one row per class, with the stop head's confidence P(the class is correct)). `prune_chains` is the one decision;
the generation run core calls it live and the replay (`hf_msv.training.pruned_replay`) calls it on recorded groups.

A pruned chain decodes no further chain-of-thought tokens and no answer of it becomes available after its cut.
Its latest answer before the cut stays the chain's *held* answer: it keeps counting in the class snapshots (its
class's support and mean logit) and in the verifier's inputs exactly as a chain's latest answer does, and it is
the chain's final answer (a candidate at full decoding, like a terminal answer). Pruning a chain of the leading
class therefore never weakens the leader, and a chain whose answer the verifier has ruled out keeps its (low)
vote. The alternative, dropping a pruned chain from the snapshots, is measured in ``docs/pruning.md``.

Clauses (each off when its parameter is `None`; a chain is pruned when any clause fires):

* **ruled out** (`doubt`, `lead`): the chain's held class has confidence ≤ `doubt` while another class of the
  snapshot has confidence ≥ `lead`: the verifier has decided against the chain's current answer.
* **steady** (`steady`, `steady_confidence`): the chain's last `steady` answers all are one class and that
  class's confidence ≥ `steady_confidence`: the chain has stopped moving (Dynasor-CoT's certainty window, per
  chain), and its held answer already votes where further decoding would.
* **regret** (`regret`, `regret_coef`, `regret_intercept`): a learned statistic, the chain's *regret*
  P(a later answer of the chain is correct while its held answer is not), σ(coef · x + intercept) of the chain's
  `chain_features` x, is ≤ `regret`: what pruning the chain could cost, read from its history and the snapshot
  (fitted on the stop head's problems by `hf_msv.training.regret.fit_regret`).

Only chains still decoding (`DECODING`) that have answered at least `min_answers` times are pruned.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property

import numpy as np

from .baselines import logistic, logit

__all__ = [
    "CHAIN_FEATURES",
    "DECODING",
    "ENDED",
    "PRUNED",
    "PRUNE_OFF",
    "PruneRule",
    "chain_features",
    "chain_status",
    "held_answers",
    "prune_chains",
]

DECODING, ENDED, PRUNED = 0, 1, 2  # a chain's status at t: still decoding, ended on its own, pruned

# The regret clause's features (`chain_features`), one row per chain at an arrival time. None is a token count, so
# a statistic fitted on one LM's chains does not hinge on its lengths.
CHAIN_FEATURES = (
    "logit of the held class's confidence",
    "logit of the best other class's confidence",
    "the held class leads",
    "log(1 + answers in a row of the held class)",
    "log(1 + answers given)",
    "classes the chain has held ÷ answers given",
    "chains holding the held class ÷ N",
    "chains ended ÷ N",
)


@dataclass(frozen=True)
class PruneRule:
    """The parameters of `prune_chains`; every clause is off when its parameter is `None` (`PRUNE_OFF`: all off).

    Args:
        doubt: ruled out: prune a chain whose held class has confidence ≤ `doubt` ...
        lead: ... while another class has confidence ≥ `lead`.
        steady: steady: prune a chain whose last `steady` answers all are one class ...
        steady_confidence: ... of confidence ≥ `steady_confidence` (0: any class).
        regret: regret: prune a chain whose regret σ(regret_coef · x + regret_intercept) ≤ `regret` ...
        regret_coef: ... one weight per `CHAIN_FEATURES` entry ...
        regret_intercept: ... and the bias.
        min_answers: a chain is pruned only once it has answered at least this many times.
    """

    doubt: float | None = None
    lead: float = 0.5
    steady: int | None = None
    steady_confidence: float = 0.0
    regret: float | None = None
    regret_coef: tuple[float, ...] = ()
    regret_intercept: float = 0.0
    min_answers: int = 1

    def __post_init__(self):
        if self.regret is not None and len(self.regret_coef) != len(CHAIN_FEATURES):
            raise ValueError(
                f"the regret clause needs {len(CHAIN_FEATURES)} weights (CHAIN_FEATURES), got {len(self.regret_coef)}"
            )

    @property
    def off(self) -> bool:
        """No clause can fire: the group stop alone."""
        return self.doubt is None and self.steady is None and self.regret is None

    @property
    def reads_confidence(self) -> bool:
        """Whether a decision can depend on the snapshot's confidences (the ruled-out and regret clauses, a steady
        clause with a confidence floor): else the stop head does not change what is pruned."""
        steady_floor = self.steady is not None and self.steady_confidence > 0
        return self.doubt is not None or self.regret is not None or steady_floor

    def to_dict(self) -> dict:
        d = asdict(self) | {"regret_coef": list(self.regret_coef)}
        if self.regret is None:  # a rule without the clause is written as before it existed
            del d["regret"], d["regret_coef"], d["regret_intercept"]
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> PruneRule:
        """The rule written by `to_dict` (`None` or an empty dict: `PRUNE_OFF`)."""
        d = dict(d or {})
        if "regret_coef" in d:
            d["regret_coef"] = tuple(float(c) for c in d["regret_coef"])
        return cls(**d)

    @classmethod
    def of(cls, config) -> PruneRule:
        """The certified rule a verifier's config carries (``config.early_stopping["pruning"]["rule"]``); a config
        without one (every verifier saved before pruning existed) prunes nothing.

        Args:
            config: a verifier config (any object).

        Returns:
            The `PruneRule` (`PRUNE_OFF` when absent).
        """
        stored = (getattr(config, "early_stopping", None) or {}).get("pruning") or {}
        return cls.from_dict(stored.get("rule"))

    def describe(self) -> str:
        if self.off:
            return "no pruning"
        parts = []
        if self.doubt is not None:
            parts.append(f"a chain whose class has confidence ≤ {self.doubt:g} while another has ≥ {self.lead:g}")
        if self.steady is not None:
            floor = f" of confidence ≥ {self.steady_confidence:g}" if self.steady_confidence > 0 else ""
            parts.append(f"a chain whose last {self.steady} answers are one class{floor}")
        if self.regret is not None:
            parts.append(f"a chain whose learned regret is ≤ {self.regret:g}")
        warm = f" (after its {_ordinal(self.min_answers)} answer)" if self.min_answers > 1 else ""
        return "prune " + "; ".join(parts) + warm


PRUNE_OFF = PruneRule()


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def held_answers(t: int, sequence, step, end, num_chains: int) -> tuple[np.ndarray, np.ndarray]:
    """Each chain's held answer at t (its latest available answer) and how many answers it has given.

    Args:
        t: the arrival time.
        sequence, step, end: (A,) the answers' chain, step and end time (answers with end > t are ignored).
        num_chains: N.

    Returns:
        ``(held, count)``: (N,) index of each chain's latest answer with end ≤ t (-1: none yet) and (N,) int.
    """
    sequence, step, end = (np.asarray(x, np.int64).reshape(-1) for x in (sequence, step, end))
    avail = np.flatnonzero(end <= t)
    held = np.full(num_chains, -1, np.int64)
    order = avail[np.lexsort((step[avail], sequence[avail]))]  # chain-major, then step: the last one wins
    held[sequence[order]] = order
    return held, np.bincount(sequence[avail], minlength=num_chains)


def chain_status(t: int, seq_len, cut) -> np.ndarray:
    """(N,) status of each chain at t in a replay: `PRUNED` once cut by a prune (cut ≤ t, before its own end),
    `ENDED` once its chain of thought ended (seq_len ≤ t), else `DECODING`.

    Args:
        t: the arrival time.
        seq_len: (N,) the chain-of-thought tokens each chain decodes on its own.
        cut: (N,) each chain's prune step (`hf_msv.schedules.NEVER`: not pruned).
    """
    seq_len, cut = np.asarray(seq_len, np.int64), np.asarray(cut, np.int64)
    status = np.full(seq_len.shape, DECODING, np.int64)
    status[seq_len <= t] = ENDED
    status[(cut <= t) & (cut < seq_len)] = PRUNED
    return status


def prune_chains(rule: PruneRule, t: int, sequence, step, end, klass, row_klass, row_confidence, status) -> np.ndarray:
    """The chains to prune at arrival time t (module docstring for the clauses). Pure and causal: it reads only
    the answers with end ≤ t and the snapshot at t.

    Args:
        rule: the `PruneRule`.
        t: the arrival time (a decode step at which some answer became available).
        sequence, step, end, klass: (A,) int, the group's answers so far: chain n in [0, N), step within the chain,
            end time, equivalence class. Answers with end > t are ignored, so a replay may pass all its answers.
            Live: the prompt's scored `MSVAnswer`s (``.sequence``, ``.step``, ``.end``, ``.class_id``).
        row_klass, row_confidence: (C,) the class snapshot at t: one row per class, its class and confidence
            P(the class is correct). Live: ``answer.class_id`` and ``confidence`` of the `ClassValue` rows
            (``MSVAnswer.class_values``) of the latest answers arrived at t; replay: the rows of
            `hf_msv.stop_rules.stop_events` with ``time == t`` (``klass``, ``confidence``).
        status: (N,) int, each chain's status at t: `DECODING`, `ENDED` (its chain of thought ended) or `PRUNED`.
            Its size is N.

    Returns:
        (N,) bool: the chains to prune now (only `DECODING` ones). A chain pruned at t is cut at t: it has
        decoded t chain-of-thought tokens, its answers with end ≤ t stay available, none after.
    """
    status = np.asarray(status, np.int64).reshape(-1)
    out = np.zeros(status.size, bool)
    if rule.off:
        return out
    view = _ChainView(t, sequence, step, end, klass, row_klass, row_confidence, status.size)
    live = (status == DECODING) & (view.held >= 0) & (view.count >= rule.min_answers)
    if not live.any():
        return out
    if rule.doubt is not None:
        out |= live & (view.conf <= rule.doubt) & (view.best_other >= rule.lead)
    if rule.steady is not None:
        out |= live & (view.run >= rule.steady) & (view.conf >= rule.steady_confidence)
    if rule.regret is not None:
        x = view.features(status)
        out |= live & (logistic(x, rule.regret_coef, rule.regret_intercept) <= rule.regret)
    return out


def chain_features(t: int, sequence, step, end, klass, row_klass, row_confidence, status) -> np.ndarray:
    """(N, F) the regret clause's features of each chain at arrival time t (`CHAIN_FEATURES`; arguments as
    `prune_chains`). A chain with no answer yet gets a row too; `prune_chains` never prunes it.

    Returns:
        (N, len(CHAIN_FEATURES)) float64.
    """
    status = np.asarray(status, np.int64).reshape(-1)
    return _ChainView(t, sequence, step, end, klass, row_klass, row_confidence, status.size).features(status)


class _ChainView:
    """What the clauses read of each chain at t, (N,) each: the held answer (-1: none), the answers given, the held
    class and its confidence (-inf: none), the best confidence among the other classes; and, computed when a clause
    first reads them (`prune_chains` runs at every arrival, and most rules read few of them), the run of the held
    class at the chain's tail, the classes the chain has held, and the chains holding its class."""

    def __init__(self, t, sequence, step, end, klass, row_klass, row_confidence, num_chains: int):
        self.t, self.num_chains = t, num_chains
        self.sequence, self.step, self.end = (np.asarray(x, np.int64).reshape(-1) for x in (sequence, step, end))
        self.klass = np.asarray(klass, np.int64).reshape(-1)
        self.held, self.count = held_answers(t, self.sequence, self.step, self.end, num_chains)
        self.held_class = np.where(self.held >= 0, self.klass[np.maximum(self.held, 0)], -1)
        row_klass = np.asarray(row_klass, np.int64).reshape(-1)
        row_conf = np.asarray(row_confidence, np.float64).reshape(-1)
        # The confidence of each chain's held class in the snapshot (a held class always has a row; -inf if not).
        lookup = {int(k): float(c) for k, c in zip(row_klass, row_conf)}
        self.conf = np.array([lookup.get(int(k), -np.inf) for k in self.held_class])
        # The best confidence among the *other* classes: the best overall unless the chain's class holds it.
        order = np.argsort(-row_conf, kind="stable")
        best = row_conf[order[0]] if order.size else -np.inf
        second = row_conf[order[1]] if order.size > 1 else -np.inf
        self.best_other = np.where(self.held_class == (row_klass[order[0]] if order.size else -2), second, best)

    @cached_property
    def _histories(self) -> dict[int, np.ndarray]:
        """Each chain's classes with end ≤ t, latest first (chains with none are absent)."""
        avail = np.flatnonzero(self.end <= self.t)
        order = avail[np.lexsort((-self.step[avail], self.sequence[avail]))]  # chain-major, latest first
        chains, first, length = np.unique(self.sequence[order], return_index=True, return_counts=True)
        return {int(n): self.klass[order[f : f + m]] for n, f, m in zip(chains, first, length)}

    @cached_property
    def run(self) -> np.ndarray:
        """(N,) the number of the chain's latest answers in a row that are one class."""
        run = np.zeros(self.num_chains, np.int64)
        for n, mine in self._histories.items():
            changed = np.flatnonzero(mine != mine[0])
            run[n] = changed[0] if changed.size else mine.size
        return run

    @cached_property
    def distinct(self) -> np.ndarray:
        """(N,) the number of classes among the chain's answers (0 for a chain with none)."""
        distinct = np.zeros(self.num_chains, np.int64)
        for n, mine in self._histories.items():
            distinct[n] = np.unique(mine).size
        return distinct

    @cached_property
    def support(self) -> np.ndarray:
        """(N,) the chains (any status) whose held answer is of the chain's held class (0 for a chain with none)."""
        holding = self.held_class[self.held >= 0]
        return np.array([(holding == k).sum() if k >= 0 else 0 for k in self.held_class])

    def features(self, status: np.ndarray) -> np.ndarray:
        n = self.held.size
        confident = lambda c: np.where(np.isfinite(c), logit(np.where(np.isfinite(c), c, 0.5), eps=1e-4), -9.2)
        given = np.maximum(self.count, 1)
        return np.stack(
            [
                confident(self.conf),
                confident(self.best_other),
                ((self.held >= 0) & (self.conf > self.best_other)).astype(np.float64),
                np.log1p(self.run),
                np.log1p(self.count),
                self.distinct / given,
                self.support / n,
                np.full(n, (status == ENDED).sum() / n),
            ],
            axis=1,
        )
