"""Hidden-state shards: the on-disk format of collected answers, a lazy reader of answer groups, and the collate
function that packs groups into the verifier's inputs.

Shard format
============

One safetensors file holds every answer of a few problems (``shard-r{rank:03d}-{index:05d}.safetensors``; the name
only needs to match ``shard-*.safetensors``). Per problem, its answers are contiguous rows ordered by (τ, sequence,
step) — the order in which they were elicited — its sequences are contiguous rows ordered by n, and each answer's
tokens are contiguous. Tensors (T answer tokens, A answers, S sequences, C chain-of-thought tokens):

=============================  ===========  ===============================================================
name                           shape/dtype  meaning
=============================  ===========  ===============================================================
``hidden_states``              (T, d) bf16  last-layer LM states of the answer tokens (bf16 or fp16, see below)
``token_ids``                  (T,) i32     the answer tokens
``token_logprobs``             (T,) f32     log p(token) under the LM (Token-Probs baseline); nan = unknown
``answer_problem``             (A,) i32     index of the answer's problem in this shard
``answer_token_start``         (A,) i64     first row of the answer in ``hidden_states``
``answer_length``              (A,) i32     L
``answer_sequence``            (A,) i32     n (0-based, < samples collected)
``answer_step``                (A,) i32     k (0-based index of the answer in its sequence)
``answer_tau``                 (A,) i32     τ, decode step at which it was elicited (end time = τ + L)
``answer_class``               (A,) i32     equivalence class in its problem (online, arrival order)
``answer_terminal``            (A,) bool    the sequence's terminal answer
``answer_correct``             (A,) bool    equivalent to the gold answer under the collection checker
``sequence_problem``           (S,) i32     index of the sequence's problem in this shard
``sequence_length``            (S,) i32     chain-of-thought tokens generated (EOS included)
``sequence_confidence_start``  (S,) i64     first entry of the sequence in ``cot_confidence``
``cot_confidence``             (C,) f32     DeepConf token confidence C_i = −mean of the top-k log-probs, per CoT token
=============================  ===========  ===============================================================

String metadata: the safetensors header holds one key, ``hf_msv``, a JSON object (sorted keys, so equal shards
are equal bytes) with ``format`` (``"hf_msv.shard"``), ``version``, ``problem_id``, ``problem_gold``,
``problem_source`` (P,), ``answer_text`` (A, ``null`` = no answer), ``answer_raw_text``, ``answer_trigger`` (A,),
``sequence_finish`` (S,) and ``collect`` (the collection settings: LM, hidden size, delimiters, checker, ...).

**16-bit storage.** Hidden states are stored in bfloat16 by default: reasoning LMs run in bf16, so their states are
stored losslessly, and bf16 has float32's range, so no outlier dimension can overflow (fp16 tops out at 65504).
``float16`` is available for LMs run in fp16/fp32 that want 3 more mantissa bits.

Files are written atomically (temporary name, fsync, ``os.replace``, fsync of the directory), so a reader never
sees a partial shard.
"""

from __future__ import annotations

import glob
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..utils import commit_file, tmp_name

FORMAT = "hf_msv.shard"
VERSION = "1"
SHARD_GLOB = "shard-*.safetensors"
METADATA_KEY = "hf_msv"
STORAGE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
MODES = ("terminal", "streaming")

# Answer-level integer columns: name in the file -> attribute of CollectedProblem.
_ANSWER_INT = ("sequence", "step", "tau", "class", "length")
_ANSWER_BOOL = ("terminal", "correct")

__all__ = [
    "CollectedProblem", "write_shard", "read_shard", "read_shard_info", "list_shards", "ShardDataset",
    "collate_groups", "VERIFIER_INPUTS", "STORAGE_DTYPES",
]


# ----------------------------------------------------------------------------------------------------------------
# In-memory record
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class CollectedProblem:
    """Everything collected for one problem: S sampled sequences and their A answers (T answer tokens).

    Per-answer arrays are `(A,)` and ordered by (τ, sequence, step); answer a's tokens are rows
    ``answer_token_start[a] : answer_token_start[a] + answer_length[a]`` of the token arrays, which follow the
    answer order without gaps.

    Args:
        problem_id, gold, source: the problem.
        hidden_states: `(T, d)` answer-token hidden states (any float dtype; written in 16 bits), or `None` when
            read without them.
        token_ids: `(T,)` int answer tokens. token_logprobs: `(T,)` float32, nan where unknown.
        answer_text: `A` box contents (`None` = no answer). answer_raw_text, answer_trigger: `A` strings.
        answer_sequence, answer_step, answer_tau, answer_length, answer_class: `(A,)` int.
        answer_terminal, answer_correct: `(A,)` bool.
        sequence_length: `(S,)` int CoT tokens generated per sequence. sequence_finish: `S` strings.
        cot_confidence: `S` arrays `(sequence_length[n],)` float32 of DeepConf token confidences.
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

    def __post_init__(self):
        for name in ("answer_sequence", "answer_step", "answer_tau", "answer_length", "answer_class",
                     "sequence_length", "token_ids"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=np.int64).reshape(-1))
        for name in ("answer_terminal", "answer_correct"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=bool).reshape(-1))
        self.token_logprobs = np.asarray(self.token_logprobs, dtype=np.float32).reshape(-1)
        self.cot_confidence = [np.asarray(c, dtype=np.float32).reshape(-1) for c in self.cot_confidence]
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

    @property
    def num_answers(self) -> int:
        return len(self.answer_sequence)

    @property
    def num_sequences(self) -> int:
        return len(self.sequence_length)

    @property
    def answer_end(self) -> np.ndarray:
        """`(A,)` τ + L, when each answer becomes available."""
        return self.answer_tau + self.answer_length

    @property
    def answer_token_start(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.answer_length)[:-1]]).astype(np.int64)

    def token_prob_scores(self) -> np.ndarray:
        """`(A,)` Token-Probs baseline: geometric mean of the answer tokens' probabilities (tokens whose
        log-probability is unknown, nan, are left out; an answer with none known gets nan)."""
        answer = np.repeat(np.arange(self.num_answers), self.answer_length)
        known = ~np.isnan(self.token_logprobs)
        total = np.bincount(answer[known], weights=self.token_logprobs[known], minlength=self.num_answers)
        count = np.bincount(answer[known], minlength=self.num_answers)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.exp(total / count)

    def deepconf_scores(self, window: int = 2048, stat: str = "lowest_group") -> np.ndarray:
        """`(A,)` raw DeepConf confidence of each answer's chain-of-thought prefix (`hf_msv.baselines
        .deepconf_streaming` over the stored token confidences; terminal answers see their whole sequence)."""
        from ..baselines import deepconf_streaming

        return deepconf_streaming(self.cot_confidence, self.answer_sequence, self.answer_tau, window, stat)

    def to_answer_group(self, scores: dict | None = None):
        """The `hf_msv.metrics.AnswerGroup` of this problem (all answers, stored order)."""
        from ..metrics import AnswerGroup

        seq_len = np.zeros(self.num_sequences, dtype=np.int64)
        term = self.answer_terminal
        seq_len[self.answer_sequence[term]] = self.answer_tau[term]  # = τ of the terminal answer
        return AnswerGroup(sequence=self.answer_sequence, end=self.answer_end, klass=self.answer_class,
                           correct=self.answer_correct, is_terminal=self.answer_terminal, seq_len=seq_len,
                           start=self.answer_tau, scores=scores or {}, problem_id=self.problem_id)


# ----------------------------------------------------------------------------------------------------------------
# Writing and reading whole shards
# ----------------------------------------------------------------------------------------------------------------


def write_shard(path: str | os.PathLike, problems: Sequence[CollectedProblem], info: dict | None = None,
                dtype: str | torch.dtype = "bfloat16") -> Path:
    """Write `problems` to one shard at `path`, atomically. Hidden states are cast to `dtype` (16-bit).

    Args:
        info: the collection settings, stored as the ``collect`` metadata (JSON-serialisable).
    Returns: the path written.
    """
    dtype = STORAGE_DTYPES[dtype] if isinstance(dtype, str) else dtype
    if dtype not in STORAGE_DTYPES.values():
        raise ValueError(f"shards store hidden states in 16 bits ({list(STORAGE_DTYPES)}), got {dtype}")
    if not problems:
        raise ValueError("a shard needs at least one problem")
    if any(p.hidden_states is None for p in problems):
        raise ValueError("every problem written to a shard needs its hidden states")
    widths = {p.hidden_states.shape[1] for p in problems}
    if len(widths) != 1:
        raise ValueError(f"problems of one shard must share the hidden size, got {sorted(widths)}")

    def cat(values, np_dtype):
        return torch.from_numpy(np.concatenate(values).astype(np_dtype)) if values else torch.zeros(0)

    answer_problem = [np.full(p.num_answers, i) for i, p in enumerate(problems)]
    sequence_problem = [np.full(p.num_sequences, i) for i, p in enumerate(problems)]
    lengths = np.concatenate([p.answer_length for p in problems])
    # A problem without confidences stores empty arrays; lengths come back from consecutive starts.
    conf_lengths = np.array([len(c) for p in problems for c in (p.cot_confidence or [()] * p.num_sequences)],
                            dtype=np.int64)
    tensors = {
        "hidden_states": torch.cat([p.hidden_states.detach().to("cpu", dtype) for p in problems]).contiguous(),
        "token_ids": cat([p.token_ids for p in problems], np.int32),
        "token_logprobs": cat([p.token_logprobs for p in problems], np.float32),
        "answer_problem": cat(answer_problem, np.int32),
        "answer_token_start": torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)),
        "sequence_problem": cat(sequence_problem, np.int32),
        "sequence_length": cat([p.sequence_length for p in problems], np.int32),
        "sequence_confidence_start": torch.from_numpy(
            np.concatenate([[0], np.cumsum(conf_lengths)[:-1]]).astype(np.int64)),
        "cot_confidence": cat([c for p in problems for c in p.cot_confidence] or [np.zeros(0)], np.float32),
    }
    for name in _ANSWER_INT:
        tensors[f"answer_{name}"] = cat([getattr(p, f"answer_{name}") for p in problems], np.int32)
    for name in _ANSWER_BOOL:
        tensors[f"answer_{name}"] = cat([getattr(p, f"answer_{name}") for p in problems], bool)
    metadata = {
        "format": FORMAT,
        "version": VERSION,
        "problem_id": [p.problem_id for p in problems],
        "problem_gold": [p.gold for p in problems],
        "problem_source": [p.source for p in problems],
        "answer_text": [t for p in problems for t in p.answer_text],
        "answer_raw_text": [t for p in problems for t in p.answer_raw_text],
        "answer_trigger": [t for p in problems for t in p.answer_trigger],
        "sequence_finish": [f for p in problems for f in p.sequence_finish],
        "collect": info or {},
    }
    # One header key: safetensors writes several keys in hash order, which would make equal shards differ in bytes.
    metadata = {METADATA_KEY: json.dumps(metadata, sort_keys=True, ensure_ascii=False)}
    path = Path(path)
    tmp = tmp_name(path)
    save_file(tensors, str(tmp), metadata=metadata)
    commit_file(tmp, path)
    return path


class _ShardIndex:
    """The small (non-hidden-state) contents of one shard, loaded once: answer/sequence arrays and strings."""

    def __init__(self, path: Path):
        self.path = path
        with safe_open(str(path), framework="pt") as f:
            meta = _metadata(f, path)
            self.arrays = {name: f.get_tensor(name).numpy() for name in f.keys()
                           if name not in ("hidden_states", "token_ids", "token_logprobs", "cot_confidence")}
            self.hidden_shape = tuple(f.get_slice("hidden_states").get_shape())
            self.hidden_dtype = str(f.get_slice("hidden_states").get_dtype())
        self.strings = {k: v for k, v in meta.items() if k not in ("format", "version")}
        self.info = self.strings.pop("collect", {})
        ap = self.arrays["answer_problem"]
        sp = self.arrays["sequence_problem"]
        num = len(self.strings["problem_id"])
        # Rows of problem i: answers [answer_lo[i], answer_hi[i]), sequences [seq_lo[i], seq_hi[i]).
        self.answer_lo = np.searchsorted(ap, np.arange(num), side="left")
        self.answer_hi = np.searchsorted(ap, np.arange(num), side="right")
        self.seq_lo = np.searchsorted(sp, np.arange(num), side="left")
        self.seq_hi = np.searchsorted(sp, np.arange(num), side="right")

    @property
    def problem_ids(self) -> list[str]:
        return self.strings["problem_id"]

    def token_range(self, i: int) -> tuple[int, int]:
        lo, hi = self.answer_lo[i], self.answer_hi[i]
        if lo == hi:
            return 0, 0
        start = self.arrays["answer_token_start"]
        return int(start[lo]), int(start[hi - 1] + self.arrays["answer_length"][hi - 1])


def _metadata(handle, path) -> dict:
    raw = (handle.metadata() or {}).get(METADATA_KEY)
    meta = json.loads(raw) if raw else {}
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not an hf_msv shard")
    return meta


def read_shard_info(path: str | os.PathLike) -> dict:
    """The ``collect`` settings and problem ids of a shard, without reading any tensor data."""
    with safe_open(str(path), framework="pt") as f:
        meta = _metadata(f, path)
    return {"collect": meta.get("collect", {}), "problem_id": meta["problem_id"]}


def _problem_from_index(index: _ShardIndex, handle, i: int, hidden: bool) -> CollectedProblem:
    a0, a1 = index.answer_lo[i], index.answer_hi[i]
    s0, s1 = index.seq_lo[i], index.seq_hi[i]
    t0, t1 = index.token_range(i)
    arr = index.arrays
    lengths = arr["sequence_length"][s0:s1]
    conf = handle.get_slice("cot_confidence")
    all_starts = np.append(arr["sequence_confidence_start"], conf.get_shape()[0])
    conf_start, conf_end = all_starts[s0:s1], all_starts[s0 + 1:s1 + 1]
    return CollectedProblem(
        problem_id=index.strings["problem_id"][i],
        gold=index.strings["problem_gold"][i],
        source=index.strings["problem_source"][i],
        hidden_states=handle.get_slice("hidden_states")[t0:t1] if hidden else None,
        token_ids=handle.get_slice("token_ids")[t0:t1].numpy(),
        token_logprobs=handle.get_slice("token_logprobs")[t0:t1].numpy(),
        answer_text=index.strings["answer_text"][a0:a1],
        answer_raw_text=index.strings["answer_raw_text"][a0:a1],
        answer_trigger=index.strings["answer_trigger"][a0:a1],
        **{f"answer_{n}": arr[f"answer_{n}"][a0:a1] for n in _ANSWER_INT + _ANSWER_BOOL},
        sequence_length=lengths,
        sequence_finish=index.strings["sequence_finish"][s0:s1],
        cot_confidence=[conf[int(c):int(e)].numpy() for c, e in zip(conf_start, conf_end)],
    )


def read_shard(path: str | os.PathLike, hidden: bool = True) -> tuple[list[CollectedProblem], dict]:
    """All problems of one shard (hidden states in their stored 16-bit dtype) and its ``collect`` settings."""
    index = _ShardIndex(Path(path))
    with safe_open(str(path), framework="pt") as handle:
        problems = [_problem_from_index(index, handle, i, hidden) for i in range(len(index.problem_ids))]
    return problems, index.info


def list_shards(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Shard files under directories (``shard-*.safetensors``, sorted) or given directly."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    found: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found += sorted(Path(f) for f in glob.glob(str(p / SHARD_GLOB)))
        elif p.is_file():
            found.append(p)
        else:
            raise FileNotFoundError(f"no shard file or directory at {p}")
    return found


# ----------------------------------------------------------------------------------------------------------------
# Group dataset
# ----------------------------------------------------------------------------------------------------------------


class ShardDataset(torch.utils.data.Dataset):
    """Groups of N sequences' answers, read lazily from shards.

    Item ``i`` is one *group*: the answers of N of the S sequences collected for one problem (terminal mode: their
    terminal answers; streaming: all their answers). Which sequences form the groups is redrawn every epoch
    (`set_epoch`): by default each problem's S sequences are randomly partitioned into ⌊S/N⌋ groups, so an epoch
    sees every sequence once (N = 1: every sequence on its own, as the Probe and MSV₁ train); with
    ``groups_per_problem=k`` each problem gives k independent random subsets instead.

    Only the answer metadata of every shard is held in memory; hidden states are memory-mapped and read per item
    (only the token rows of the chosen answers), so datasets larger than RAM work, also in DataLoader workers.

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

    Items are dicts: ``problem_id`` (str), ``hidden_states`` `(T_g, d)` 16-bit, and `(A_g,)` tensors
    ``answer_length``, ``answer_sequence`` (renumbered 0..N-1 in draw order), ``answer_step``, ``answer_tau``,
    ``answer_end``, ``answer_class``, ``answer_terminal``, ``labels`` (float 0/1); answers in stored order, tokens
    of each answer contiguous. Pack a list of items with `collate_groups`.
    """

    def __init__(self, paths, num_sequences: int | None = None, mode: str = "streaming",
                 groups_per_problem: int | None = None, seed: int = 0, checker=None,
                 checker_kwargs: dict | None = None, max_problems: int | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.files = list_shards(paths)
        if not self.files:
            raise FileNotFoundError(f"no shards ({SHARD_GLOB}) found in {paths}")
        self.mode = mode
        self.seed = seed
        self.epoch = 0
        self.shards = [_ShardIndex(f) for f in self.files]
        # Problem p -> (shard, index in shard); duplicates across shards would double-count a problem.
        self._where: list[tuple[int, int]] = []
        seen: dict[str, Path] = {}
        for s, index in enumerate(self.shards):
            for i, pid in enumerate(index.problem_ids):
                if pid in seen:
                    raise ValueError(f"problem {pid!r} appears in both {seen[pid]} and {index.path}")
                seen[pid] = index.path
                self._where.append((s, i))
        if max_problems is not None:
            if max_problems < 1 or max_problems > len(self._where):
                raise ValueError(f"max_problems={max_problems}, but the shards hold {len(self._where)} problems")
            self._where = self._where[:max_problems]
        self._num_seq = np.array([int(self.shards[s].seq_hi[i] - self.shards[s].seq_lo[i]) for s, i in self._where])
        collected = int(self._num_seq.min()) if len(self._num_seq) else 0
        self.num_sequences = num_sequences or collected
        if self.num_sequences > collected:
            raise ValueError(f"num_sequences={self.num_sequences} but some problems have only {collected} "
                             "sequences collected")
        self.groups_per_problem = groups_per_problem
        per_problem = (self._num_seq // self.num_sequences if groups_per_problem is None
                       else np.full(len(self._where), groups_per_problem))
        self._offsets = np.concatenate([[0], np.cumsum(per_problem)]).astype(np.int64)
        self._classes: list[np.ndarray] | None = None
        if checker is not None:
            self._classes = self._derive_classes(checker, checker_kwargs or {})
        self._handles: dict[int, object] = {}
        self._pid = os.getpid()

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

    def _answers(self, p: int) -> dict[str, np.ndarray]:
        s, i = self._where[p]
        index = self.shards[s]
        lo, hi = index.answer_lo[i], index.answer_hi[i]
        out = {n: index.arrays[f"answer_{n}"][lo:hi] for n in _ANSWER_INT + _ANSWER_BOOL + ("token_start",)}
        if self._classes is not None:
            out["class"] = self._classes[p]
        return out

    def _derive_classes(self, checker, checker_kwargs) -> list[np.ndarray]:
        from ..equivalence import assign_classes, get_checker

        checker = get_checker(checker, **checker_kwargs) if isinstance(checker, str) else checker
        classes = []
        for s, i in self._where:
            index = self.shards[s]
            texts = index.strings["answer_text"][index.answer_lo[i]:index.answer_hi[i]]
            classes.append(np.asarray(assign_classes(texts, checker), dtype=np.int64))
        return classes

    def stats(self) -> dict:
        """Counts for reports: problems, sequences, answers, terminal answers and their accuracy."""
        rows = [(self.shards[s], slice(self.shards[s].answer_lo[i], self.shards[s].answer_hi[i]))
                for s, i in self._where]
        correct = np.concatenate([index.arrays["answer_correct"][r] for index, r in rows])
        terminal = np.concatenate([index.arrays["answer_terminal"][r] for index, r in rows])
        return {"problems": self.num_problems, "sequences": int(self._num_seq.sum()), "answers": int(len(correct)),
                "terminal_answers": int(terminal.sum()),
                "answer_accuracy": float(correct.mean()) if len(correct) else math.nan,
                "terminal_accuracy": float(correct[terminal].mean()) if terminal.any() else math.nan}

    def read_problem(self, p: int, hidden: bool = False) -> CollectedProblem:
        """Everything stored for problem `p` (hidden states only when asked), e.g. for baselines and metrics."""
        s, i = self._where[p]
        problem = _problem_from_index(self.shards[s], self._handle(s), i, hidden)
        if self._classes is not None:
            problem.answer_class = self._classes[p].copy()
        return problem

    def answer_groups(self) -> list:
        """One `hf_msv.metrics.AnswerGroup` per problem, with every answer collected."""
        return [self.read_problem(p).to_answer_group() for p in range(self.num_problems)]

    # -- torch Dataset -----------------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Redraw the groups: the sequences of item i depend only on (seed, epoch, i)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_handles"] = {}  # open mmaps do not travel to DataLoader workers; each reopens lazily
        return state

    def _handle(self, s: int):
        if self._pid != os.getpid():  # forked worker: reopen rather than share the parent's file objects
            self._handles, self._pid = {}, os.getpid()
        handle = self._handles.get(s)
        if handle is None:
            handle = self._handles[s] = safe_open(str(self.files[s]), framework="pt")
        return handle

    def sequences_of(self, item: int) -> tuple[int, np.ndarray]:
        """(problem index, the N chosen sequence ids in draw order) of an item at the current epoch."""
        p = int(np.searchsorted(self._offsets, item, side="right") - 1)
        j = item - int(self._offsets[p])
        n, total = self.num_sequences, int(self._num_seq[p])
        if self.groups_per_problem is None:
            perm = np.random.default_rng([self.seed, self.epoch, p]).permutation(total)
            return p, perm[j * n:(j + 1) * n]
        return p, np.random.default_rng([self.seed, self.epoch, p, j]).permutation(total)[:n]

    def __getitem__(self, item: int) -> dict:
        if not 0 <= item < len(self):
            raise IndexError(item)
        p, chosen = self.sequences_of(item)
        ans = self._answers(p)
        slot = np.full(int(self._num_seq[p]), -1, dtype=np.int64)
        slot[chosen] = np.arange(len(chosen))
        keep = slot[ans["sequence"]] >= 0
        if self.mode == "terminal":
            keep &= ans["terminal"]
        rows = np.flatnonzero(keep)
        s, i = self._where[p]
        # Read the chosen answers' tokens as few contiguous runs (answers are stored back to back).
        starts, lengths = ans["token_start"][rows].astype(np.int64), ans["length"][rows].astype(np.int64)
        sl = self._handle(s).get_slice("hidden_states")
        pieces, run_start, run_end = [], None, None
        for a, l in zip(starts.tolist(), lengths.tolist()):
            if run_end == a:
                run_end = a + l
                continue
            if run_start is not None:
                pieces.append(sl[run_start:run_end])
            run_start, run_end = a, a + l
        if run_start is not None:
            pieces.append(sl[run_start:run_end])
        hidden = torch.cat(pieces) if pieces else sl[0:0]
        step = ans["step"][rows] if self.mode == "streaming" else np.zeros(len(rows), dtype=np.int64)
        tensor = lambda x, dt=torch.long: torch.as_tensor(np.asarray(x), dtype=dt)  # noqa: E731
        return {
            "problem_id": self.shards[s].problem_ids[i],
            "hidden_states": hidden,
            "answer_length": tensor(lengths),
            "answer_sequence": tensor(slot[ans["sequence"][rows]]),
            "answer_step": tensor(step),
            "answer_tau": tensor(ans["tau"][rows]),
            "answer_end": tensor(ans["tau"][rows] + ans["length"][rows]),
            "answer_class": tensor(ans["class"][rows]),
            "answer_terminal": tensor(ans["terminal"][rows], torch.bool),
            "labels": tensor(ans["correct"][rows], torch.float32),
        }


# ----------------------------------------------------------------------------------------------------------------
# Collate
# ----------------------------------------------------------------------------------------------------------------

VERIFIER_INPUTS = ("hidden_states", "token_answer", "answer_group", "answer_sequence", "answer_step", "answer_end",
                   "answer_class", "gamma", "labels")
"""Keys of a `collate_groups` batch that the verifier's forward takes."""


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
    ``labels``, ``gamma`` (float32 or None), ``answer_tau``, ``answer_length``, ``answer_terminal``, and
    ``problem_id`` (list of B strings). Pass ``{k: batch[k] for k in VERIFIER_INPUTS}`` to the verifier.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    from ..modeling_msv import compute_gamma

    hidden, token_answer, columns = [], [], {k: [] for k in (
        "answer_group", "answer_sequence", "answer_step", "answer_end", "answer_class", "labels", "answer_tau",
        "answer_length", "answer_terminal")}
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
        for key in ("answer_end", "answer_class", "labels", "answer_tau", "answer_length", "answer_terminal"):
            columns[key].append(group[key][rows])
    batch = {k: torch.cat(v) if v else torch.zeros(0, dtype=torch.long) for k, v in columns.items()}
    batch["hidden_states"] = torch.cat(hidden) if hidden else torch.zeros(0, 0)
    batch["token_answer"] = torch.cat(token_answer) if token_answer else torch.zeros(0, dtype=torch.long)
    batch["gamma"] = compute_gamma(batch["answer_group"], batch["answer_sequence"], batch["answer_step"],
                                   batch["answer_end"], batch["answer_class"], mode == "streaming") if (
        gamma and num_answers) else None
    batch["problem_id"] = [g["problem_id"] for g in groups]
    return batch
