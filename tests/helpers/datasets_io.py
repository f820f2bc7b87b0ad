"""Problem tables in every format `hf_msv.data.load_problems` reads, and a stand-in for the Hub (the datasets I/O
tests): `ROWS` (problems with the columns ``q``, ``a``, ``uid``), `write_table`, and `FakeHub`, which records
`HfApi.create_repo` / `create_branch` / `upload_folder` and `snapshot_download` calls and serves the uploaded
folder back."""

from __future__ import annotations

import fnmatch
import shutil
from pathlib import Path
from types import SimpleNamespace

ROWS = [{"uid": f"p{i}", "q": f" What is {i} + {i}? ", "a": f"0{2 * i}", "level": i % 3} for i in range(6)]
"""Golds written with a leading zero, so a reader that guessed numbers would change them."""


def write_table(directory: Path, kind: str, rows: list[dict] = ROWS) -> Path:
    """Write `rows` as `kind` (``parquet``, ``csv``, ``jsonl``, ``json``, ``disk``: save_to_disk) under
    `directory`; returns the file or directory."""
    import datasets

    dataset = datasets.Dataset.from_list(rows)
    path = directory / (f"problems.{kind}" if kind != "disk" else "saved")
    if kind == "parquet":
        dataset.to_parquet(str(path))
    elif kind == "csv":
        dataset.to_csv(str(path), index=False)
    elif kind in ("jsonl", "json"):
        dataset.to_json(str(path), lines=True)
    elif kind == "disk":
        dataset.save_to_disk(str(path))
    else:
        raise ValueError(kind)
    return path


class FakeHub:
    """Install with `install(monkeypatch)`; uploads are copied into `remote`, downloads copied out of it."""

    def __init__(self, remote: Path):
        self.remote = remote
        self.calls: list[tuple[str, tuple, dict]] = []

    def install(self, monkeypatch) -> FakeHub:
        import huggingface_hub

        import hf_msv.data.export  # noqa: F401  (the module whose calls are isolated)

        monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", self._record("create_repo"))
        monkeypatch.setattr(huggingface_hub.HfApi, "create_branch", self._record("create_branch"))
        monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", self._upload)
        monkeypatch.setattr(huggingface_hub, "snapshot_download", self._download)
        return self

    def _record(self, name):
        def call(api, *args, **kwargs):
            self.calls.append((name, args, kwargs))

        return call

    def _upload(self, **kwargs):  # a bound method on the class: called without the HfApi instance
        self.calls.append(("upload_folder", (), kwargs))
        for path in Path(kwargs["folder_path"]).iterdir():
            if any(fnmatch.fnmatch(path.name, g) for g in kwargs["allow_patterns"]):
                self.remote.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, self.remote / path.name)
        return SimpleNamespace(commit_url=f"https://huggingface.co/datasets/{kwargs['repo_id']}/commit/0")

    def _download(self, repo_id, **kwargs):
        self.calls.append(("snapshot_download", (repo_id,), kwargs))
        local = Path(kwargs["local_dir"])
        local.mkdir(parents=True, exist_ok=True)
        for path in self.remote.iterdir():
            if any(fnmatch.fnmatch(path.name, g) for g in kwargs["allow_patterns"]):
                shutil.copy(path, local / path.name)
        return str(local)
