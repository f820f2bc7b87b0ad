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

Only chains still decoding (`DECODING`) that have answered at least `min_answers` times are pruned.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["DECODING", "ENDED", "PRUNED", "PRUNE_OFF", "PruneRule", "chain_status", "held_answers", "prune_chains"]

DECODING, ENDED, PRUNED = 0, 1, 2  # a chain's status at t: still decoding, ended on its own, pruned


@dataclass(frozen=True)
class PruneRule:
    """The parameters of `prune_chains`; every clause is off when its parameter is `None` (`PRUNE_OFF`: all off).

    Args:
        doubt: ruled out: prune a chain whose held class has confidence ≤ `doubt` ...
        lead: ... while another class has confidence ≥ `lead`.
        steady: steady: prune a chain whose last `steady` answers all are one class ...
        steady_confidence: ... of confidence ≥ `steady_confidence` (0: any class).
        min_answers: a chain is pruned only once it has answered at least this many times.
    """

    doubt: float | None = None
    lead: float = 0.5
    steady: int | None = None
    steady_confidence: float = 0.0
    min_answers: int = 1

    @property
    def off(self) -> bool:
        """No clause can fire: the group stop alone."""
        return self.doubt is None and self.steady is None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> PruneRule:
        """The rule written by `to_dict` (`None` or an empty dict: `PRUNE_OFF`)."""
        return cls(**(d or {}))

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
    klass = np.asarray(klass, np.int64).reshape(-1)
    held, count = held_answers(t, sequence, step, end, status.size)
    live = (status == DECODING) & (held >= 0) & (count >= rule.min_answers)
    if not live.any():
        return out
    row_klass = np.asarray(row_klass, np.int64).reshape(-1)
    row_conf = np.asarray(row_confidence, np.float64).reshape(-1)
    held_class = np.where(held >= 0, klass[np.maximum(held, 0)], -1)
    # The confidence of each chain's held class in the snapshot (a held class always has a row; -inf if not).
    lookup = {int(k): float(c) for k, c in zip(row_klass, row_conf)}
    conf = np.array([lookup.get(int(k), -np.inf) for k in held_class])
    if rule.doubt is not None:
        # The best confidence among the *other* classes: the best overall unless the chain's class holds it.
        order = np.argsort(-row_conf, kind="stable")
        best = row_conf[order[0]] if order.size else -np.inf
        second = row_conf[order[1]] if order.size > 1 else -np.inf
        best_other = np.where(held_class == (row_klass[order[0]] if order.size else -2), second, best)
        out |= live & (conf <= rule.doubt) & (best_other >= rule.lead)
    if rule.steady is not None:
        out |= (
            live & _steady(t, sequence, step, end, klass, status.size, rule.steady) & (conf >= rule.steady_confidence)
        )
    return out


def _steady(t: int, sequence, step, end, klass, num_chains: int, window: int) -> np.ndarray:
    """(N,) bool: the chain's last `window` answers with end ≤ t exist and all are one class."""
    sequence, step, end = (np.asarray(x, np.int64).reshape(-1) for x in (sequence, step, end))
    avail = np.flatnonzero(end <= t)
    order = avail[np.lexsort((-step[avail], sequence[avail]))]  # chain-major, latest first
    out = np.zeros(num_chains, bool)
    chains, first, length = np.unique(sequence[order], return_index=True, return_counts=True)
    for n, f, m in zip(chains, first, length):
        if m >= window:
            last = klass[order[f : f + window]]
            out[n] = bool((last == last[0]).all())
    return out
