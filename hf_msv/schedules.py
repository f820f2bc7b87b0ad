"""What a stopping or pruning rule did to one group of N chains, and what that cost: a `Schedule`.

Every rule the replay compares (the MSV's certified stop and pruning, the field's per-chain and group rules) turns a
recorded group into one `Schedule` per parameter setting, and every report reads tokens and accuracy from it, so
two rules are compared on the same accounting. Times are shared decode steps, 0 at the first generated token (the
convention of `hf_msv.data.AnswerGroup` and `hf_msv.generation.decide_stop`).

A chain is *cut* at step c when a rule stops it there (its own prune, or the group's stop): it has decoded
``min(c, seq_len)`` chain-of-thought tokens, the convention of the stop-only replay
(`hf_msv.evaluation.early_stop.replay_many`), and only its answers with ``end <= c`` were ever available.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["NEVER", "Schedule"]

NEVER = np.iinfo(np.int64).max  # the cut of a chain no rule stopped: it decoded to its own end


@dataclass(frozen=True)
class Schedule:
    """One rule's outcome on one group.

    Args:
        cut: (N,) int, the step at which each chain was stopped by the rule (`NEVER`: it ran to its own end).
        pruned: (N,) bool, the chain was stopped alone, before the group's stop and before its own end.
        stop_step: t*, the group's stop (the step its output was decided at).
        stopped: the group stopped before every chain ended.
        chosen: index of the output answer in the group's answers (-1: none).
        confidence: what the rule reports for its output (nan: it reports nothing).
    """

    cut: np.ndarray
    pruned: np.ndarray
    stop_step: int
    stopped: bool
    chosen: int
    confidence: float = float("nan")

    def __post_init__(self):
        object.__setattr__(self, "cut", np.asarray(self.cut, dtype=np.int64).reshape(-1))
        object.__setattr__(self, "pruned", np.asarray(self.pruned, dtype=bool).reshape(-1))
        if self.cut.shape != self.pruned.shape:
            raise ValueError(f"cut and pruned need one entry per chain, got {self.cut.shape} and {self.pruned.shape}")

    @property
    def num_pruned(self) -> int:
        return int(self.pruned.sum())

    def cot_tokens(self, seq_len) -> int:
        """Chain-of-thought tokens decoded: Σ_n min(cut_n, seq_len_n).

        Args:
            seq_len: (N,) int, the tokens each chain decodes without any rule (`AnswerGroup.seq_len`).
        """
        seq_len = np.asarray(seq_len, dtype=np.int64).reshape(-1)
        if seq_len.shape != self.cut.shape:
            raise ValueError(f"seq_len needs {self.cut.size} entries, got {seq_len.size}")
        return int(np.minimum(self.cut, seq_len).sum())

    def elicitation_tokens(self, sequence, start, end) -> int:
        """Elicitation tokens processed: Σ_a clip(cut_{n_a} − τ_a, 0, end_a − τ_a), each answer's segment and prompt
        tokens and its answer tokens fed from τ_a on, counted up to its chain's cut (all of them when it became
        available before the cut, part of them when the cut fell while it was being elicited).

        Args:
            sequence, start, end: (A,) int, each answer's chain, elicitation step τ and availability step.
        """
        sequence = np.asarray(sequence, dtype=np.int64).reshape(-1)
        start = np.asarray(start, dtype=np.int64).reshape(-1)
        span = np.asarray(end, dtype=np.int64).reshape(-1) - start
        return int(np.clip(self.cut[sequence] - start, 0, span).sum())

    def available(self, sequence, end) -> np.ndarray:
        """(A,) bool, the answers that became available before their chain was cut.

        Args:
            sequence, end: (A,) int, each answer's chain and availability step.
        """
        sequence = np.asarray(sequence, dtype=np.int64).reshape(-1)
        return np.asarray(end, dtype=np.int64).reshape(-1) <= self.cut[sequence]
