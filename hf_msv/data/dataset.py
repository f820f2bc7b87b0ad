"""`ShardDataset`, the one reader of collected shards for training and evaluation, and `collate_groups`, the one
packer of groups into the verifier's inputs."""

from __future__ import annotations

import copy
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from ..errors import MissingPathError, UserError
from .groups import MODES, AnswerColumns, answer_group, partition_sequences, read_group
from .records import CollectedProblem
from .shards import SHARD_GLOB, ShardIndex, list_shards, verify_checksums

logger = logging.getLogger(__name__)

__all__ = [
    "ShardDataset",
    "collate_groups",
    "VERIFIER_INPUTS",
    "load_split",
    "PRELOAD_BYTES",
    "subset_item",
    "subgroup_items",
]

# Up to this many bytes of hidden states (all shards together) a dataset holds them in memory once read: an item is
# then a few tensor slices instead of many small memory-mapped reads (~5x faster per item on the testbed's shards),
# and training reads every answer many times. Larger datasets stay memory-mapped, so they need not fit in RAM.
PRELOAD_BYTES = 2 << 30


class ShardDataset(torch.utils.data.Dataset):
    """Groups of N sequences' answers, read lazily from shards.

    Item ``i`` is one *group*: the answers of N of the S sequences collected for one problem (terminal mode: their
    terminal answers; streaming: all their answers). Which sequences form the groups is redrawn every epoch
    (`set_epoch`): by default each problem's S sequences are randomly partitioned into ⌊S/N⌋ groups, so an epoch
    sees every sequence once (N = 1: every sequence on its own, as the Probe and MSV₁ train); with
    ``groups_per_problem=k`` each problem gives k independent random subsets instead.

    The answer metadata of every shard is held in memory. Hidden states are read per item (only the token rows of
    the chosen answers) from memory-mapped shards, so datasets larger than RAM work, also in DataLoader workers;
    datasets up to `PRELOAD_BYTES` of hidden states read each shard's whole tensor once instead (`preload`).

    Args:
        paths: a directory of shards, a shard file, or a list of them.
        num_sequences: N (default: all sequences collected, one group per problem).
        mode: ``"terminal"`` or ``"streaming"``.
        groups_per_problem: `None` (partition) or k random subsets per problem per epoch.
        seed: base seed of the group draws (draws depend only on seed, epoch and item).
        checker: re-derive equivalence classes with this checker (a name for `hf_msv.equivalence.get_checker` or a
            checker) from the answer texts, in elicitation order (online leader clustering, as at inference).
            `None` keeps the classes stored at collection. Labels always stay the stored (gold-checker) ones.
        checker_kwargs: keyword arguments of `get_checker`.
        max_problems: keep only the first k problems in shard order (training-set-size studies); `None`: all.
        preload: hold each shard's hidden states in memory once read (True) or read them memory-mapped per item
            (False); `None`: preload when the shards' hidden states total at most `PRELOAD_BYTES`. Items are the
            same either way.

    Items are dicts: ``problem_id`` (str), ``hidden_states`` `(T_g, d)` 16-bit, and `(A_g,)` tensors
    ``answer_length``, ``answer_sequence`` (renumbered 0..N-1 in draw order), ``answer_step``, ``answer_tau``,
    ``answer_end``, ``answer_class``, ``answer_terminal``, ``labels`` (float 0/1), ``answer_index`` (stored row in
    the problem); answers in stored order, tokens of each answer contiguous (`hf_msv.data.read_group`). Pack a list
    of items with `collate_groups`. `group` reads any fixed group the same way (evaluation draws).
    """

    def __init__(
        self,
        paths,
        num_sequences: int | None = None,
        mode: str = "streaming",
        groups_per_problem: int | None = None,
        seed: int = 0,
        checker=None,
        checker_kwargs: dict | None = None,
        max_problems: int | None = None,
        preload: bool | None = None,
    ):
        if mode not in MODES:
            raise UserError(f"mode must be one of {MODES}, got {mode!r}")
        self.files = list_shards(paths)
        if not self.files:
            raise MissingPathError(f"no shards ({SHARD_GLOB}) found in {paths}")
        unchecked = verify_checksums(self.files)
        if unchecked:
            logger.info("%d shard(s) read unchecked (no checksum in their index.json): %s", len(unchecked), unchecked)
        self.mode = mode
        self.seed = seed
        self.epoch = 0
        self.shards = [ShardIndex(f) for f in self.files]
        # Problem p -> (shard, index in shard); duplicates across shards would double-count a problem.
        self._where: list[tuple[int, int]] = []
        seen: dict[str, Path] = {}
        for s, index in enumerate(self.shards):
            for i, pid in enumerate(index.problem_ids):
                if pid in seen:
                    raise UserError(f"problem {pid!r} appears in both {seen[pid]} and {index.path}")
                seen[pid] = index.path
                self._where.append((s, i))
        if max_problems is not None:
            if max_problems < 1 or max_problems > len(self._where):
                raise UserError(f"max_problems={max_problems}, but the shards hold {len(self._where)} problems")
            self._where = self._where[:max_problems]
        self._num_seq = np.array([int(self.shards[s].seq_hi[i] - self.shards[s].seq_lo[i]) for s, i in self._where])
        collected = int(self._num_seq.min()) if len(self._num_seq) else 0
        self.num_sequences = num_sequences or collected
        if self.num_sequences > collected:
            raise UserError(
                f"num_sequences={self.num_sequences} but some problems have only {collected} sequences collected"
            )
        self.groups_per_problem = groups_per_problem
        per_problem = (
            self._num_seq // self.num_sequences
            if groups_per_problem is None
            else np.full(len(self._where), groups_per_problem)
        )
        self._offsets = np.concatenate([[0], np.cumsum(per_problem)]).astype(np.int64)
        self._classes: list[np.ndarray] | None = None
        if checker is not None:
            self._classes = self._derive_classes(checker, checker_kwargs or {})
        self._handles: dict[int, safe_open] = {}
        self._pid = os.getpid()
        hidden_bytes = sum(2 * math.prod(index.hidden_shape) for index in self.shards)  # shards store 16 bits
        self.preload = hidden_bytes <= PRELOAD_BYTES if preload is None else bool(preload)
        self._loaded: dict[int, torch.Tensor] = {}  # shard -> its hidden states, when preloading

    # -- metadata ---------------------------------------------------------------------------------------------

    @property
    def info(self) -> dict:
        """Collection settings (``collect`` metadata) of the first shard."""
        return self.shards[0].info

    @property
    def hidden_size(self) -> int:
        return self.shards[0].hidden_shape[1]

    @property
    def num_problems(self) -> int:
        return len(self._where)

    @property
    def problem_ids(self) -> list[str]:
        return [self.shards[s].problem_ids[i] for s, i in self._where]

    def answer_columns(self, p: int) -> AnswerColumns:
        """Problem p's answer columns (classes re-derived when a checker was given), from the in-memory index.

        Args:
            p: the problem's index in this dataset.

        Returns:
            Its `AnswerColumns`.
        """
        s, i = self._where[p]
        index = self.shards[s]
        columns = index.answer_columns(i)
        if self._classes is not None:
            columns["answer_class"] = self._classes[p]
        return AnswerColumns(problem_id=index.problem_ids[i], num_sequences=int(self._num_seq[p]), **columns)

    def _derive_classes(self, checker, checker_kwargs) -> list[np.ndarray]:
        from ..equivalence import assign_classes, get_checker

        checker = get_checker(checker, **checker_kwargs) if isinstance(checker, str) else checker
        classes = []
        for s, i in self._where:
            index = self.shards[s]
            texts = index.strings["answer_text"][index.answer_lo[i] : index.answer_hi[i]]
            classes.append(np.asarray(assign_classes(texts, checker), dtype=np.int64))
        return classes

    def subset(self, problems: Sequence[int] | np.ndarray) -> ShardDataset:
        """This dataset restricted to the problems at indices `problems` (in that order), sharing its shard index
        (no re-reading): cross-validation folds. Problems are renumbered, so group draws differ from the parent's.

        Args:
            problems: problem indices in [0, num_problems).

        Returns:
            The new `ShardDataset`.

        Raises:
            ValueError: if `problems` is empty or an index is out of range.
        """
        keep = [int(p) for p in problems]
        if not keep or min(keep) < 0 or max(keep) >= self.num_problems:
            raise ValueError(f"a subset needs problem indices in [0, {self.num_problems}), got {len(keep)} indices")
        sub = copy.copy(self)
        sub._where = [self._where[p] for p in keep]
        sub._num_seq = self._num_seq[keep]
        sub._offsets = np.concatenate([[0], np.cumsum(np.diff(self._offsets)[keep])]).astype(np.int64)
        sub._classes = None if self._classes is None else [self._classes[p] for p in keep]
        sub._handles = {}
        sub._loaded = self._loaded  # what either reads whole serves both (copy.copy went through __getstate__)
        return sub

    def stats(self) -> dict:
        """Counts for reports: problems, sequences, answers, terminal answers and their accuracy."""
        rows = [
            (self.shards[s], slice(self.shards[s].answer_lo[i], self.shards[s].answer_hi[i])) for s, i in self._where
        ]
        correct = np.concatenate([index.arrays["answer_correct"][r] for index, r in rows])
        terminal = np.concatenate([index.arrays["answer_terminal"][r] for index, r in rows])
        return {
            "problems": self.num_problems,
            "sequences": int(self._num_seq.sum()),
            "answers": len(correct),
            "terminal_answers": int(terminal.sum()),
            "answer_accuracy": float(correct.mean()) if len(correct) else math.nan,
            "terminal_accuracy": float(correct[terminal].mean()) if terminal.any() else math.nan,
        }

    def read_problem(self, p: int, hidden: bool = False) -> CollectedProblem:
        """Everything stored for problem `p` (hidden states only when asked), e.g. for baselines and metrics.

        Args:
            p: the problem's index in this dataset.
            hidden: also read its hidden states.

        Returns:
            The `CollectedProblem`.
        """
        s, i = self._where[p]
        problem = self.shards[s].read_problem(self._handle(s), i, hidden)
        if self._classes is not None:
            problem.answer_class = self._classes[p].copy()
        return problem

    def has_cot_token_ids(self, p: int) -> bool:
        """Whether problem `p`'s chain-of-thought token ids are stored (shards written before hf_msv kept them, or
        collections from traces without them, have none), without reading them.

        Args:
            p: the problem's index in this dataset.

        Returns:
            Whether they are stored.
        """
        s, i = self._where[p]
        return self.shards[s].has_cot(self._handle(s), i, "cot_token_ids")

    def read_problems(self, hidden: bool = False) -> list[CollectedProblem]:
        """`read_problem` of every problem, in order.

        Args:
            hidden: also read the hidden states.

        Returns:
            One `CollectedProblem` per problem.
        """
        return [self.read_problem(p, hidden) for p in range(self.num_problems)]

    def answer_groups(self) -> list:
        """One `hf_msv.data.AnswerGroup` per problem, with every answer collected."""
        return [answer_group(self.answer_columns(p)) for p in range(self.num_problems)]

    def group(self, p: int, sequences, mode: str | None = None) -> dict:
        """The item of problem `p`'s group of `sequences` (`(N,)` ids in draw order) in `mode` (default: the
        dataset's): a fixed group, e.g. an evaluation draw (`hf_msv.data.draw_sequences`). See `read_group`.

        Args:
            p: the problem's index in this dataset.
            sequences: `(N,)` sequence ids in draw order.
            mode: "streaming" or "terminal"; `None`: the dataset's.

        Returns:
            The group's item, as `read_group` returns it.
        """
        s, _ = self._where[p]
        return read_group(self.answer_columns(p), self._hidden(s), sequences, mode or self.mode)

    # -- torch Dataset -----------------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Redraw the groups: the sequences of item i depend only on (seed, epoch, i).

        Args:
            epoch: the epoch number.
        """
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_handles"] = {}  # open mmaps do not travel to DataLoader workers; each reopens lazily
        state["_loaded"] = {}  # nor do preloaded tensors (a spawned worker would get a pickled copy): each reloads
        return state

    def _hidden(self, s: int):
        """Shard `s`'s hidden states, sliceable as ``hidden[a:b]``: the whole tensor (read once) when preloading,
        else a lazily read safetensors slice."""
        if not self.preload:
            return self._handle(s).get_slice("hidden_states")
        tensor = self._loaded.get(s)
        if tensor is None:
            tensor = self._loaded[s] = self._handle(s).get_tensor("hidden_states")
        return tensor

    def _handle(self, s: int):
        if self._pid != os.getpid():  # forked worker: reopen rather than share the parent's file objects
            self._handles, self._pid = {}, os.getpid()
        handle = self._handles.get(s)
        if handle is None:
            handle = self._handles[s] = safe_open(str(self.files[s]), framework="pt")
        return handle

    def sequences_of(self, item: int) -> tuple[int, np.ndarray]:
        """(problem index, the N chosen sequence ids in draw order) of an item at the current epoch.

        Args:
            item: the item index in [0, len(self)).

        Returns:
            ``(p, sequences)``: the problem index and an `(N,)` int array.
        """
        p = int(np.searchsorted(self._offsets, item, side="right") - 1)
        j = item - int(self._offsets[p])
        return p, partition_sequences(
            int(self._num_seq[p]), self.num_sequences, self.seed, self.epoch, p, j, self.groups_per_problem
        )

    def __getitem__(self, item: int) -> dict:
        if not 0 <= item < len(self):
            raise IndexError(item)
        return self.group(*self.sequences_of(item))


def load_split(
    paths, checker=None, checker_kwargs: dict | None = None, hidden: bool = True
) -> tuple[list[CollectedProblem], dict]:
    """Every problem of the shards under `paths` (hidden states kept in their 16-bit dtype) and the collection info,
    read through `ShardDataset` (``checker`` re-derives equivalence classes as there; labels stay stored).

    Args:
        paths: shard files or directories.
        checker: an equivalence checker name or object; `None`: the stored classes.
        checker_kwargs: constructor arguments for a named checker.
        hidden: also read the hidden states.

    Returns:
        ``(problems, info)``: the `CollectedProblem`s and the collection info dict.
    """
    dataset = ShardDataset(paths, checker=checker, checker_kwargs=checker_kwargs)
    return dataset.read_problems(hidden), dataset.info


# ----------------------------------------------------------------------------------------------------------------
# Collate
# ----------------------------------------------------------------------------------------------------------------

VERIFIER_INPUTS = (
    "hidden_states",
    "token_answer",
    "answer_group",
    "answer_sequence",
    "answer_step",
    "answer_end",
    "answer_class",
    "gamma",
    "labels",
)
"""Keys of a `collate_groups` batch that the verifier's forward takes."""


def subset_item(item: dict, keep) -> dict:
    """A `ShardDataset` item restricted to the answers `keep` ((A,) bool; each answer's tokens stay contiguous)."""
    lengths = item["answer_length"]
    starts = torch.cumsum(lengths, 0) - lengths
    rows = torch.from_numpy(np.flatnonzero(np.asarray(keep)))
    sel = lengths[rows]
    offsets = torch.repeat_interleave(starts[rows] - (torch.cumsum(sel, 0) - sel), sel)
    out = {
        key: (value[rows] if torch.is_tensor(value) and key != "hidden_states" else value)
        for key, value in item.items()
    }
    out["hidden_states"] = item["hidden_states"][torch.arange(int(sel.sum())) + offsets]
    return out


def subgroup_items(item: dict, m: int, keep=None) -> list[tuple[int, dict]]:
    """An item of N chains as an MSV_M reads it (paper, "Scaling with MSV_M"; `hf_msv.generation.MSVScorer` live):
    chain n in subgroup n // M as its sequence n % M.

    Args:
        item: a `ShardDataset` item.
        m: M, the verifier's ``num_sequences``.
        keep: (A,) bool, the answers to keep (default all).

    Returns:
        ``(subgroup, item)`` for every subgroup with an answer kept; the item itself when its chains fit in one.
    """
    sequence = item["answer_sequence"].numpy()
    keep = np.ones(sequence.size, bool) if keep is None else np.asarray(keep, bool)
    if not sequence.size or (sequence.max() < m and keep.all()):
        return [(0, item)]
    out = []
    for part in range(int(sequence.max()) // m + 1):
        mine = keep & (sequence // m == part)
        if mine.any():
            sub = subset_item(item, mine)
            sub["answer_sequence"] = sub["answer_sequence"] % m
            out.append((part, sub))
    return out


def collate_groups(groups: Sequence[dict], mode: str = "streaming", gamma: bool = True) -> dict:
    """Pack `ShardDataset` items into the verifier's packed inputs (docs/architecture.md).

    Answers of each group are ordered by end time τ + L (ties: sequence, step), groups follow each other, and each
    answer's tokens stay contiguous. Terminal mode keeps only terminal answers and sets every step to 0 (one answer
    per sequence, the paper's a_1).

    Args:
        groups: items of `ShardDataset`.
        mode: ``"terminal"`` or ``"streaming"``; decides the answers kept and how γ is computed.
        gamma: compute γ here with `hf_msv.compute_gamma` (in DataLoader workers, off the training step); `False`
            leaves ``gamma=None`` for the verifier to compute, with the same result.

    Returns a dict of tensors: ``hidden_states`` `(T, d)` (16-bit as stored; the verifier casts), ``token_answer``
    `(T,)`, `(A,)` ``answer_group``, ``answer_sequence``, ``answer_step``, ``answer_end``, ``answer_class``,
    ``labels``, ``gamma`` (float32 or None), ``answer_tau``, ``answer_length``, ``answer_terminal``,
    ``answer_index`` (each answer's stored row in its problem, when the items carry it: how evaluation maps scores
    back), and ``problem_id`` (list of B strings). Pass ``{k: batch[k] for k in VERIFIER_INPUTS}`` to the verifier.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    from ..modeling_msv import compute_gamma

    carried = ("answer_end", "answer_class", "labels", "answer_tau", "answer_length", "answer_terminal")
    if groups and all("answer_index" in g for g in groups):
        carried += ("answer_index",)
    hidden, token_answer, columns = (
        [],
        [],
        {k: [] for k in ("answer_group", "answer_sequence", "answer_step") + carried},
    )
    num_answers = 0
    for g, group in enumerate(groups):
        keep = torch.ones(len(group["answer_length"]), dtype=torch.bool)
        if mode == "terminal":
            keep = group["answer_terminal"].clone()
        rows = keep.nonzero().squeeze(1)
        seq, step, end = group["answer_sequence"][rows], group["answer_step"][rows], group["answer_end"][rows]
        if mode == "terminal":
            step = torch.zeros_like(step)
        # Stable lexicographic sort by (end, sequence, step): sort by the least significant key first.
        order = torch.argsort(step, stable=True)
        order = order[torch.argsort(seq[order], stable=True)]
        order = order[torch.argsort(end[order], stable=True)]
        rows = rows[order]
        lengths = group["answer_length"]
        starts = torch.cumsum(lengths, 0) - lengths
        sel_len = lengths[rows]
        # Token rows of the selected answers, in the new answer order.
        offsets = torch.repeat_interleave(starts[rows] - (torch.cumsum(sel_len, 0) - sel_len), sel_len)
        hidden.append(group["hidden_states"][torch.arange(int(sel_len.sum())) + offsets])
        token_answer.append(torch.repeat_interleave(torch.arange(len(rows)) + num_answers, sel_len))
        num_answers += len(rows)
        columns["answer_group"].append(torch.full((len(rows),), g, dtype=torch.long))
        columns["answer_sequence"].append(seq[order])
        columns["answer_step"].append(step[order])
        for key in carried:
            columns[key].append(group[key][rows])
    batch: dict[str, Any] = {k: torch.cat(v) if v else torch.zeros(0, dtype=torch.long) for k, v in columns.items()}
    batch["hidden_states"] = torch.cat(hidden) if hidden else torch.zeros(0, 0)
    batch["token_answer"] = torch.cat(token_answer) if token_answer else torch.zeros(0, dtype=torch.long)
    batch["gamma"] = (
        compute_gamma(
            batch["answer_group"],
            batch["answer_sequence"],
            batch["answer_step"],
            batch["answer_end"],
            batch["answer_class"],
            mode == "streaming",
        )
        if (gamma and num_answers)
        else None
    )
    batch["problem_id"] = [g["problem_id"] for g in groups]
    return batch
