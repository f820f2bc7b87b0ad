"""Hidden-state shards: the on-disk format of collected answers; writing, listing and reading whole shards.

`write_shard`, `read_shard`, `read_shard_info`, `list_shards`, `ShardIndex` (one shard's index, read lazily by
`hf_msv.data.ShardDataset`) and `collection_elicitation` (a shard's elicitation settings). One safetensors file
holds every answer of a few problems: answer-token hidden states (bf16 or fp16), answer and sequence columns, the
chain-of-thought token ids and confidences, and the collection settings as JSON metadata. The format, tensor by
tensor: ``docs/collection.md``.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import itertools
import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..elicitation import ElicitationSettings
from ..errors import MissingPathError, UserError
from ..utils import commit_file, tmp_name
from .records import CollectedProblem

FORMAT = "hf_msv.shard"
VERSION = "1"
SHARD_GLOB = "shard-*.safetensors"
METADATA_KEY = "hf_msv"
STORAGE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
INDEX_FILE = "index.json"  # a collection's index: its shards, their problems and checksums
COT_TENSORS = ("cot_confidence", "cot_token_ids")  # per CoT token, read per sequence: never held in the index
# Answer-level columns: ``answer_{name}`` in the file and as an attribute of CollectedProblem.
ANSWER_INT_COLUMNS = ("sequence", "step", "tau", "class", "length")
ANSWER_BOOL_COLUMNS = ("terminal", "correct")

__all__ = [
    "FORMAT",
    "VERSION",
    "SHARD_GLOB",
    "STORAGE_DTYPES",
    "ANSWER_INT_COLUMNS",
    "ANSWER_BOOL_COLUMNS",
    "ShardIndex",
    "write_shard",
    "read_shard",
    "read_shard_info",
    "list_shards",
    "collection_elicitation",
    "file_checksum",
    "verify_checksums",
    "check_finite",
]

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------------
# Writing and reading whole shards
# ----------------------------------------------------------------------------------------------------------------


def write_shard(
    path: str | os.PathLike,
    problems: Sequence[CollectedProblem],
    info: dict | None = None,
    dtype: str | torch.dtype = "bfloat16",
) -> Path:
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
    states = [p.hidden_states for p in problems if p.hidden_states is not None]
    if len(states) < len(problems):
        raise ValueError("every problem written to a shard needs its hidden states")
    widths = {s.shape[1] for s in states}
    if len(widths) != 1:
        raise ValueError(f"problems of one shard must share the hidden size, got {sorted(widths)}")

    def cat(values, np_dtype):
        return torch.from_numpy(np.concatenate(values).astype(np_dtype)) if values else torch.zeros(0)

    answer_problem = [np.full(p.num_answers, i) for i, p in enumerate(problems)]
    sequence_problem = [np.full(p.num_sequences, i) for i, p in enumerate(problems)]
    lengths = np.concatenate([p.answer_length for p in problems])
    # A problem without confidences stores empty arrays; lengths come back from consecutive starts.
    conf_lengths = np.array(
        [len(c) for p in problems for c in (p.cot_confidence or [()] * p.num_sequences)], dtype=np.int64
    )
    token_lengths = np.concatenate(
        [p.sequence_length if p.cot_token_ids else np.zeros(p.num_sequences, np.int64) for p in problems]
    )
    tensors = {
        "hidden_states": torch.cat([s.detach().to("cpu", dtype) for s in states]).contiguous(),
        "token_ids": cat([p.token_ids for p in problems], np.int32),
        "token_logprobs": cat([p.token_logprobs for p in problems], np.float32),
        "answer_problem": cat(answer_problem, np.int32),
        "answer_token_start": torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)),
        "sequence_problem": cat(sequence_problem, np.int32),
        "sequence_length": cat([p.sequence_length for p in problems], np.int32),
        "sequence_confidence_start": torch.from_numpy(
            np.concatenate([[0], np.cumsum(conf_lengths)[:-1]]).astype(np.int64)
        ),
        "cot_confidence": cat([c for p in problems for c in p.cot_confidence] or [np.zeros(0)], np.float32),
        "sequence_cot_token_start": torch.from_numpy(
            np.concatenate([[0], np.cumsum(token_lengths)[:-1]]).astype(np.int64)
        ),
        "cot_token_ids": cat([c for p in problems for c in p.cot_token_ids] or [np.zeros(0)], np.int32),
    }
    tensors["answer_end"] = cat([p.answer_end for p in problems], np.int32)
    for name in ANSWER_INT_COLUMNS:
        tensors[f"answer_{name}"] = cat([getattr(p, f"answer_{name}") for p in problems], np.int32)
    for name in ANSWER_BOOL_COLUMNS:
        tensors[f"answer_{name}"] = cat([getattr(p, f"answer_{name}") for p in problems], bool)
    metadata = {
        "format": FORMAT,
        "version": VERSION,
        "problem_id": [p.problem_id for p in problems],
        "problem_gold": [p.gold for p in problems],
        "problem_source": [p.source for p in problems],
        "problem_question": [p.question for p in problems],
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


def _metadata(handle, path) -> dict:
    raw = (handle.metadata() or {}).get(METADATA_KEY)
    meta = json.loads(raw) if raw else {}
    if meta.get("format") != FORMAT:
        raise UserError(f"{path} is not an hf_msv shard")
    return meta


class ShardIndex:
    """The small (non-hidden-state) contents of one shard, loaded once: answer/sequence arrays and strings.

    Problem i's answers are rows ``answer_lo[i]:answer_hi[i]`` and its sequences ``seq_lo[i]:seq_hi[i]``.

    Args:
        path: the shard file.

    Raises:
        UserError: if the file is not a readable hf_msv shard.

    Attributes:
        arrays: every tensor but the token-level ones, as numpy.
        strings: the string metadata.
        info: the ``collect`` settings.
        hidden_shape, hidden_dtype: shape and dtype of the stored hidden states.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = path = Path(path)
        try:
            handle = safe_open(str(path), framework="pt")
        except Exception as e:  # safetensors' own error type: the file is not safetensors (or is truncated)
            raise UserError(
                f"{path} is not a readable shard file ({e}); shards are written by `hf-msv collect`"
            ) from e
        with handle as f:
            meta = _metadata(f, path)
            self.arrays = {
                name: f.get_tensor(name).numpy()
                for name in f.keys()  # noqa: SIM118  (safe_open is not iterable)
                if name not in ("hidden_states", "token_ids", "token_logprobs") + COT_TENSORS
            }
            self.hidden_shape = tuple(f.get_slice("hidden_states").get_shape())
            self.hidden_dtype = str(f.get_slice("hidden_states").get_dtype())
        self.strings = {k: v for k, v in meta.items() if k not in ("format", "version")}
        self.info = self.strings.pop("collect", {})
        ap = self.arrays["answer_problem"]
        sp = self.arrays["sequence_problem"]
        num = len(self.strings["problem_id"])
        self.answer_lo = np.searchsorted(ap, np.arange(num), side="left")
        self.answer_hi = np.searchsorted(ap, np.arange(num), side="right")
        self.seq_lo = np.searchsorted(sp, np.arange(num), side="left")
        self.seq_hi = np.searchsorted(sp, np.arange(num), side="right")

    @property
    def problem_ids(self) -> list[str]:
        return self.strings["problem_id"]

    def token_range(self, i: int) -> tuple[int, int]:
        """Rows ``[start, stop)`` of problem i's answer tokens in the shard.

        Args:
            i: the problem's index in the shard.

        Returns:
            ``(start, stop)`` ints (``(0, 0)`` for a problem without answers).
        """
        lo, hi = self.answer_lo[i], self.answer_hi[i]
        if lo == hi:
            return 0, 0
        start = self.arrays["answer_token_start"]
        return int(start[lo]), int(start[hi - 1] + self.arrays["answer_length"][hi - 1])

    def answer_columns(self, i: int) -> dict[str, Any]:
        """Problem i's `(A,)` answer columns by attribute name (``answer_sequence``, ...,
        ``answer_token_start``, which addresses rows of the whole shard).

        Args:
            i: the problem's index in the shard.

        Returns:
            A dict of `(A,)` arrays (``answer_end`` `None` in shards written before it was stored).
        """
        lo, hi = self.answer_lo[i], self.answer_hi[i]
        names = ANSWER_INT_COLUMNS + ANSWER_BOOL_COLUMNS + ("token_start",)
        return {f"answer_{n}": self.arrays[f"answer_{n}"][lo:hi] for n in names} | {"answer_end": self._end(lo, hi)}

    def _end(self, lo: int, hi: int) -> np.ndarray | None:
        """Answers ``lo:hi``'s stored availability steps (`None` in shards written before they were stored)."""
        return self.arrays["answer_end"][lo:hi] if "answer_end" in self.arrays else None

    def _cot_starts(self, handle, i: int, name: str) -> np.ndarray | None:
        """`(S_i + 1,)` bounds of problem i's sequences in the CoT tensor `name` (``cot_confidence`` or
        ``cot_token_ids``); None when unknown (no entries, or a shard written before the tensor existed)."""
        start_name = {"cot_confidence": "sequence_confidence_start", "cot_token_ids": "sequence_cot_token_start"}[name]
        if start_name not in self.arrays:
            return None
        s0, s1 = self.seq_lo[i], self.seq_hi[i]
        starts = np.append(self.arrays[start_name], handle.get_slice(name).get_shape()[0])[s0 : s1 + 1]
        return None if starts[0] == starts[-1] else starts

    def cot_arrays(self, handle, i: int, name: str) -> list[np.ndarray]:
        """Problem i's per-sequence slices of the CoT tensor `name` read through an open `safe_open` handle;
        ``[]`` when unknown.

        Args:
            handle: an open `safe_open` handle of this shard.
            i: the problem's index in the shard.
            name: ``"cot_confidence"`` or ``"cot_token_ids"``.

        Returns:
            One array per sequence.
        """
        starts = self._cot_starts(handle, i, name)
        if starts is None:
            return []
        tensor = handle.get_slice(name)
        return [tensor[int(a) : int(b)].numpy() for a, b in itertools.pairwise(starts)]

    def has_cot(self, handle, i: int, name: str) -> bool:
        """Whether problem i's CoT tensor `name` is known, without reading it.

        Args:
            handle: an open `safe_open` handle of this shard.
            i: the problem's index in the shard.
            name: ``"cot_confidence"`` or ``"cot_token_ids"``.

        Returns:
            Whether it is stored.
        """
        return self._cot_starts(handle, i, name) is not None

    def read_problem(self, handle, i: int, hidden: bool) -> CollectedProblem:
        """Problem i read through an open `safe_open` handle of this shard (hidden states only when asked).

        Args:
            handle: an open `safe_open` handle of this shard.
            i: the problem's index in the shard.
            hidden: also read its hidden states.

        Returns:
            The `CollectedProblem`.
        """
        a0, a1 = self.answer_lo[i], self.answer_hi[i]
        s0, s1 = self.seq_lo[i], self.seq_hi[i]
        t0, t1 = self.token_range(i)
        arr, strings = self.arrays, self.strings
        return CollectedProblem(
            problem_id=strings["problem_id"][i],
            gold=strings["problem_gold"][i],
            source=strings["problem_source"][i],
            question=strings.get("problem_question", [""] * len(self.problem_ids))[i],
            hidden_states=handle.get_slice("hidden_states")[t0:t1] if hidden else None,
            token_ids=handle.get_slice("token_ids")[t0:t1].numpy(),
            token_logprobs=handle.get_slice("token_logprobs")[t0:t1].numpy(),
            answer_text=strings["answer_text"][a0:a1],
            answer_raw_text=strings["answer_raw_text"][a0:a1],
            answer_trigger=strings["answer_trigger"][a0:a1],
            **{f"answer_{n}": arr[f"answer_{n}"][a0:a1] for n in ANSWER_INT_COLUMNS + ANSWER_BOOL_COLUMNS},
            sequence_length=arr["sequence_length"][s0:s1],
            sequence_finish=strings["sequence_finish"][s0:s1],
            cot_confidence=self.cot_arrays(handle, i, "cot_confidence"),
            cot_token_ids=self.cot_arrays(handle, i, "cot_token_ids"),
            answer_end=self._end(a0, a1),
        )


def read_shard_info(path: str | os.PathLike) -> dict:
    """The ``collect`` settings and problem ids of a shard, without reading any tensor data.

    Args:
        path: the shard file.

    Returns:
        ``{"collect": dict, "problem_id": list[str]}``.

    Raises:
        UserError: if the file is not an hf_msv shard.
    """
    with safe_open(str(path), framework="pt") as f:
        meta = _metadata(f, path)
    return {"collect": meta.get("collect", {}), "problem_id": meta["problem_id"]}


def read_shard(path: str | os.PathLike, hidden: bool = True) -> tuple[list[CollectedProblem], dict]:
    """All problems of one shard (hidden states in their stored 16-bit dtype) and its ``collect`` settings.

    Args:
        path: the shard file.
        hidden: also read the hidden states.

    Returns:
        ``(problems, info)``: the `CollectedProblem`s and the ``collect`` settings dict.

    Raises:
        UserError: if the file is not a readable hf_msv shard.
    """
    index = ShardIndex(path)
    with safe_open(str(path), framework="pt") as handle:
        problems = [index.read_problem(handle, i, hidden) for i in range(len(index.problem_ids))]
    return problems, index.info


def collection_elicitation(info: dict) -> ElicitationSettings:
    """The elicitation settings of a shard's ``collect`` info (or a collection's ``collect_config.json``): its
    ``elicitation`` entry, or the flat keys (``mode``, ``delimiters``, ``elicitation_prompt``, ...) of shards written
    before that entry existed.

    Args:
        info: the ``collect`` info dict.

    Returns:
        The `ElicitationSettings`.
    """
    if "elicitation" in info:
        return ElicitationSettings.from_dict(info["elicitation"])
    found = ElicitationSettings.pop_legacy(dict(info))
    return ElicitationSettings(mode=info.get("mode", "streaming"), **found)


def list_shards(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Shard files under directories (``shard-*.safetensors``, sorted) or given directly.

    Args:
        paths: a shard file or directory, or several.

    Returns:
        The shard files, in the order given (each directory's sorted).

    Raises:
        MissingPathError: if a path is neither a file nor a directory.
    """
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
            raise MissingPathError(f"no shard file or directory at {p}")
    return found


def file_checksum(path: str | os.PathLike) -> str:
    """``sha256:<hex>`` of a file's bytes (what ``index.json`` records per shard)."""
    return _checksum(str(Path(path).resolve()), *_stamp(path))


def _stamp(path) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=4096)
def _checksum(path: str, size: int, mtime_ns: int) -> str:
    """Cached per (file, size, mtime): a dataset built several times hashes each shard once."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def _recorded_checksums(directory: Path) -> dict[str, str]:
    """Shard name -> checksum from ``directory/index.json`` (none: no index, or one written before checksums)."""
    try:
        index = json.loads((directory / INDEX_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return index.get("checksums", {}) if isinstance(index, dict) else {}


def verify_checksums(files: Sequence[str | os.PathLike]) -> list[Path]:
    """Check each shard against the checksum its directory's ``index.json`` records.

    Returns:
        The shards read unchecked: no checksum recorded (written before checksums, or by a run not finished).

    Raises:
        UserError: a shard whose bytes differ from what was written.
    """
    unchecked, recorded = [], {}
    for path in map(Path, files):
        if path.parent not in recorded:
            recorded[path.parent] = _recorded_checksums(path.parent)
        expected = recorded[path.parent].get(path.name)
        if expected is None:
            unchecked.append(path)
        elif file_checksum(path) != expected:
            raise UserError(
                f"{path}: its bytes differ from the checksum in {path.parent / INDEX_FILE} (changed or corrupted "
                "since it was written): collect it again"
            )
    return unchecked


def check_finite(path: str | os.PathLike, rows_per_read: int = 1 << 16) -> None:
    """Refuse a shard whose hidden states hold NaN or inf (training would fail far from the cause).

    Raises:
        UserError: naming the file, the first bad row and its problem.
    """
    index = ShardIndex(path)
    with safe_open(str(path), framework="pt") as handle:
        hidden = handle.get_slice("hidden_states")
        rows = index.hidden_shape[0]
        for start in range(0, rows, rows_per_read):
            bad = (~torch.isfinite(hidden[start : start + rows_per_read]).all(dim=-1)).nonzero()
            if len(bad):
                row = start + int(bad[0])
                raise UserError(f"{path}: hidden states of row {row} ({_problem_of_row(index, row)}) are not finite")


def _problem_of_row(index: ShardIndex, row: int) -> str:
    """The problem whose answer tokens include hidden-state `row`."""
    for i, pid in enumerate(index.problem_ids):
        start, stop = index.token_range(i)
        if start <= row < stop:
            return f"problem {pid!r}"
    return "no problem's answer"
