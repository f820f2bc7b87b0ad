"""`CollectedProblem`: everything collected for one problem, in memory (what a shard stores per problem)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["CollectedProblem"]


@dataclass
class CollectedProblem:
    """Everything collected for one problem: S sampled sequences and their A answers (T answer tokens).

    Per-answer arrays are `(A,)` and ordered by (τ, sequence, step); answer a's tokens are rows
    ``answer_token_start[a] : answer_token_start[a] + answer_length[a]`` of the token arrays, which follow the
    answer order without gaps.

    Args:
        problem_id, gold, source, question: the problem (``question``: its text, "" when unknown).
        hidden_states: `(T, d)` answer-token hidden states (any float dtype; written in 16 bits), or `None` when
            read without them.
        token_ids: `(T,)` int answer tokens. token_logprobs: `(T,)` float32, nan where unknown.
        answer_text: `A` box contents (`None` = no answer). answer_raw_text, answer_trigger: `A` strings.
        answer_sequence, answer_step, answer_tau, answer_length, answer_class: `(A,)` int.
        answer_terminal, answer_correct: `(A,)` bool.
        sequence_length: `(S,)` int CoT tokens generated per sequence. sequence_finish: `S` strings.
        cot_confidence: `S` arrays `(sequence_length[n],)` float32 of DeepConf token confidences.
        cot_token_ids: `S` arrays `(sequence_length[n],)` int64, the sampled chain-of-thought tokens (EOS
            included), for post-hoc scorers that re-read the text (a PRM).
        Both CoT lists are empty when unknown (shards written before them, traces without them).
        answer_end: `(A,)` int, the step at which each answer became available (`MSVAnswer.end`: τ + P + L when
            the P elicitation-prompt tokens were fed one per step); `None` (collections that did not record it)
            means τ + L.
    """

    problem_id: str
    gold: str
    hidden_states: torch.Tensor | None
    token_ids: np.ndarray
    token_logprobs: np.ndarray
    answer_text: list
    answer_raw_text: list
    answer_trigger: list
    answer_sequence: np.ndarray
    answer_step: np.ndarray
    answer_tau: np.ndarray
    answer_length: np.ndarray
    answer_class: np.ndarray
    answer_terminal: np.ndarray
    answer_correct: np.ndarray
    sequence_length: np.ndarray
    sequence_finish: list
    cot_confidence: list = field(default_factory=list)
    source: str = ""
    cot_token_ids: list = field(default_factory=list)
    question: str = ""
    answer_end: np.ndarray | None = None

    def __post_init__(self):
        for name in (
            "answer_sequence",
            "answer_step",
            "answer_tau",
            "answer_length",
            "answer_class",
            "sequence_length",
            "token_ids",
        ):
            setattr(self, name, np.asarray(getattr(self, name), dtype=np.int64).reshape(-1))
        for name in ("answer_terminal", "answer_correct"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=bool).reshape(-1))
        if self.answer_end is None:
            self.answer_end = self.answer_tau + self.answer_length
        self.answer_end = np.asarray(self.answer_end, dtype=np.int64).reshape(-1)
        if len(self.answer_end) != len(self.answer_sequence):
            raise ValueError("answer_end needs one entry per answer")
        self.token_logprobs = np.asarray(self.token_logprobs, dtype=np.float32).reshape(-1)
        self.cot_confidence = [np.asarray(c, dtype=np.float32).reshape(-1) for c in self.cot_confidence]
        self.cot_token_ids = [np.asarray(c, dtype=np.int64).reshape(-1) for c in self.cot_token_ids]
        a, t = len(self.answer_sequence), int(self.answer_length.sum())
        if not (len(self.answer_text) == len(self.answer_raw_text) == len(self.answer_trigger) == a):
            raise ValueError("answer_text, answer_raw_text and answer_trigger need one entry per answer")
        if len(self.token_ids) != t or len(self.token_logprobs) != t:
            raise ValueError(f"token arrays must have sum(answer_length) = {t} rows")
        if self.hidden_states is not None and self.hidden_states.shape[0] != t:
            raise ValueError(f"hidden_states has {self.hidden_states.shape[0]} rows, answers have {t} tokens")
        if len(self.sequence_finish) != len(self.sequence_length):
            raise ValueError("sequence_finish needs one entry per sequence")
        if self.cot_confidence and len(self.cot_confidence) != len(self.sequence_length):
            raise ValueError("cot_confidence needs one array per sequence")
        if self.cot_token_ids and [len(c) for c in self.cot_token_ids] != self.sequence_length.tolist():
            raise ValueError("cot_token_ids needs one array of sequence_length[n] tokens per sequence")

    @property
    def num_answers(self) -> int:
        return len(self.answer_sequence)

    @property
    def num_sequences(self) -> int:
        return len(self.sequence_length)

    @property
    def answer_token_start(self) -> np.ndarray:
        """`(A,)` first row of each answer in the token arrays (answers are stored back to back)."""
        return np.concatenate([[0], np.cumsum(self.answer_length)[:-1]]).astype(np.int64)
