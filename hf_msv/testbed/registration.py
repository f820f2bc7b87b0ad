"""Registers the testbed LMs with `hf_msv.registry` (entry point ``hf_msv.lms: testbed``)."""

from __future__ import annotations

from functools import partial

from ..registry import NamedLM, register_lm
from .task import format_prompt
from .tasks import TASKS


def _problems(task, split: str, n: int, seed: int = 0):
    return task.generate_problems(split, n, seed=seed)


def register() -> None:
    """``testbed`` (alias ``testbed-v2``): the default testbed LM; ``testbed-v1``: the first testbed's."""
    for task, aliases in ((TASKS["v2"], ("testbed-v2",)), (TASKS["v1"], ())):
        register_lm(NamedLM(name=task.lm_name, path=task.lm_dir, prompt=format_prompt,
                            max_new_tokens=task.sampling_cap(), problems=partial(_problems, task),
                            missing_hint=f"train it with `{task.train_command()}`", aliases=aliases))
