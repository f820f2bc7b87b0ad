"""When a reproduction may reuse what an earlier run left in its work directory: a trained verifier, a collection
of shards or a study's evaluation is reused only if its *reuse key* — the settings that produced it, a fingerprint
of its input data and a version of the code that produced it — equals the current one.

* **Code version**: SHA-256 over the source files of the hf_msv modules that produce the artefact (`TRAINING_CODE`
  for verifiers, `COLLECTION_CODE` for shards, `EVALUATION_CODE` for a study's evaluation), plus the package
  version; the git commit, when the package lives in a git checkout, is recorded beside it for the reader but not
  compared (a commit that only touches the docs must not invalidate anything).
* **Data fingerprint** (verifiers and evaluations; shards: the testbed LM's weights): SHA-256 over the names and
  contents of the shard files and collection settings (cached per file by size and modification time, so a run
  hashes each shard once).

A key is stored as ``reuse_key.json`` in the artefact's directory. `ReuseLog` records every decision for the
report (what was reused, what was redone and why).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeGuard

__all__ = [
    "TRAINING_CODE",
    "COLLECTION_CODE",
    "EVALUATION_CODE",
    "KEY_FILE",
    "code_version",
    "git_commit",
    "data_fingerprint",
    "reuse_key",
    "stored_key",
    "artefact_key",
    "write_key",
    "only_code_differs",
    "ReuseLog",
]

KEY_FILE = "reuse_key.json"
_PACKAGE = Path(__file__).resolve().parents[1]
# Source (relative to the package) whose changes change a trained verifier / a collection.
TRAINING_CODE = (
    "training",
    "data",
    "equivalence",
    "modeling_msv.py",
    "modeling_probe.py",
    "configuration_msv.py",
    "baselines.py",
    "metrics.py",
    "utils.py",
    "reproduction/config.py",
)
COLLECTION_CODE = ("collect", "generation", "data", "equivalence", "answers.py", "testbed", "utils.py")
# Everything `evaluate_study` runs: its package, the verifiers it loads, the baselines, metrics and data it reads.
EVALUATION_CODE = (
    "evaluation",
    "baselines.py",
    "metrics.py",
    "data",
    "equivalence",
    "generation",
    "training",
    "modeling_msv.py",
    "modeling_probe.py",
    "configuration_msv.py",
    "answers.py",
    "collect",
    "testbed",
    "utils.py",
)


def code_version(parts=TRAINING_CODE, root: Path | None = None) -> str:
    """SHA-256 (16 hex digits) of the package version and the ``.py`` files of `parts` (paths relative to
    `root`, default the installed hf_msv package)."""
    from .. import __version__

    base = _PACKAGE if root is None else Path(root)
    h = hashlib.sha256(__version__.encode())
    for part in parts:
        path = base / part
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            if f.exists():
                h.update(str(f.relative_to(base)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def git_commit() -> str | None:
    """The commit of the git checkout holding the package (None outside one, or without git)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(_PACKAGE), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@lru_cache(maxsize=4096)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def data_fingerprint(*dirs) -> str:
    """SHA-256 (16 hex digits) over the shard files of `dirs` (directories, files, or lists of them): the names and
    contents of a directory's top-level ``*.safetensors`` and its ``collect_config.json`` (not the index files, the
    spool or the reuse key, which change without the data changing)."""
    h = hashlib.sha256()
    for d in dirs:
        for one in d if isinstance(d, (list, tuple)) else [d]:
            one = Path(one)
            files = sorted([*one.glob("*.safetensors"), *one.glob("collect_config.json")]) if one.is_dir() else [one]
            for f in files:
                st = f.stat()
                h.update(f.name.encode() + b"\0" + _file_digest(str(f), st.st_size, st.st_mtime_ns).encode())
    return h.hexdigest()[:16]


def reuse_key(settings: dict, code: str, data: str | None = None) -> dict[str, Any]:
    """The key an artefact is stored and compared under: JSON-normalised settings, data fingerprint, code version."""
    return {"settings": json.loads(json.dumps(settings, default=str)), "data": data, "code": code}


def stored_key(directory: Path) -> dict[str, Any] | None:
    """The key stored in `directory` (None when there is none or it is unreadable)."""
    try:
        return json.loads((Path(directory) / KEY_FILE).read_text())
    except (OSError, ValueError):
        return None


def write_key(directory: Path, key: dict) -> None:
    """Store `key` (and, for the reader, the git commit) in `directory`."""
    Path(directory, KEY_FILE).write_text(json.dumps(dict(key, git_commit=git_commit()), indent=1))


def artefact_key(directory) -> dict[str, Any] | None:
    """The reuse key stored with an artefact, without the git commit recorded beside it (None: no key), so that
    a key that names the artefact (an evaluation names its verifiers' keys) survives commits that change nothing."""
    stored = stored_key(directory)
    return None if stored is None else {k: v for k, v in stored.items() if k != "git_commit"}


def _same(stored: dict | None, key: dict) -> bool:
    return stored is not None and {k: stored.get(k) for k in key} == key


def only_code_differs(stored: dict | None, key: dict) -> TypeGuard[dict]:
    """Whether a stored key has `key`'s settings and data and differs at most in the code version: what the
    ``keep`` reuse policies accept after a code change shown not to change the artefact."""
    return stored is not None and all(stored.get(k) == key[k] for k in key if k != "code")


@dataclass
class ReuseLog:
    """Every reuse decision of a run: ``entries`` [{"kind", "name", "reused", "why"}]."""

    entries: list = field(default_factory=list)

    def decide(self, kind: str, name: str, directory: Path, key: dict, exists: bool) -> bool:
        """True when the artefact in `directory` (present: `exists`) may be reused under `key`; logs why."""
        stored = stored_key(directory)
        if not exists:
            reused, why = False, "absent"
        elif stored is None:
            reused, why = False, "no reuse key (made before keys were stored)"
        elif _same(stored, key):
            reused, why = True, "same settings, data and code"
        else:
            changed = [k for k in key if stored.get(k) != key[k]]
            reused, why = False, "changed: " + ", ".join(changed)
        self.entries.append({"kind": kind, "name": name, "reused": reused, "why": why})
        return reused

    def keep(self, kind: str, name: str, why: str) -> None:
        """Log an artefact reused by request although its key differs or is missing: this replaces the "redone"
        verdict `decide` logged for it (the report would otherwise list it under both)."""
        self.entries = [e for e in self.entries if e["reused"] or (e["kind"], e["name"]) != (kind, name)]
        self.entries.append({"kind": kind, "name": name, "reused": True, "why": why})

    def annotate(self, kind: str, name: str, note: str) -> None:
        """Add `note` to the latest decision logged for the artefact (e.g. where a replaced one was moved)."""
        entry = next(e for e in reversed(self.entries) if (e["kind"], e["name"]) == (kind, name))
        entry["why"] += f"; {note}"

    def summary(self) -> dict[str, list[str]]:
        """{"reused": [...], "redone": [...]} of "kind name (why)" strings, for the report."""
        fmt = lambda e: f"{e['kind']} {e['name']} ({e['why']})"
        return {
            "reused": [fmt(e) for e in self.entries if e["reused"]],
            "redone": [fmt(e) for e in self.entries if not e["reused"] and e["why"] != "absent"],
        }
