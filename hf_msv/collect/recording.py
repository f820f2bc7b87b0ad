"""One problem's elicited answers → its `CollectedProblem` record (shared by live collection and re-encoding)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..data import CollectedProblem
from ..data.problems import Problem

__all__ = ["build_record", "is_correct"]


def is_correct(checker, text: str | None, problem: Problem) -> bool:
    """The label: `text` is equivalent to the gold answer or one of ``problem.meta["gold_alternatives"]``."""
    golds = [problem.gold] + [g for g in (problem.meta.get("gold_alternatives") or []) if g != problem.gold]
    return text is not None and any(checker.is_correct(text, str(g)) for g in golds)


def build_record(
    problem: Problem,
    answers: Sequence,
    sequences: Sequence[Sequence[int]],
    finish: Sequence[str],
    confidence: Sequence[np.ndarray],
    checker,
    hidden_size: int,
) -> CollectedProblem:
    """The shard record of one problem.

    Args:
        answers: its `MSVAnswer`s (with hidden states `(L, d)` and token log-probs; classes already assigned), in
            any order: stored in elicitation order (τ, sequence, step).
        sequences: per sequence n, its generated token ids (EOS included). finish: per sequence, why it ended.
        confidence: per sequence, `(len(sequences[n]),)` DeepConf token confidences, or empty arrays (missing).
        checker: the collection's equivalence checker (labels).
        hidden_size: d, for a problem without answers.
    """
    answers = sorted(answers, key=lambda a: (a.tau, a.sequence, a.step))  # elicitation order
    logprobs = [np.asarray(a.token_logprobs, dtype=np.float32).reshape(-1) for a in answers]
    return CollectedProblem(
        problem_id=problem.id,
        gold=problem.gold,
        source=problem.source,
        hidden_states=torch.cat([a.hidden_states for a in answers]) if answers else torch.zeros(0, hidden_size),
        token_ids=np.array([t for a in answers for t in a.token_ids], dtype=np.int64),
        token_logprobs=np.concatenate(logprobs) if logprobs else np.zeros(0, dtype=np.float32),
        answer_text=[a.text for a in answers],
        answer_raw_text=[a.raw_text for a in answers],
        answer_trigger=[a.trigger for a in answers],
        answer_sequence=np.array([a.sequence for a in answers], dtype=np.int64),
        answer_step=np.array([a.step for a in answers], dtype=np.int64),
        answer_tau=np.array([a.tau for a in answers], dtype=np.int64),
        answer_length=np.array([a.length for a in answers], dtype=np.int64),
        answer_end=np.array([a.end for a in answers], dtype=np.int64),
        answer_class=np.array([a.class_id for a in answers], dtype=np.int64),
        answer_terminal=np.array([a.terminal for a in answers], dtype=bool),
        answer_correct=np.array([is_correct(checker, a.text, problem) for a in answers], dtype=bool),
        sequence_length=np.array([len(s) for s in sequences], dtype=np.int64),
        sequence_finish=list(finish),
        cot_confidence=list(confidence),
        cot_token_ids=[np.asarray(s, dtype=np.int64) for s in sequences],
        question=problem.question,
    )
