"""What a reproduction samples from, decided in one place (`reproduction_task`): a testbed task's LM and problem
generator, or your own LM (``hf-msv reproduce --model``) with your problem specs, and the defaults an outside LM
lacks (prompt template, delimiters, sampling budget, its name in report titles and file names).

    hf-msv reproduce --model Qwen/Qwen2.5-1.5B-Instruct --train-problems train.jsonl --val-problems val.jsonl \
        --eval-problems eval.jsonl

An own-LM run is the main study only: the other studies are experiments on the testbed (its generator draws the
extra problems they need, and the delimiter study assumes its ``Wait`` traces). See ``docs/reproduction.md``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError

if TYPE_CHECKING:
    from ..testbed.tasks import TestbedTask

__all__ = [
    "OWN_LM_TASK",
    "OWN_LM_STUDIES",
    "ReproductionTask",
    "reproduction_task",
    "check_studies",
    "lm_run_name",
    "load_spec",
    "problems_fingerprint",
]

OWN_LM_TASK = "own"  # `ReproduceConfig.task` of a run on your own LM (`ReproduceConfig.model`)
OWN_LM_STUDIES = ("main",)
SPLITS = ("train", "validation", "evaluation")  # the order of `ReproduceConfig.problem_specs`
_NAME = re.compile(r"[A-Za-z0-9._-]+")


def lm_run_name(model: str) -> str:
    """A run's default name (report titles, file names): the model's last path component (a Hub id's repository),
    characters other than letters, digits, ``.``, ``_`` and ``-`` replaced by ``-``."""
    last = Path(str(model).rstrip("/\\")).name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", last).strip("-") or "lm"


def check_run_name(name: str) -> None:
    """A run name goes into file names: letters, digits, ``.``, ``_`` and ``-`` only (UserError otherwise)."""
    if not _NAME.fullmatch(name) or name.startswith("."):
        raise UserError(f"name {name!r}: use letters, digits, '.', '_' and '-' (it names the report files)")


def load_spec(spec: str) -> tuple:
    """The problems of one spec (`hf_msv.collect.lm.load_problems`), read once per spec and file version (the
    command checks them before any work, and every collection of the run reads them again).

    Raises:
        UserError: a spec that names no problems, or none at all.
    """
    path = Path(spec)
    return _load_spec(spec, path.stat().st_mtime_ns if path.is_file() else None)


@lru_cache(maxsize=16)
def _load_spec(spec: str, version) -> tuple:
    from ..collect.lm import load_problems

    problems = tuple(load_problems(spec))
    if not problems:
        raise UserError(f"problem spec {spec!r} names no problems")
    return problems


def problems_fingerprint(problems) -> str:
    """SHA-256 (16 hex digits) of the problems' ids, questions and gold answers, in order: a collection made from
    other problems under the same spec is not extended."""
    rows = [[p.id, p.question, p.gold] for p in problems]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ReproductionTask:
    """What a reproduction samples: its LM, its problems per split and how they become prompts. Built by
    `reproduction_task` from a `ReproduceConfig`.

    Args:
        name: the run's name (a testbed task's, or an own LM's `lm_run_name`).
        title: how report titles name the run.
        lm_name: what `hf_msv.collect.load_lm` loads.
        prompt_template: the collections' `CollectConfig.prompt_template`.
        delimiters: where streaming answers are elicited (None: the library's default).
        testbed: the `hf_msv.testbed.TestbedTask` (None for an own LM).
        splits: an own LM's problems: {split: problems} for `SPLITS`.
    """

    name: str
    title: str
    lm_name: str
    prompt_template: str
    delimiters: tuple | None = None
    testbed: TestbedTask | None = None
    splits: dict[str, tuple] | None = None

    def _spec_problems(self, split: str) -> tuple:
        """An own LM's problems of `split` (its spec's)."""
        if self.splits is None:
            raise ValueError(f"task {self.name!r} has neither a testbed nor problem specs")
        return self.splits[split]

    def problems(self, split: str, count: int, seed: int = 0) -> list:
        """The first `count` problems of `split` (a testbed task: its seeded draw, seed `seed`; an own LM: its
        spec's, in order)."""
        if self.testbed is not None:
            return self.testbed.generate_problems(split, count, seed=seed)
        have = self._spec_problems(split)
        if count > len(have):
            raise UserError(f"{count} {split} problems asked for; its problem spec has {len(have)}")
        return list(have[:count])

    def cost_problems(self, count: int) -> list:
        """The problems the LM's costs are timed on: a testbed's evaluation draw with another seed (99), an own LM's
        first evaluation problems."""
        if self.testbed is not None:
            return self.testbed.generate_problems("evaluation", count, seed=99)
        return self.problems("evaluation", min(count, len(self._spec_problems("evaluation"))))

    def lm_fingerprint(self, model) -> str:
        """What a collection's reuse key records of the LM: a testbed LM's checkpoint files, an own LM's weights
        (`weights_fingerprint`: no multi-gigabyte files hashed)."""
        if self.testbed is not None:
            from .reuse import data_fingerprint

            return data_fingerprint(self.testbed.lm_dir)
        from ..collect.lm import weights_fingerprint

        return weights_fingerprint(model)

    def collection_settings(self, split: str) -> dict[str, Any]:
        """What a collection's reuse key records of the task beyond its sizes: nothing for a testbed task (its
        generator is the collection code's), an own LM's prompt template, delimiters and problems."""
        if self.testbed is not None:
            return {}
        return {
            "prompt_template": self.prompt_template,
            "delimiters": None if self.delimiters is None else list(self.delimiters),
            "problems": problems_fingerprint(self._spec_problems(split)),
        }

    def difficulty(self, count: int) -> tuple[dict[str, Any] | None, str]:
        """The main study's difficulty per evaluation problem and its name: a testbed's reasoning steps (``ops``);
        none for an own LM."""
        if self.testbed is None:
            return None, "difficulty"
        from ..evaluation import difficulty_from_problems

        return difficulty_from_problems(self.problems("evaluation", count), "ops"), "reasoning steps"


def reproduction_task(cfg) -> ReproductionTask:
    """The `ReproductionTask` of `cfg` (a `ReproduceConfig`): its testbed task's, or its own LM's with its problem
    specs read and checked.

    Raises:
        UserError: an own-LM config without a model or three problem specs, a spec with no problems, or sizes
            beyond the specs' problems; an unknown testbed task.
    """
    if cfg.task != OWN_LM_TASK:
        from ..testbed import get_task

        testbed = get_task(cfg.task)
        return ReproductionTask(cfg.task, "Testbed reproduction", testbed.lm_name, "testbed", testbed=testbed)
    if not cfg.model:
        raise UserError(f"task {OWN_LM_TASK!r} is a run on your own LM: give its model (--model)")
    if len(cfg.problem_specs) != len(SPLITS):
        raise UserError("a run on your own LM needs --train-problems, --val-problems and --eval-problems")
    splits = {split: load_spec(spec) for split, spec in zip(SPLITS, cfg.problem_specs)}
    for split, count in zip(SPLITS, (cfg.train_problems, cfg.val_problems, cfg.eval_problems)):
        if count > len(splits[split]) or count < 1:
            raise UserError(f"{count} {split} problems asked for; its problem spec has {len(splits[split])}")
    return ReproductionTask(
        cfg.name, cfg.name, cfg.model, cfg.collection_prompt_template, cfg.delimiters, splits=splits
    )


def check_studies(cfg, studies) -> None:
    """A run on your own LM runs the main study only (UserError otherwise): the other studies are testbed
    experiments (extra collections drawn from its generator, delimiter-free traces of its LM)."""
    extra = [s for s in studies if s not in OWN_LM_STUDIES]
    if cfg.task == OWN_LM_TASK and extra:
        raise UserError(
            f"--studies {' '.join(extra)}: a run on your own LM (--model) runs the main study only; the other "
            "studies are experiments on the testbed (hf-msv reproduce --task v2)"
        )
