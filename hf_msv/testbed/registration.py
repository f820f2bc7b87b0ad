"""Registers the testbed LMs with `hf_msv.registry` (entry point ``hf_msv.lms: testbed``)."""

from __future__ import annotations

from functools import partial

from ..registry import NamedLM, register_lm
from .tasks import DEFAULT_TASK, TASKS, TESTBED_LM_NAMES, TestbedTask


def _problems(task, split: str, n: int, seed: int = 0):
    return task.generate_problems(split, n, seed=seed)


def _register_lm(task: TestbedTask, aliases: tuple[str, ...]) -> None:
    register_lm(
        NamedLM(
            name=task.lm_name,
            path=task.lm_dir,
            prompt=task.module.format_prompt,
            max_new_tokens=task.sampling_cap(),
            problems=partial(_problems, task),
            missing_hint=f"train it with `{task.train_command()}`",
            aliases=aliases,
        )
    )


def register() -> None:
    """``testbed`` (alias ``testbed-v2``): the testbed LM of the default task."""
    _register_lm(TASKS[DEFAULT_TASK], ("testbed-v2",))


def register_task(task: TestbedTask, aliases: tuple[str, ...] = ()) -> None:
    """Make `task` a testbed task beside the default one: `get_task` and `TASKS` (``train_lm --task``,
    ``hf-msv reproduce --task``) know it by ``task.name``, and `hf_msv.registry` knows its LM by ``task.lm_name``
    and `aliases` (``load_lm``, ``--model``, problem specs ``<lm_name>:<split>:<n>[:<seed>]``)."""
    TASKS[task.name] = task
    TESTBED_LM_NAMES.update(dict.fromkeys((task.lm_name, *aliases), task.name))
    _register_lm(task, aliases)
