"""Bookkeeping of one ``generate`` call: what each batch row has generated and why it ended, and what each prompt's
group of N rows has elicited and decided.

Rows are laid out as ``generate`` lays them out with ``num_return_sequences=N``: row r is sequence r % N of prompt
r // N.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..stop_rules import stop_time_features
from .outputs import MSVAnswer, answer_sort_key
from .stopping import decide_stop

if TYPE_CHECKING:
    from ..equivalence import EquivalenceClasses
    from .forking import Branch

__all__ = ["BUDGET", "EOS", "LIVE", "PRUNED", "STOPPED", "PromptGroup", "RowTracker"]

# Row status; all but LIVE are `MSVResult.finish_reasons`.
LIVE, EOS, BUDGET, STOPPED, PRUNED = "live", "eos", "budget", "stopped", "pruned"


@dataclass
class PromptGroup:
    """State of one prompt's N sequences.

    Args:
        classes: the prompt's `EquivalenceClasses` (`None` without checker).
        answers: every answer elicited so far, in elicitation order.
        live: rows still decoding.
        inflight: branches still decoding their answer.
        decided: the stopping rule has chosen an answer (or no verifier will).
        stopped_early: λ was reached while a row was still decoding.
        stop_step: t* once decided.
        chosen: the output answer once decided.
        confidence: what the stop reports for it: the chosen class's confidence at t* (its row of the snapshot
            with a class-level statistic), else the answer's own.
    """

    classes: EquivalenceClasses | None
    answers: list[MSVAnswer] = field(default_factory=list)
    live: int = 0
    inflight: int = 0
    decided: bool = False
    stopped_early: bool = False
    stop_step: int | None = None
    chosen: MSVAnswer | None = None
    confidence: float | None = None
    final: set[int] = field(default_factory=set)  # id() of the pruned chains' held answers

    def is_final(self, answer: MSVAnswer) -> bool:
        """Whether `answer` is its chain's final answer: its terminal answer, or a pruned chain's held answer (a
        candidate when λ is never reached, as `hf_msv.training.pruned_replay` replays it)."""
        return answer.terminal or id(answer) in self.final

    @property
    def finished(self) -> bool:
        """Every sequence has ended (EOS, budget or stop)."""
        return self.live == 0

    @property
    def settled(self) -> bool:
        """Every sequence has ended and every answer is complete: nothing more will arrive."""
        return self.live == 0 and self.inflight == 0

    def apply_stop_rule(self, threshold: float | None, pending: bool) -> bool | None:
        """Decide once λ is reached, or once every answer is scored (settled and nothing `pending`): sets
        `decided`, `stop_step`, `chosen` by `decide_stop` over the scored answers.

        Returns:
            True when λ was reached, False when decided without it, `None` while undecided.
        """
        # Every answer available so far, in `MSVResult.answers` order: the rule breaks ties by this order, so
        # replaying the result offline (`hf_msv.evaluation.early_stop.replay`) reaches the same decision.
        scored = sorted((a for a in self.answers if a.score is not None), key=answer_sort_key)
        snapshots = any(a.class_values is not None for a in scored)
        if snapshots:  # a class-level statistic: every class's refreshed row at each arrival (class snapshots)
            rows = [(a.end, v.answer, v.statistic, v.confidence) for a in scored for v in a.class_values or ()]
        else:
            rows = [(a.end, a, a.score, a.reported_confidence) for a in scored]
        end, candidates, statistic, select = (list(column) for column in zip(*rows)) if rows else ([],) * 4
        terminal = [self.is_final(a) for a in candidates]
        decision = decide_stop(end, statistic, terminal, threshold, select=select, snapshots=snapshots)
        stopped = bool(decision.stopped[0])
        if not stopped and not (self.settled and not pending):
            return None
        index = int(decision.chosen[0])
        self.decided, self.stop_step = True, int(decision.stop_step[0])
        self.chosen = candidates[index] if index >= 0 else None
        self.confidence = float(select[index]) if index >= 0 and select[index] is not None else None
        return stopped

    def stop_time_features(self, num_chains: int) -> np.ndarray:
        """(F,) `hf_msv.stop_rules.STOP_TIME_FEATURES` of the decision (its chosen answer at `stop_step`), over the
        scored answers then: what a `ConfidenceMap` that weighs them reads, as the replay computes them."""
        assert self.chosen is not None and self.stop_step is not None
        seen = [a for a in self.answers if a.score is not None]
        scores = [a.score if a.verifier_score is None else a.verifier_score for a in seen]
        klass, sequence, step, end = zip(*((a.class_id, a.sequence, a.step, a.end) for a in seen))
        chosen = next(i for i, a in enumerate(seen) if a is self.chosen)
        return stop_time_features(scores, klass, sequence, step, end, num_chains, self.stop_step, chosen)


class RowTracker:
    """Per-row state of one ``generate`` call and the per-prompt groups.

    Args:
        num_rows: batch rows (prompts × N).
        num_sequences: N.
        new_classes: factory of a prompt's equivalence classes (`None`: no class assignment).
    """

    def __init__(self, num_rows: int, num_sequences: int, new_classes: Callable[[], EquivalenceClasses] | None):
        if num_rows % num_sequences:
            raise ValueError(f"batch of {num_rows} rows is not a multiple of num_return_sequences={num_sequences}.")
        self.N = num_sequences
        self.status = [LIVE] * num_rows
        self.end_step = [-1] * num_rows  # step of the row's last generated token
        self.history: list[list[int]] = [[] for _ in range(num_rows)]
        self.num_answers = [0] * num_rows
        self.elicitation_tokens = [0] * num_rows
        self.last_branch: list[Branch | None] = [None] * num_rows  # the row's latest elicitation
        self.inflight = [0] * num_rows  # the row's elicitations still decoding
        self.groups = [
            PromptGroup(classes=new_classes() if new_classes else None, live=num_sequences)
            for _ in range(num_rows // num_sequences)
        ]

    def rows_of(self, prompt: int) -> range:
        return range(prompt * self.N, (prompt + 1) * self.N)

    def group_of(self, row: int) -> PromptGroup:
        return self.groups[row // self.N]

    def end_row(self, row: int, t: int, status: str):
        """Row `row` generated its last token at step `t` (`status`: EOS, BUDGET or STOPPED)."""
        self.status[row] = status
        self.end_step[row] = t
        self.group_of(row).live -= 1

    def record_answer(self, row: int, answer: MSVAnswer, fed_tokens: int):
        """Count a new answer of `row`: its step index and the elicitation tokens it cost."""
        self.num_answers[row] += 1
        self.elicitation_tokens[row] += fed_tokens + answer.length

    def last_step(self, prompt: int) -> int:
        """The step at which the prompt's last sequence ended."""
        return max(self.end_step[r] for r in self.rows_of(prompt))
