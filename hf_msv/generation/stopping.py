"""The parallel early-stopping rule, once: a pure numpy function, and the `StoppingCriteria` that applies it live.

Rule (paper, "Early stopping of parallel decoding"): an answer becomes available at step end (`MSVAnswer.end`: τ + L
in the paper, τ + P + L when its P elicitation-prompt tokens are fed one per step alongside the chain of thought),
and

    t* = min{t : max over answers with end ≤ t of score ≥ λ};

the output is the answer with the highest score available at t*. If λ is never reached, decoding runs to completion
and the output is the best *terminal* answer (the best answer overall when the group has no terminal answer), and t*
is the step at which the last answer became available. Ties between equal scores go to the answer available first,
then to the lower answer index. A nan (or `None`) score is an answer that was never scored: it never reaches λ and
is never output. A stop head with a confidence of its own (`hf_msv.StopHead`) times the stop with its statistic and
picks the output by its confidence (``select``): the most probably right answer available at t*.

A class-level statistic (`hf_msv.stop_rules`) is applied to *class snapshots* (``snapshots=True``): at each
arrival time every class's value is refreshed, so t* is the first time some class's current value reaches λ, and
the output is the class of highest current confidence then (with λ never reached: in the last snapshot).

`decide_stop` is the only implementation. The generation hook (`MSVEarlyStop`, through the per-call run) applies it
to a prompt's scored answers each time the verifier scores new answers, passing them in `MSVResult.answers`
order ((τ, sequence, step)), and the evaluation replay (`hf_msv.evaluation.early_stop.replay_many`) applies it to a
recorded `AnswerGroup` for a whole λ grid at once; an `AnswerGroup` built from `MSVResult.answers` in that order
therefore replays to the same decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from transformers import StoppingCriteria

from ..pruning import PruneRule
from ..stop_rules import ConfidenceMap, current_leaders

__all__ = ["CERTIFIED", "MSVEarlyStop", "StopDecision", "decide_stop"]

CERTIFIED = "certified"
"""``threshold=CERTIFIED`` (the default of `msv_generate`, `MSVSession.generate` and the vLLM controller): stop and
prune as the verifier certified on held-out calibration problems (`MSVEarlyStop.from_verifier`); full decoding when
it certified nothing."""


@dataclass(frozen=True)
class StopDecision:
    """Outcome of the stopping rule on one group for Λ thresholds; every field has shape (Λ,).

    Args:
        stopped: λ was reached (False: ran to completion, best terminal answer).
        stop_step: t*; the step at which the last answer became available when λ was never reached (-1 for a group
            without answers).
        chosen: index of the output answer in the order the answers were given; -1 when no answer has a score.
        num_available: entries with end ≤ t*.
    """

    stopped: np.ndarray
    stop_step: np.ndarray
    chosen: np.ndarray
    num_available: np.ndarray


def decide_stop(end, scores, is_terminal, thresholds, select=None, snapshots: bool = False) -> StopDecision:
    """Apply the early-stopping rule (module docstring) to one group's entries for every threshold.

    Args:
        end: (A,) int, the step at which each entry becomes available.
        scores: (A,) float, verifier scores; nan or `None` for an entry without a score.
        is_terminal: (A,) bool, the entry stands for an answer elicited when its sequence ended.
        thresholds: λ, a float or (Λ,) floats; `None`, nan and values above every score never stop.
        select: (A,) float, what picks the output among the candidates (highest first, same ties); `None`: `scores`.
            Only scored entries are candidates.
        snapshots: the entries are class snapshots (`hf_msv.stop_rules.StopEvents`): an entry is current only until
            the next later end, when the next snapshot refreshes every class; the output is picked among the entries
            current at t* (when λ is never reached, among the last snapshot's). `False`: answers, current once
            available.

    Returns:
        A `StopDecision` of (Λ,) arrays. Indices refer to positions in `end` / `scores`.

    O(A log A + Λ log A): the running maximum over the entries in arrival order is computed once and every λ is a
    binary search in it, which is what lets the replay sweep ~100 λ over thousands of groups. The stop time is the
    same either way: a snapshot's values were reached at its time.
    """
    lam = np.asarray([np.nan if thresholds is None else thresholds], dtype=np.float64).reshape(-1)
    end = np.asarray(end, dtype=np.int64).reshape(-1)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    terminal = np.asarray(is_terminal, dtype=bool).reshape(-1)
    pick = s if select is None else np.asarray(select, dtype=np.float64).reshape(-1)
    if not end.size == s.size == terminal.size == pick.size:
        raise ValueError(
            "end, scores, is_terminal and select need one entry per answer, got "
            f"{end.size}, {s.size}, {terminal.size} and {pick.size}"
        )
    n_lam = lam.size
    if s.size == 0:
        return StopDecision(
            np.zeros(n_lam, bool),
            np.full(n_lam, -1, np.int64),
            np.full(n_lam, -1, np.int64),
            np.zeros(n_lam, np.int64),
        )
    scored = ~np.isnan(s)
    s = np.where(scored, s, -np.inf)
    pick = np.where(scored & ~np.isnan(pick), pick, -np.inf)
    # nan λ never stops; any real λ, even -inf, needs a real score (-inf stands for "no score" below).
    lam = np.where(np.isnan(lam), np.inf, np.maximum(lam, -np.finfo(np.float64).max))

    order = np.lexsort((np.arange(s.size), end))  # arrival order: by end, then index
    e, so, po = end[order], s[order], pick[order]
    run_max = np.maximum.accumulate(so)
    last = np.concatenate([e[1:] != e[:-1], [True]])  # the last arrival of each distinct end time
    b_end, b_max, b_arg = e[last], run_max[last], order[current_leaders(po, e, snapshots)]
    b_count = np.flatnonzero(last) + 1
    j = np.searchsorted(b_max, lam, side="left")  # first time the running max reaches λ (b_max is sorted)
    stopped = j < b_end.size
    jj = np.where(stopped, j, b_end.size - 1)
    final = e == e[-1] if snapshots else np.ones(e.size, bool)  # the candidates when λ is never reached
    fallback = _best(order, po, (terminal & scored)[order] & final, scored[order] & final)
    chosen = np.where(stopped, b_arg[jj], fallback)
    return StopDecision(
        stopped=stopped,
        stop_step=b_end[jj],
        chosen=chosen.astype(np.int64),
        num_available=b_count[jj].astype(np.int64),
    )


def _best(order: np.ndarray, so: np.ndarray, terminal: np.ndarray, scored: np.ndarray) -> int:
    """The entry output when λ is never reached: the scored terminal entry of highest `so` (the selection values),
    else the scored entry of highest `so`, else -1; `so`, `terminal`, `scored` are in arrival order, so argmax's
    first maximum is the earliest arrival."""
    for candidates in (terminal, scored):
        if candidates.any():
            return int(order[np.flatnonzero(candidates)[np.argmax(so[candidates])]])
    return -1


class MSVEarlyStop(StoppingCriteria):
    """Stopping criterion that runs MSV elicitation and scoring and stops a prompt's N sequences at t*.

    Pass it to ``model.generate(..., custom_generate=msv, stopping_criteria=[MSVEarlyStop(λ)])`` with the
    `MSVSession` of `prepare_generation` as the loop, which binds it to the call's run (`bind`).

    Args:
        threshold: λ. A prompt stops at the first step where the best available answer score is ≥ λ. `None` or
            a value > 1 never stops (answers are still elicited and scored); 0 stops at the first answer. Ignored
            in terminal mode, where all answers arrive at the end.
        prune: the per-chain pruning rule (`hf_msv.pruning.PruneRule`, `None`: no pruning): a chain it prunes
            stops decoding while its prompt goes on (docs/pruning.md).
        confidence_map: what maps the confidence a stop reports to the one it was calibrated to
            (`hf_msv.stop_rules.ConfidenceMap`, fitted with a certified pruning rule); `None`: reported as is.

    Returns (when called): `(batch,)` bool tensor, True for every row of a prompt that has stopped or was pruned.
    """

    def __init__(
        self,
        threshold: float | None = None,
        prune: PruneRule | None = None,
        confidence_map: ConfidenceMap | None = None,
    ):
        self.threshold = threshold
        self.prune = prune
        self.confidence_map = confidence_map
        self.choice = None
        self.run = None

    @classmethod
    def resolve(cls, threshold: float | str | None, verifier, prune: bool | PruneRule = True) -> MSVEarlyStop:
        """The criterion of a ``threshold=`` argument: a λ, `None` (full decoding: no stop, no pruning) or
        `CERTIFIED` (what `verifier` certified, `from_verifier`; full decoding without a certified rule).

        Args:
            threshold: λ, `None` or `CERTIFIED`.
            verifier: what scores the answers (anything with a ``config``), or `None`.
            prune: `False` turns the certified pruning off alone; a `PruneRule` replaces it (with any threshold but
                `None`, which is full decoding).

        Raises:
            ValueError: another string.
        """
        if isinstance(threshold, str):
            if threshold != CERTIFIED:
                raise ValueError(f"threshold must be a number, None or {CERTIFIED!r}, got {threshold!r}")
            config = getattr(verifier, "config", None)
            from ..lambda_rule import LambdaChoice

            if LambdaChoice.of(config) is None:
                return cls(None)
            criterion = cls.from_verifier(verifier, prune=prune is not False)
        else:
            criterion = cls(threshold)
        if isinstance(prune, PruneRule) and threshold is not None:
            criterion.prune = None if prune.off else prune
        return criterion

    @classmethod
    def from_verifier(cls, verifier, prune: bool = True) -> MSVEarlyStop:
        """The criterion at the λ chosen with `verifier` on validation (``config.early_stopping["lambda"]``,
        written by ``hf-msv train``; `hf_msv.lambda_rule.choose_lambda`). ``.choice`` holds that choice (its rule,
        guarantee and validation figures; ``.choice.describe()`` says it in one line).

        With a pruning rule certified jointly with a λ (``config.early_stopping["pruning"]``, docs/pruning.md), the
        criterion is that pair: its λ (not the stop-alone λ), its rule and its stop-time confidence map; else the
        stop alone at its λ, with the confidence map fitted on its calibration stops (``config.early_stopping[
        "confidence_map"]``, when present).

        Args:
            verifier: an `MSVVerifier` (or anything with a ``config``) saved with an early-stopping λ.
            prune: `False`: the stop alone, at the λ certified for it.

        Returns:
            The `MSVEarlyStop` (threshold `None` when the chosen λ is ∞).

        Raises:
            ValueError: the verifier carries no early-stopping λ (a terminal verifier, or one saved without it).
        """
        from ..lambda_rule import LambdaChoice

        choice = LambdaChoice.of(verifier.config)
        if choice is None:
            raise ValueError(
                f"{type(verifier).__name__} carries no early-stopping λ (config.early_stopping): a streaming MSV "
                "trained with `hf-msv train` has one; otherwise pass MSVEarlyStop(threshold) chosen on validation."
            )
        pair = (getattr(verifier.config, "early_stopping", None) or {}).get("pruning") or {}
        if prune and pair.get("lambda") is not None:
            joint = LambdaChoice.from_dict(pair["lambda"])
            rule = PruneRule.of(verifier.config)
            criterion = cls(
                None if math.isinf(joint.lam) else joint.lam,
                None if rule.off else rule,
                ConfidenceMap.from_dict(pair.get("confidence_map")),
            )
            criterion.choice = joint
            return criterion
        certified = not math.isinf(choice.lam)
        criterion = cls(
            choice.lam if certified else None, None, ConfidenceMap.of(verifier.config) if certified else None
        )
        criterion.choice = choice
        return criterion

    def bind(self, run):
        """Attach the `GenerationRun` of the current ``generate`` call (`None` detaches).

        Args:
            run: the `GenerationRun`, or `None`.
        """
        self.run = run

    def __call__(self, input_ids: torch.LongTensor, scores: object = None, **kwargs):
        """One decoding step of the attached run (the `StoppingCriteria` interface).

        Args:
            input_ids (`(batch, seq_len)` long): the sequences so far.
            scores: the step's scores (unused).
            **kwargs: unused.

        Returns:
            `(batch,)` bool tensor, True for every row of a prompt that has stopped.

        Raises:
            RuntimeError: if no `prepare_generation` session is attached.
        """
        if self.run is None:
            raise RuntimeError(
                "MSVEarlyStop runs inside MSV generation: msv = hf_msv.prepare_generation(model, tokenizer, ...), "
                "then model.generate(..., custom_generate=msv, stopping_criteria=[MSVEarlyStop(...)])."
            )
        return self.run.step(input_ids)
