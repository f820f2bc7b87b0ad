"""The resumable, atomic shard store of one process: finished batches -> spool files -> shards -> manifests.

Layout of a collection directory (every file written to a temporary name, fsynced and moved into place)::

    collect_config.json                    the settings; resuming with other settings is refused
    spool/spool-r{rank}-b{batch}.safetensors  one finished batch each, until packed (same format as a shard)
    shard-r{rank}-{index}.safetensors      `problems_per_shard` problems each
    index-r{rank}.json                     one process's manifest: its shards and their problems
    index.json                             every shard and its checksum, written by the main process at the end
    .hf_msv-collect.lock                   the writing run (pid, host), while it runs: one writer per directory

See ``docs/collection.md`` for the protocol and what a restart does.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import time
from pathlib import Path

from ..data import SHARD_GLOB, CollectedProblem, collection_elicitation, read_shard, read_shard_info, write_shard
from ..data.shards import file_checksum
from ..elicitation import ElicitationSettings
from ..errors import NotADirectoryPathError, UserError
from ..utils import atomic_write_json, fsync_dir
from .config import ELICITATION_FLAGS

LOCK_FILE = ".hf_msv-collect.lock"
CONFIG_FILE = "collect_config.json"
INDEX_FILE = "index.json"
_SHARD_RE = re.compile(r"shard-r(\d+)-(\d+)\.safetensors$")
_SPOOL_RE = re.compile(r"spool-r(\d+)-b(\d+)\.safetensors$")


def _field(pattern: re.Pattern, path: Path, group: int) -> str:
    """Group `group` of `pattern` in the name of `path`, a file the glob matched and `pattern` was checked on."""
    match = pattern.search(path.name)
    if match is None:
        raise ValueError(f"not a collection file name: {path.name}")
    return match.group(group)


def _problem_count(path: Path) -> int:
    return len(read_shard_info(path)["problem_id"])


class ShardStore:
    """Durable storage of one process's finished batches (``docs/collection.md`` describes the protocol).

    Args:
        root: the collection directory.
        rank, world: this process's index and the number of processes (every file name carries ``-r{rank}``).
        problems_per_shard: spool files are packed into a shard once they hold this many problems.
        dtype: storage dtype of hidden states (``"bfloat16"`` or ``"float16"``).
        info: the settings stored in every shard's metadata (each shard adds ``verdicts``: the equivalence
            verdicts given while collecting its problems, ``{"checks", "unverifiable"}``).
    """

    def __init__(self, root: Path, rank: int, world: int, problems_per_shard: int, dtype: str, info: dict):
        self.root, self.rank, self.world = root, rank, world
        self.spool_dir = root / "spool"
        self.problems_per_shard = problems_per_shard
        self.dtype, self.info = dtype, info
        self.written: list[Path] = []
        self.lock: Path | None = None  # the main process's lock of `root` (`acquire_lock`), released at the end
        self.manifest: dict[str, list[str]] = {}  # this rank's shard name -> problem ids, kept in memory

    def on_commit(self, stage: str, **info) -> None:
        """Called after each durable step (``"spooled"``, ``"shard_written"``, ``"manifest_written"``,
        ``"spool_removed"``). A no-op: tests replace it to inject crashes at exact points of the protocol.

        Args:
            stage: the step just made durable.
            **info: details of the step (e.g. the file written).
        """

    # -- names ----------------------------------------------------------------------------------------------

    def _own_shards(self) -> list[Path]:
        return sorted(p for p in self.root.glob(f"shard-r{self.rank:03d}-*.safetensors") if _SHARD_RE.search(p.name))

    def _spools(self, rank: int | None = None) -> list[Path]:
        pattern = "spool-r*-b*.safetensors" if rank is None else f"spool-r{rank:03d}-b*.safetensors"
        return sorted(p for p in self.spool_dir.glob(pattern) if _SPOOL_RE.search(p.name))

    def _next_shard(self) -> Path:
        indices = [int(_field(_SHARD_RE, p, 2)) for p in self._own_shards()]
        return self.root / f"shard-r{self.rank:03d}-{max(indices, default=-1) + 1:05d}.safetensors"

    # -- startup ----------------------------------------------------------------------------------------------

    def recover(self) -> None:
        """Bring this rank's files to a clean state after a crash (before anyone scans the done set)."""
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        pid_tmp = [p for d in (self.root, self.spool_dir) for p in d.glob(".*.tmp-*")]
        mine = (f"-r{self.rank:03d}-", f".index-r{self.rank:03d}.")
        if self.rank == 0:
            mine += (f".{INDEX_FILE}.", f".{CONFIG_FILE}.")
        for tmp in pid_tmp:  # temporaries of a killed writer of this rank are garbage
            if any(m in tmp.name for m in mine):
                tmp.unlink(missing_ok=True)
        in_shards = {pid for shard in self.root.glob(SHARD_GLOB) for pid in read_shard_info(shard)["problem_id"]}
        # Orphans: spool files of ranks that no longer exist (the run restarted with fewer processes).
        orphans = [
            p
            for p in self._spools()
            if (r := int(_field(_SPOOL_RE, p, 1))) >= self.world and r % self.world == self.rank
        ]
        for spool in self._spools(self.rank) + orphans:
            if set(read_shard_info(spool)["problem_id"]) <= in_shards:  # packed, then killed before deleting
                spool.unlink()
                self.on_commit("spool_removed", path=spool)
        # The shard files are the record; the manifest is rebuilt from them (it may predate the last shard).
        self.manifest = {p.name: read_shard_info(p)["problem_id"] for p in self._own_shards()}
        orphans = [p for p in orphans if p.exists()]
        if orphans:
            self._pack(orphans)
        if sum(_problem_count(p) for p in self._spools(self.rank)) >= self.problems_per_shard:
            self._pack(self._spools(self.rank))
        self.write_manifest()

    # -- writing ----------------------------------------------------------------------------------------------

    def add_batch(self, batch_index: int, problems: list[CollectedProblem], verdicts: dict | None = None) -> None:
        """Commit one finished batch to its spool file; pack the spool into a shard once it holds a shard's worth.

        Args:
            verdicts: the batch's equivalence verdict counts (``{"checks", "unverifiable"}``), summed per shard.
        """
        path = self.spool_dir / f"spool-r{self.rank:03d}-b{batch_index:07d}.safetensors"
        write_shard(path, problems, dict(self.info, verdicts=dict(verdicts or {})), self.dtype)
        self.on_commit("spooled", path=path, problems=[p.problem_id for p in problems])
        spools = self._spools(self.rank)
        if sum(_problem_count(p) for p in spools) >= self.problems_per_shard:
            self._pack(spools)

    def finish(self) -> None:
        """Pack what is left in this rank's spool into a last (smaller) shard and write the manifest."""
        spools = self._spools(self.rank)
        if spools:
            self._pack(spools)
        self.write_manifest()

    def _pack(self, spools: list[Path]) -> None:
        problems, verdicts = [], {}
        for spool in spools:
            found, info = read_shard(spool)
            problems += found
            for key, count in (info.get("verdicts") or {}).items():
                verdicts[key] = verdicts.get(key, 0) + count
        path = write_shard(self._next_shard(), problems, dict(self.info, verdicts=verdicts), self.dtype)
        self.written.append(path)
        self.manifest[path.name] = [p.problem_id for p in problems]
        self.on_commit("shard_written", path=path)
        self.write_manifest()
        self.on_commit("manifest_written", path=path)
        for spool in spools:
            spool.unlink(missing_ok=True)
            self.on_commit("spool_removed", path=spool)
        fsync_dir(self.spool_dir)

    def write_manifest(self) -> None:
        """``index-r{rank}.json``: this rank's shards and their problems (atomic replace)."""
        shards = dict(sorted(self.manifest.items()))
        atomic_write_json(
            self.root / f"index-r{self.rank:03d}.json",
            {"rank": self.rank, "shards": shards, "problems": sum(map(len, shards.values()))},
        )


def _comparable(settings: dict) -> dict:
    """The settings a resumed collection must share, with flat elicitation keys read as one ``elicitation`` entry.
    Where the LM was loaded from is not one of them when its weights fingerprint is recorded and the tokenizer came
    from the same place: a moved checkout or a copy of the same weights (e.g. a named LM inside another clone) extends
    the collection; other weights or another tokenizer do not."""
    settings = dict(settings)
    elicitation = collection_elicitation(settings).to_dict()
    ElicitationSettings.pop_legacy(settings)
    settings.pop("mode", None)
    settings["elicitation"] = elicitation
    if settings.get("lm_weights_fingerprint") and settings.get("tokenizer") == settings.get("lm_name_or_path"):
        return {k: v for k, v in settings.items() if k not in ("lm_name_or_path", "tokenizer")}
    return settings


def check_settings(root: Path, settings: dict, is_main: bool, overwrite: bool, state) -> None:
    """Write `settings` to ``collect_config.json`` on a new collection (after deleting everything with `overwrite`)
    and refuse to resume a collection made with other settings. Called by every process (`state`: accelerate)."""
    path = root / CONFIG_FILE
    if is_main:
        if overwrite:
            for f in [*root.glob(SHARD_GLOB), *root.glob("index*.json"), *(root / "spool").glob("*"), path]:
                f.unlink(missing_ok=True)
        if not path.exists():
            atomic_write_json(path, settings)
    state.wait_for_everyone()
    existing, requested = _comparable(_read_settings(path)), _comparable(settings)
    diff = {
        k: (existing.get(k), requested.get(k))
        for k in set(existing) | set(requested)
        if existing.get(k) != requested.get(k)
    }
    if diff:
        raise UserError(_other_settings(root, diff))


def check_output_dir(output_dir: str | os.PathLike, settings: dict, overwrite: bool = False) -> None:
    """Check `output_dir` before the LM loads: a directory (or one that can be made) that is writable, and, unless
    `overwrite`, holding no collection made with other values of `settings` (those that need no LM:
    `hf_msv.collect.job.config_settings`; the LM's identity is compared once it has loaded).

    Raises:
        NotADirectoryPathError: `output_dir`, or a directory above it, is a file.
        UserError: not writable, another run writing it, a ``collect_config.json`` that is not JSON, or other
            settings.
    """
    root = Path(output_dir)
    existing = next(p for p in (root, *root.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise NotADirectoryPathError(errno.ENOTDIR, "--output-dir: a file is in the way", str(existing))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--output-dir {root}: {existing} is not writable")
    check_unlocked(root)
    path = root / CONFIG_FILE
    if overwrite or not path.is_file():
        return
    existing_settings, requested = _comparable(_read_settings(path)), _comparable(settings)
    diff = {k: (existing_settings.get(k), v) for k, v in requested.items() if existing_settings.get(k) != v}
    if diff:
        raise UserError(_other_settings(root, diff))


def _read_settings(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UserError(f"{path} is not JSON: start over with --overwrite, or use another --output-dir") from None


def _other_settings(root: Path, diff: dict) -> str:
    """The refusal to resume: each differing setting as its flag, its value there and the one requested."""
    parts = []
    for key, (there, now) in sorted(diff.items()):
        if key == "elicitation" and isinstance(there, dict) and isinstance(now, dict):
            flags = {v: k for k, v in ELICITATION_FLAGS.items()}
            parts += [
                f"--{str(flags.get(k, k)).replace('_', '-')} {there.get(k)!r} there, {now.get(k)!r} now"
                for k in sorted(set(there) | set(now))
                if there.get(k) != now.get(k)
            ]
        else:
            name = f"--model ({key})" if key.startswith("lm_") or key == "tokenizer" else "--" + key.replace("_", "-")
            parts.append(f"{name} {there!r} there, {now!r} now")
    return (
        f"--output-dir {root} holds a collection made with other settings ({'; '.join(parts)}): give the same "
        "settings to resume, another --output-dir, or --overwrite to start over"
    )


def acquire_lock(root: Path) -> Path:
    """Make this process the one writer of `root` (a lock file naming it); a lock left by a killed run (its process
    gone from this host) is taken over, as is one this process holds already.

    Returns:
        The lock file, for `release_lock`.

    Raises:
        UserError: another run holds it (named in the message).
    """
    lock = root / LOCK_FILE
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            check_unlocked(root)  # raises while another run holds it
            lock.unlink(missing_ok=True)  # a killed run's, or ours: taken over
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return lock
    raise UserError(f"--output-dir {root}: another run keeps taking its lock {lock}")


def check_unlocked(root: Path) -> None:
    """Raise `UserError` when another live run holds `root`'s lock (`acquire_lock`)."""
    lock = root / LOCK_FILE
    try:
        holder = json.loads(lock.read_text(encoding="utf-8"))
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    except (OSError, ValueError):  # being written this instant, or garbage
        holder, age = {}, time.time() - lock.stat().st_mtime if lock.exists() else 0.0
    if _holds(holder, age):
        where = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('since', '?')}"
        raise UserError(
            f"--output-dir {root} is being written by another run ({where}): wait for it to end, or remove {lock} "
            "if that run is gone"
        )


def _holds(holder: dict, age: float) -> bool:
    """Whether the run a lock names still runs: not this process; on this host, its pid alive; elsewhere, assumed."""
    pid, host = holder.get("pid"), holder.get("host")
    if not isinstance(pid, int):
        return age < 10.0  # a lock file being written now; an old unreadable one is garbage
    if host != socket.gethostname():
        return True
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def release_lock(lock: Path | None) -> None:
    """Remove a lock `acquire_lock` made, if this process still holds it."""
    if lock is None:
        return
    try:
        if json.loads(lock.read_text(encoding="utf-8")).get("pid") == os.getpid():
            lock.unlink(missing_ok=True)
    except (OSError, ValueError):
        pass


def pending_batches(mine: list, problems_per_batch: int, done: set[str]) -> list[tuple]:
    """``(batch index, batch, problems of it not done yet)`` of every batch with something left to do.

    Batches are cut from this process's whole share, done or not, so a batch (and its seed) is the same in every run.
    """
    batches = [mine[i : i + problems_per_batch] for i in range(0, len(mine), problems_per_batch)]
    todo = [(b, batch, [p for p in batch if p.id not in done]) for b, batch in enumerate(batches)]
    return [(b, batch, left) for b, batch, left in todo if left]


def done_problem_ids(output_dir: str | os.PathLike) -> set[str]:
    """Ids of every problem already committed in `output_dir` (shards and pending spool files of all ranks).

    Args:
        output_dir: the collection directory.

    Returns:
        The set of problem ids.
    """
    root = Path(output_dir)
    files = list(root.glob(SHARD_GLOB)) + list((root / "spool").glob("spool-r*-b*.safetensors"))
    return {pid for f in files for pid in read_shard_info(f)["problem_id"]}


def write_index(output_dir: str | os.PathLike) -> dict:
    """Merge every shard into ``index.json`` (shard → problem ids, totals). Run by the main process at the end.

    Args:
        output_dir: the collection directory.

    Returns:
        The index written: ``{"shards", "problems", "format", "checksums"}`` (``sha256:`` of each shard file).
    """
    root = Path(output_dir)
    files = sorted(root.glob(SHARD_GLOB))
    shards = {p.name: read_shard_info(p)["problem_id"] for p in files}
    index = {
        "shards": shards,
        "problems": sum(map(len, shards.values())),
        "format": "hf_msv.shard",
        "checksums": {p.name: file_checksum(p) for p in files},  # read back by hf_msv.data.verify_checksums
    }
    atomic_write_json(root / INDEX_FILE, index)
    return index


__all__ = [
    "CONFIG_FILE",
    "INDEX_FILE",
    "LOCK_FILE",
    "ShardStore",
    "acquire_lock",
    "check_output_dir",
    "check_settings",
    "done_problem_ids",
    "pending_batches",
    "release_lock",
    "write_index",
]
