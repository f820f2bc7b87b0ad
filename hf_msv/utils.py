"""Small shared helpers: atomic files, JSON-safe values, processes and devices. Imports nothing from hf_msv."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "fsync_dir",
    "tmp_name",
    "commit_file",
    "file_mode",
    "umask",
    "atomic_write_json",
    "json_safe",
    "cpu_processes",
    "process_state",
    "resolve_device",
]


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename in `directory` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def tmp_name(path: Path) -> Path:
    """A temporary name beside `path` for an atomic write."""
    # A leading dot and a ".tmp" suffix keep temporaries out of every glob that finds finished files.
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def umask() -> int:
    """This process's umask, read without changing it where the system says (Linux), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode the user's umask gives a new file (0644 under the usual 022)."""
    return 0o666 & ~umask()


def commit_file(tmp: Path, path: Path) -> None:
    """Durably rename the finished `tmp` onto `path`."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.chmod(tmp, file_mode())  # safetensors creates 0600 files; shards get what the user's umask gives
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    """Write `obj` as JSON to `path` so that readers see the old or the new file, never a partial one."""
    path = Path(path)
    tmp = tmp_name(path)
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    commit_file(tmp, path)


def json_safe(obj):
    """`obj` with numpy scalars/arrays as Python values and NaN/inf as None, ready for `json.dumps`."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return None if not math.isfinite(float(obj)) else float(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    return obj


def cpu_processes() -> bool:
    """Whether accelerate must run this process group on CPU.

    `PartialState()` only forms a CPU process group when told ``cpu=True``; under ``torchrun`` /
    ``accelerate launch --multi_gpu`` on a machine without accelerators (or with ``ACCELERATE_USE_CPU``) each process
    would otherwise believe it is alone and do all the work.
    """
    from accelerate.utils import parse_flag_from_env

    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1 or int(os.environ.get("LOCAL_RANK", "-1")) != -1
    accelerator = getattr(torch, "accelerator", None)
    has_accelerator = accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
    return parse_flag_from_env("ACCELERATE_USE_CPU") or (launched and not has_accelerator)


def process_state():
    """accelerate's `PartialState` (rank, world size, device, barriers), CPU process groups included."""
    from accelerate import PartialState

    return PartialState(cpu=cpu_processes())


def resolve_device(device=None) -> torch.device:
    """``None`` / ``"auto"``: this process's accelerate device (the GPU when there is one, else the CPU)."""
    if device not in (None, "auto"):
        return torch.device(device)
    state_device = process_state().device
    return state_device if isinstance(state_device, torch.device) else torch.device("cpu")
