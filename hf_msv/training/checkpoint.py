"""Resuming an interrupted fit, so that ``train_verifier(..., resume=True)`` (``hf-msv train --resume``) trains
exactly what an uninterrupted fit trains: the vote cross-validation's state (`Batches`, `save_state`, `load_state`),
saved to ``vote_cv_state.pt`` at each pooled evaluation, and the training's (`save_training_state`,
`load_training_progress`), saved to ``training_state/`` at each validation with `accelerate.Accelerator.save_state`.
See ``docs/training.md``.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import asdict
from functools import partial
from pathlib import Path

import numpy as np
import torch

from ..data import ShardDataset, collate_groups
from ..errors import UserError
from ..utils import commit_file, tmp_name

__all__ = [
    "STATE_FILE",
    "TRAINING_STATE_DIR",
    "Batches",
    "fingerprint",
    "save_state",
    "load_state",
    "rng_state",
    "set_rng_state",
    "save_training_state",
    "load_training_progress",
    "discard_training_state",
]

STATE_FILE = "vote_cv_state.pt"
TRAINING_STATE_DIR = "training_state"
_PROGRESS_FILE = "progress.pt"  # written last: a state directory holding it is complete
# Settings that change what is printed, not what is trained: a run may resume with other values.
_NOT_TRAINING = ("progress", "log_every", "num_workers")


class Batches:
    """Training batches of `dataset` forever, a new draw of N-subsets every pass, whose position can be saved.

    A pass's order and draws follow from the DataLoader's generator when the pass starts (the sampler's permutation
    and the base seed both come from it) and the pass number (`ShardDataset.set_epoch`), so the position is that
    generator state, the pass and the batches taken in it; restoring it replays the pass up to there.
    """

    def __init__(self, dataset: ShardDataset, batch_size: int, mode: str, seed: int, num_workers: int = 0):
        self.dataset = dataset
        self.generator = torch.Generator().manual_seed(seed)
        self.loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=True,
            num_workers=num_workers,
            collate_fn=partial(collate_groups, mode=mode),
            generator=self.generator,
        )
        self.passes, self.taken = 0, 0
        self._pass_start: torch.Tensor | None = None
        self._it: Iterator[dict] | None = None

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        it = self._start_pass() if self._it is None else self._it
        try:
            batch = next(it)
        except StopIteration:
            self.passes += 1
            batch = next(self._start_pass())
        self.taken += 1
        return batch

    def _start_pass(self) -> Iterator[dict]:
        self.dataset.set_epoch(self.passes)
        self._pass_start = self.generator.get_state()
        self._it, self.taken = iter(self.loader), 0
        return self._it

    def state_dict(self) -> dict:
        return {"passes": self.passes, "taken": self.taken, "generator": self._pass_start}

    def load_state_dict(self, state: dict) -> None:
        self.passes = state["passes"]
        if state["generator"] is None:  # saved before its first batch
            self._it, self.taken = None, 0
            return
        self.dataset.set_epoch(self.passes)
        self.generator.set_state(state["generator"])
        self._pass_start, self._it = state["generator"], iter(self.loader)
        for _ in range(state["taken"]):  # collated and dropped: cheap next to the training steps they stand for
            next(self._it)
        self.taken = state["taken"]


def fingerprint(config, plan, folds: int, train_set: ShardDataset) -> dict:
    """What a saved state must have been made with to be resumed: the training settings, the plan, the folds and
    the training problems."""
    settings = {k: v for k, v in config.to_dict().items() if k not in _NOT_TRAINING}
    return {"config": settings, "plan": asdict(plan), "folds": folds, "problems": list(train_set.problem_ids)}


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_state(path: Path, state: dict) -> None:
    """Write `state` to `path` atomically (a fit stopped mid-write keeps the previous state)."""
    tmp = tmp_name(path)
    torch.save(state, tmp)
    commit_file(tmp, path)


def load_state(path: Path, expected: dict) -> dict | None:
    """The state saved in `path`, or None when there is none; a ValueError naming what differs when it was saved
    by a fit with other settings or data (resuming it would train something else)."""
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    saved = state["fingerprint"]
    differ = [k for k in expected if saved.get(k) != expected[k]]
    if "config" in differ:
        differ[differ.index("config")] = (
            "config ("
            + ", ".join(k for k in expected["config"] if saved["config"].get(k) != expected["config"][k])
            + ")"
        )
    if differ:
        raise UserError(
            f"{path} was saved by a fit with other {', '.join(differ)}: cannot resume it; train "
            f"into another output directory, or without resume to start this one again"
        )
    return state


def _training_state_dirs(output_dir: Path) -> tuple[Path, Path]:
    """The training state's directory and the one the next state is written into before it replaces it."""
    final = Path(output_dir) / TRAINING_STATE_DIR
    return final, final.with_name(f".{final.name}.tmp")


def save_training_state(accelerator, output_dir: Path, progress: dict) -> None:
    """Save the training state into ``output_dir/training_state``: `accelerator`'s (`Accelerator.save_state`: the
    prepared model and optimizer, the objects registered for checkpointing, every process's RNG states), then
    `progress` (the loop's counters, history and data position; with its ``fingerprint``). Called by every process.

    The state is written beside the previous one and replaces it only once complete, so a fit stopped mid-write
    resumes from the previous state.
    """
    final, tmp = _training_state_dirs(output_dir)
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        save_state(tmp / _PROGRESS_FILE, progress)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    accelerator.wait_for_everyone()


def load_training_progress(output_dir: Path, expected: dict) -> tuple[Path, dict] | None:
    """The saved training state of `output_dir`: its directory (for `Accelerator.load_state`) and its progress, or
    None when there is none; a UserError naming what differs when it was saved by a fit with other settings or data
    (`load_state`)."""
    for directory in _training_state_dirs(output_dir):  # the second: stopped between removing and renaming
        progress = load_state(directory / _PROGRESS_FILE, expected)
        if progress is not None:
            return directory, progress
    return None


def discard_training_state(output_dir: Path) -> None:
    """Remove a saved training state (main process): the fit finished, or starts again from scratch."""
    for directory in _training_state_dirs(output_dir):
        shutil.rmtree(directory, ignore_errors=True)
