"""Shards out: one row per answer as a `datasets.Dataset` (parquet, JSON Lines, arrow), and collections on the Hub.

`shards_to_dataset` flattens a collection's shards (`read_shard`) into answer rows; `export_shards` writes them;
`push_shards_to_hub` uploads the shard files themselves to a Hub dataset repo and `download_shards` brings them back,
readable by `ShardDataset` and every command that reads shards. See ``docs/datasets.md``.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

from ..errors import MissingPathError, UserError
from ..utils import commit_file, tmp_name
from .records import CollectedProblem
from .shards import SHARD_GLOB, list_shards, read_shard

EXPORT_FORMATS = ("parquet", "jsonl", "arrow")
"""What `export_shards` writes: a parquet file, a JSON Lines file, or a ``save_to_disk`` directory."""

HUB_PATTERNS = [SHARD_GLOB, "*.json"]
"""The files of a collection that go to and come from the Hub: its shards and its JSON settings and indexes."""

HUB_ERRORS = (HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled)
"""What the Hub answers for a repo it cannot reach, find or write: reported as a `UserError`."""

__all__ = [
    "EXPORT_FORMATS",
    "HUB_PATTERNS",
    "DownloadResult",
    "ExportResult",
    "PushResult",
    "answer_features",
    "download_shards",
    "export_shards",
    "push_shards_to_hub",
    "shards_to_dataset",
]


@dataclass(frozen=True)
class ExportResult:
    """What `export_shards` wrote: `output` (`format`), `num_rows` answers of `num_problems` problems from
    `num_shards` shards."""

    output: Path
    format: str
    num_rows: int
    num_problems: int
    num_shards: int


@dataclass(frozen=True)
class PushResult:
    """What `push_shards_to_hub` uploaded: `files` (relative paths) to the dataset repo `repo_id`, as `commit_url`."""

    repo_id: str
    commit_url: str
    files: list[str]


@dataclass(frozen=True)
class DownloadResult:
    """What `download_shards` brought: the shard files (`shards`) under `local_dir`."""

    repo_id: str
    local_dir: Path
    shards: list[Path]


def answer_features(hidden_states: bool = False):
    """The ``datasets.Features`` of an answer row (`shards_to_dataset`).

    Args:
        hidden_states: add ``hidden_states``, the answer tokens' `(L, d)` hidden states as a list of lists.
    """
    from datasets import Features, List, Value

    string, int32 = Value("string"), Value("int32")
    features = {
        "shard": string,  # the shard file's name
        "problem_id": string,
        "problem_source": string,
        "gold": string,
        "question": string,
        "answer_index": int32,  # the answer's row among its problem's stored answers
        "sequence": int32,
        "step": int32,
        "tau": int32,  # the decode step at which the answer was elicited
        "end": int32,  # the step at which it became available
        "length": int32,  # answer tokens
        "answer_text": string,  # the box contents; None: no answer
        "answer_raw_text": string,
        "trigger": string,
        "answer_class": Value("int64"),  # equivalence class within the problem
        "terminal": Value("bool"),
        "correct": Value("bool"),  # the label
        "token_ids": List(int32),
        "token_logprobs": List(Value("float32")),
        "sequence_length": int32,
        "sequence_finish": string,
    }
    if hidden_states:
        features["hidden_states"] = List(List(Value("float32")))
    return Features(features)


def _answer_rows(problem: CollectedProblem, shard: str, hidden: bool) -> dict[str, list]:
    """Problem `problem`'s answers as columns (`answer_features`)."""
    starts = problem.answer_token_start
    bounds = [(int(s), int(s + n)) for s, n in zip(starts, problem.answer_length)]
    sequences, ends = problem.answer_sequence, problem.answer_end
    assert ends is not None  # CollectedProblem fills it in (from tau + length where a shard did not store it)
    columns = {
        "shard": [shard] * problem.num_answers,
        "problem_id": [problem.problem_id] * problem.num_answers,
        "problem_source": [problem.source] * problem.num_answers,
        "gold": [problem.gold] * problem.num_answers,
        "question": [problem.question] * problem.num_answers,
        "answer_index": list(range(problem.num_answers)),
        "sequence": sequences.tolist(),
        "step": problem.answer_step.tolist(),
        "tau": problem.answer_tau.tolist(),
        "end": ends.tolist(),
        "length": problem.answer_length.tolist(),
        "answer_text": list(problem.answer_text),
        "answer_raw_text": list(problem.answer_raw_text),
        "trigger": list(problem.answer_trigger),
        "answer_class": problem.answer_class.tolist(),
        "terminal": problem.answer_terminal.tolist(),
        "correct": problem.answer_correct.tolist(),
        "token_ids": [problem.token_ids[a:b].tolist() for a, b in bounds],
        "token_logprobs": [problem.token_logprobs[a:b].tolist() for a, b in bounds],
        "sequence_length": problem.sequence_length[sequences].tolist(),
        "sequence_finish": [problem.sequence_finish[n] for n in sequences],
    }
    if hidden:
        if problem.hidden_states is None:
            raise ValueError(f"{shard}: problem {problem.problem_id!r} has no hidden states to export")
        states = problem.hidden_states.float().numpy()
        columns["hidden_states"] = [states[a:b].tolist() for a, b in bounds]
    return columns


def _collection_shards(directory: str | os.PathLike) -> list[Path]:
    """The shard files of a collection directory (or one shard file); none is a `UserError`."""
    shards = list_shards(directory)
    if not shards:
        raise MissingPathError(f"no shard files ({SHARD_GLOB}) in {directory}; shards are written by `hf-msv collect`")
    return shards


def shards_to_dataset(directory: str | os.PathLike, hidden_states: bool = False):
    """A collection's answers, one row per answer in shard and answer order (`answer_features`).

    Args:
        directory: a collection directory (its ``shard-*.safetensors``) or one shard file.
        hidden_states: add the answer tokens' hidden states (a list column: large).

    Returns:
        The `datasets.Dataset`.

    Raises:
        MissingPathError: no such directory, or no shard in it.
        UserError: a file that is not an hf_msv shard.
    """
    from datasets import Dataset, concatenate_datasets

    features = answer_features(hidden_states)
    parts = []
    for path in _collection_shards(directory):
        problems, _ = read_shard(path, hidden=hidden_states)
        columns = {name: [] for name in features}
        for problem in problems:
            for name, values in _answer_rows(problem, path.name, hidden_states).items():
                columns[name] += values
        parts.append(Dataset.from_dict(columns, features=features))
    return concatenate_datasets(parts)


def _check_output(output: Path, format: str, overwrite: bool) -> None:
    if format not in EXPORT_FORMATS:
        raise UserError(f"unknown export format {format!r}; choose one of {list(EXPORT_FORMATS)}")
    if output.exists() and not overwrite:
        raise UserError(f"{output} exists; choose another output or overwrite it")
    if output.is_dir() and format != "arrow":
        raise UserError(f"{output} is a directory; a {format} export is one file")


def export_shards(
    directory: str | os.PathLike,
    output: str | os.PathLike,
    format: str = "parquet",
    hidden_states: bool = False,
    overwrite: bool = False,
) -> ExportResult:
    """Write a collection's answers (`shards_to_dataset`) as parquet, JSON Lines or an arrow directory.

    Args:
        directory: the collection directory (or one shard file).
        output: the file to write (parquet, jsonl: written atomically) or directory (arrow: ``save_to_disk``).
        format: one of `EXPORT_FORMATS`.
        hidden_states: add the answer tokens' hidden states.
        overwrite: replace an existing `output`.

    Returns:
        The `ExportResult`.

    Raises:
        UserError: an unknown format, or an `output` that exists (without `overwrite`); both before any reading.
        MissingPathError: no shard in `directory`.
    """
    output = Path(output)
    _check_output(output, format, overwrite)
    shards = _collection_shards(directory)
    dataset = shards_to_dataset(directory, hidden_states)
    if format == "arrow":
        dataset.save_to_disk(str(output))
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_name(output)
        if format == "parquet":
            dataset.to_parquet(str(tmp))
        else:
            dataset.to_json(str(tmp), lines=True, force_ascii=False)
        commit_file(tmp, output)
    num_problems = len(set(dataset["problem_id"]))
    return ExportResult(output, format, len(dataset), num_problems, len(shards))


def _hub_files(directory: Path) -> list[str]:
    """The files of `directory` that `HUB_PATTERNS` select (its top level), sorted."""
    return sorted(
        p.name for p in directory.iterdir() if p.is_file() and any(fnmatch.fnmatch(p.name, g) for g in HUB_PATTERNS)
    )


def _check_repo_id(repo_id: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise UserError(f"not a Hub repository id: {e}") from None


def push_shards_to_hub(
    directory: str | os.PathLike,
    repo_id: str,
    revision: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    token: str | None = None,
) -> PushResult:
    """Upload a collection's shards and JSON settings to a Hub dataset repo (created when missing).

    Args:
        directory: the collection directory.
        repo_id: the dataset repo (``<org>/<name>``).
        revision: the branch to commit to (created when missing); `None`: the default branch.
        private: make a new repo private.
        commit_message: the commit's message (default: how many shards).
        token: a Hub token; `None`: the logged-in one.

    Returns:
        The `PushResult`.

    Raises:
        MissingPathError: no shard in `directory`.
        UserError: a malformed `repo_id`, or a repo the Hub refuses (`HUB_ERRORS`).
    """
    from huggingface_hub import HfApi

    _check_repo_id(repo_id)
    directory = Path(directory)
    shards = _collection_shards(directory)
    if not directory.is_dir():
        raise UserError(f"{directory} is a file; push the collection directory that holds it")
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        if revision is not None:
            api.create_branch(repo_id, branch=revision, repo_type="dataset", exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=str(directory),
            repo_type="dataset",
            revision=revision,
            commit_message=commit_message or f"Upload {len(shards)} hf_msv shard(s)",
            allow_patterns=HUB_PATTERNS,
        )
    except HUB_ERRORS as error:
        raise UserError(f"cannot push to the dataset {repo_id!r}: {' '.join(str(error).split())}") from error
    return PushResult(repo_id, str(commit.commit_url), _hub_files(directory))


def download_shards(
    repo_id: str, local_dir: str | os.PathLike, revision: str | None = None, token: str | None = None
) -> DownloadResult:
    """Download a collection pushed by `push_shards_to_hub` (its shards and JSON settings) into `local_dir`.

    Args:
        repo_id: the dataset repo.
        local_dir: where the files go (a collection directory every shard reader reads).
        revision: a branch, tag or commit; `None`: the default branch.
        token: a Hub token; `None`: the logged-in one.

    Returns:
        The `DownloadResult`.

    Raises:
        UserError: a malformed `repo_id`, a repo that cannot be downloaded, or one without shards.
    """
    from huggingface_hub import snapshot_download

    _check_repo_id(repo_id)
    local_dir = Path(local_dir)
    try:
        snapshot_download(
            repo_id,
            repo_type="dataset",
            revision=revision,
            local_dir=str(local_dir),
            allow_patterns=HUB_PATTERNS,
            token=token,
        )
    except HUB_ERRORS as error:
        raise UserError(f"cannot download the dataset {repo_id!r}: {' '.join(str(error).split())}") from error
    shards = list_shards(local_dir) if local_dir.is_dir() else []
    if not shards:
        raise UserError(f"the dataset {repo_id!r} holds no hf_msv shards ({SHARD_GLOB})")
    return DownloadResult(repo_id, local_dir, shards)
