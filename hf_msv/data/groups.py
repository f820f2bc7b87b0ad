"""Groups: which answers of a problem one verifier call sees, and `AnswerGroup`, the record metrics read.

A *group* is the answers of N of the S sequences collected for one problem (terminal mode: their terminal answers;
streaming: all their answers), with the sequences renumbered 0..N-1 in draw order. Training (`ShardDataset`) and
evaluation draw groups differently (a per-epoch partition vs a fixed subset per seed) but select, read and
describe them with the functions below, so the two paths cannot drift apart.

Every function reads the answer columns of one problem through the attribute names of `CollectedProblem`
(``answer_sequence``, ``answer_terminal``, ... and ``num_sequences``): a `CollectedProblem` or the lighter
`AnswerColumns` that `ShardDataset` builds from its in-memory index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import UserError

if TYPE_CHECKING:
    from ..stop_rules import StopEvents

MODES = ("terminal", "streaming")

__all__ = [
    "MODES",
    "AnswerGroup",
    "AnswerColumns",
    "StopInputs",
    "draw_sequences",
    "partition_sequences",
    "select_answers",
    "read_group",
    "answer_group",
]


@dataclass(frozen=True, eq=False)
class AnswerGroup:
    """All answers elicited for one problem from N parallel sequences (one *group*).

    Every per-answer array has shape (A,), aligned by answer index. Times are shared decode steps counted from 0
    at the first generated token (see docs/architecture.md).

    Args:
        sequence: (A,) int, sequence index n in [0, N).
        end: (A,) int, τ + L: the step at which the answer becomes available.
        klass: (A,) int, equivalence-class id; only compared within the group.
        correct: (A,) bool, whether the answer is equivalent to the gold answer.
        is_terminal: (A,) bool, the answer elicited when its sequence ended (one per sequence).
        seq_len: (N,) int, chain-of-thought tokens each sequence decoded before it ended (= τ of its terminal
            answer). Used for token accounting in early stopping.
        start: (A,) int or None, τ (the step at which the delimiter fired / the sequence ended).
        scores: verifier name -> (A,) float scores in [0, 1] (e.g. ``{"msv": ..., "probe": ...}``).
        problem_id: identifier of the problem, for reports.
        confidences: verifier name -> (A,) the confidence a stop on each answer reports, for the names whose
            score is a stopping statistic with a confidence of its own (`hf_msv.StopHead.confidence`).
        events: verifier name -> its class snapshots (`hf_msv.stop_rules.StopEvents`), for the names whose score
            is a class-level stopping statistic: what the stop rule reads (`stop_inputs`).
    """

    sequence: np.ndarray
    end: np.ndarray
    klass: np.ndarray
    correct: np.ndarray
    is_terminal: np.ndarray
    seq_len: np.ndarray
    start: np.ndarray | None = None
    scores: Mapping[str, np.ndarray] = field(default_factory=dict)
    problem_id: str = ""
    confidences: Mapping[str, np.ndarray] = field(default_factory=dict)
    events: Mapping[str, StopEvents] = field(default_factory=dict)

    def __post_init__(self):
        conv = {"sequence": np.int64, "end": np.int64, "klass": np.int64, "correct": bool, "is_terminal": bool}
        for name, dtype in conv.items():
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=dtype).reshape(-1))
        object.__setattr__(self, "seq_len", np.asarray(self.seq_len, dtype=np.int64).reshape(-1))
        if self.start is not None:
            object.__setattr__(self, "start", np.asarray(self.start, dtype=np.int64).reshape(-1))
        for name in ("scores", "confidences"):
            columns = getattr(self, name)
            object.__setattr__(
                self, name, {k: np.asarray(v, dtype=np.float64).reshape(-1) for k, v in columns.items()}
            )
        a = self.sequence.shape[0]
        arrays = (
            {n: getattr(self, n) for n in (*conv, "start")}
            | {f"scores[{k!r}]": v for k, v in self.scores.items()}
            | {f"confidences[{k!r}]": v for k, v in self.confidences.items()}
        )
        bad = [n for n, v in arrays.items() if v is not None and v.shape != (a,)]
        if bad:
            raise ValueError(f"AnswerGroup arrays must all have shape ({a},); mismatched: {bad}")
        if a and self.sequence.max() >= self.seq_len.shape[0]:
            raise ValueError(
                f"sequence ids go up to {self.sequence.max()} but seq_len has {self.seq_len.shape[0]} entries"
            )

    def confidence_of(self, method: str) -> np.ndarray:
        """(A,) what `method` claims about each answer's correctness: its stop head's confidence when it has one
        (its score is then the stopping statistic), else its score."""
        return self.confidences.get(method, self.scores[method])

    def stop_inputs(self, method: str) -> StopInputs:
        """What the stop rule reads for `method`: its class snapshots when it has them, else its answers."""
        ev = self.events.get(method)
        if ev is None:
            return StopInputs(self.end, self.scores[method], self.is_terminal, self.confidence_of(method), None)
        return StopInputs(ev.time, ev.statistic, self.is_terminal[ev.answer], ev.confidence, ev.answer)

    @property
    def num_answers(self) -> int:
        return int(self.sequence.shape[0])

    @property
    def num_sequences(self) -> int:
        return int(self.seq_len.shape[0])


@dataclass(frozen=True)
class StopInputs:
    """The entries `hf_msv.generation.decide_stop` reads for one method on one group, all (E,): `end`, `scores`,
    `terminal`, `select`, and `answer`, the answer each entry stands for (`None`: the entries are the answers)."""

    end: np.ndarray
    scores: np.ndarray
    terminal: np.ndarray
    select: np.ndarray
    answer: np.ndarray | None

    @property
    def snapshots(self) -> bool:
        return self.answer is not None

    def answer_of(self, chosen: np.ndarray) -> np.ndarray:
        """The answer index of each chosen entry (-1 stays -1)."""
        if self.answer is None:
            return chosen
        return np.where(chosen >= 0, self.answer[np.maximum(chosen, 0)], -1)


@dataclass
class AnswerColumns:
    """The answer-level columns of one problem (every array `(A,)`, answers in stored order (τ, sequence, step)),
    without its strings or tokens: what selecting and reading a group needs.

    ``answer_token_start`` addresses the rows of the hidden states the group is read from (a whole shard for
    `ShardDataset`, the problem's own tensor for a `CollectedProblem`).

    Args:
        problem_id: the problem's id.
        num_sequences: S, the sequences collected for the problem.
        answer_sequence: sequence id of each answer.
        answer_step: answer step within its sequence.
        answer_tau: τ, the position in the sequence at which the answer was elicited.
        answer_length: L, the answer's token count.
        answer_class: equivalence-class id.
        answer_terminal: bool, the sequence's final answer.
        answer_correct: bool, graded correct.
        answer_token_start: first hidden-state row of the answer.
        answer_end: availability time τ + L; `None`: computed from `answer_tau` and `answer_length`.
    """

    problem_id: str
    num_sequences: int
    answer_sequence: np.ndarray
    answer_step: np.ndarray
    answer_tau: np.ndarray
    answer_length: np.ndarray
    answer_class: np.ndarray
    answer_terminal: np.ndarray
    answer_correct: np.ndarray
    answer_token_start: np.ndarray
    answer_end: np.ndarray | None = None

    def __post_init__(self):
        if self.answer_end is None:  # shards written before availability steps were stored
            self.answer_end = self.answer_tau + self.answer_length


def draw_sequences(num_collected: int, num_sequences: int, seed: int, problem_index: int) -> np.ndarray:
    """`(N,)` sequence ids (in draw order) of one problem's evaluation group for one seed: a fixed random subset,
    the same for every method and setting.

    Args:
        num_collected: S, the sequences collected for the problem.
        num_sequences: N.
        seed: the evaluation seed.
        problem_index: the problem's index.

    Returns:
        `(N,)` int array.

    Raises:
        UserError: if N > S.
    """
    if num_sequences > num_collected:
        raise UserError(f"N={num_sequences} but only {num_collected} sequences were collected")
    return np.random.default_rng([seed, problem_index]).permutation(num_collected)[:num_sequences]


def partition_sequences(
    num_collected: int,
    num_sequences: int,
    seed: int,
    epoch: int,
    problem_index: int,
    group_index: int,
    groups_per_problem: int | None = None,
) -> np.ndarray:
    """`(N,)` sequence ids of a training group: group j of the epoch's random partition of the S sequences into
    ⌊S/N⌋ groups, or (``groups_per_problem`` set) the j-th independent random subset.

    Args:
        num_collected: S, the sequences collected for the problem.
        num_sequences: N.
        seed: the training seed.
        epoch: the epoch.
        problem_index: the problem's index.
        group_index: j.
        groups_per_problem: `None` for the partition, else draw independent subsets.

    Returns:
        `(N,)` int array.
    """
    n = num_sequences
    if groups_per_problem is None:
        perm = np.random.default_rng([seed, epoch, problem_index]).permutation(num_collected)
        return perm[group_index * n : (group_index + 1) * n]
    return np.random.default_rng([seed, epoch, problem_index, group_index]).permutation(num_collected)[:n]


def select_answers(answers, sequences, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """The answers of `sequences` in a mode: ``(rows, sequence)``, both `(A_g,)`: stored rows in stored order and
    their sequence ids renumbered 0..N-1 in the order of `sequences`.

    Args:
        answers: a `CollectedProblem` or `AnswerColumns`.
        sequences: `(N,)` sequence ids of the group.
        mode: "terminal" keeps only the sequences' terminal answers; "streaming" keeps all.

    Returns:
        ``(rows, sequence)``, two `(A_g,)` int arrays.

    Raises:
        ValueError: an unknown `mode`.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    sequences = np.asarray(sequences, dtype=np.int64)
    slot = np.full(int(answers.num_sequences), -1, dtype=np.int64)
    slot[sequences] = np.arange(len(sequences))
    keep = slot[answers.answer_sequence] >= 0
    if mode == "terminal":
        keep &= answers.answer_terminal
    rows = np.flatnonzero(keep)
    return rows, slot[answers.answer_sequence[rows]]


def _read_rows(hidden, starts: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
    """`(sum(lengths), d)` rows ``starts[a] : starts[a] + lengths[a]`` of `hidden` for each a, read as few
    contiguous runs (consecutive answers are stored back to back, and a memory-mapped slice is cheapest in runs)."""
    pieces, run_start, run_end = [], None, None
    for a, n in zip(starts.tolist(), lengths.tolist()):
        if run_end == a:
            run_end = a + n
            continue
        if run_start is not None:
            pieces.append(hidden[run_start:run_end])
        run_start, run_end = a, a + n
    if run_start is not None:
        pieces.append(hidden[run_start:run_end])
    return torch.cat(pieces) if pieces else hidden[0:0]


def read_group(answers, hidden, sequences, mode: str) -> dict:
    """One group as a dataset item (the input of `hf_msv.data.collate_groups`).

    Args:
        answers: a `CollectedProblem` or `AnswerColumns`.
        hidden: the rows ``answer_token_start`` addresses, sliceable as ``hidden[a:b]``: a `(T, d)` tensor or a
            safetensors slice (read lazily).
        sequences: `(N,)` the group's sequence ids, in draw order. mode: "terminal" or "streaming".

    Returns a dict: ``problem_id`` (str), ``hidden_states`` `(T_g, d)` as stored, and `(A_g,)` tensors
    ``answer_length``, ``answer_sequence`` (renumbered 0..N-1 in draw order), ``answer_step`` (0 in terminal mode),
    ``answer_tau``, ``answer_end``, ``answer_class``, ``answer_terminal``, ``labels`` (float 0/1) and
    ``answer_index`` (the stored row of each answer in its problem); answers in stored order, each answer's tokens
    contiguous.
    """
    rows, seq = select_answers(answers, sequences, mode)
    starts = answers.answer_token_start[rows].astype(np.int64)
    lengths = answers.answer_length[rows].astype(np.int64)
    step = answers.answer_step[rows] if mode == "streaming" else np.zeros(len(rows), dtype=np.int64)
    tensor = lambda x, dt=torch.long: torch.as_tensor(np.asarray(x), dtype=dt)
    tau = answers.answer_tau[rows]
    return {
        "problem_id": answers.problem_id,
        "hidden_states": _read_rows(hidden, starts, lengths),
        "answer_length": tensor(lengths),
        "answer_sequence": tensor(seq),
        "answer_step": tensor(step),
        "answer_tau": tensor(tau),
        "answer_end": tensor(answers.answer_end[rows]),
        "answer_class": tensor(answers.answer_class[rows]),
        "answer_terminal": tensor(answers.answer_terminal[rows], torch.bool),
        "labels": tensor(answers.answer_correct[rows], torch.float32),
        "answer_index": tensor(rows),
    }


def answer_group(
    answers, sequences=None, mode: str = "streaming", scores: Mapping[str, np.ndarray] | None = None
) -> AnswerGroup:
    """The `AnswerGroup` of one problem's group.

    Args:
        answers: a `CollectedProblem` or `AnswerColumns`.
        sequences: `(N,)` the group's sequence ids in draw order (default: every collected sequence, in order, so
            sequence ids stay the stored ones).
        mode: "terminal" or "streaming" (which answers the group holds).
        scores: name -> `(A,)` scores over the problem's *stored* answers; the group keeps its answers' entries.

    Returns:
        The `AnswerGroup`.
    """
    if sequences is None:
        sequences = np.arange(int(answers.num_sequences))
    rows, seq = select_answers(answers, sequences, mode)
    term = answers.answer_terminal[rows]
    seq_len = np.zeros(len(sequences), dtype=np.int64)
    seq_len[seq[term]] = answers.answer_tau[rows][term]  # chain-of-thought tokens = τ of the terminal answer
    return AnswerGroup(
        sequence=seq,
        end=answers.answer_end[rows],
        klass=answers.answer_class[rows],
        correct=answers.answer_correct[rows],
        is_terminal=term,
        seq_len=seq_len,
        start=answers.answer_tau[rows],
        scores={k: np.asarray(v)[rows] for k, v in (scores or {}).items()},
        problem_id=answers.problem_id,
    )
