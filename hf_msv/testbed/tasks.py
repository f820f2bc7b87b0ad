"""The testbed's tasks by name, so that training, loading and evaluating a testbed LM can pick one.

``"v2"`` (:mod:`hf_msv.testbed.task_v2`) is the testbed the package ships: its LM lives in ``hf_msv/testbed/lm-v2``
and is called ``"testbed"`` (``load_lm("testbed")``, ``--model testbed``, problem specs ``testbed:<split>:<n>``;
``"testbed-v2"`` is an alias). Another task joins with :func:`hf_msv.testbed.registration.register_task` (the first
testbed, ``"v1"``, does so from ``research/testbed_v1``). A task module has the public shape of
:mod:`~hf_msv.testbed.task_v2` (``generate_problems``, ``format_prompt``, ``make_training_trace``,
``make_elicitation_example``, ``GEN_KNOBS``); a :class:`TestbedTask` adds what differs around it: the knobs dataclass,
where the LM lives, its name, its context and the command that trains it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ..errors import UserError
from . import task_v2

_HERE = Path(__file__).resolve().parent
# Positions an LM needs beyond the trace cap: the prompt (<= ~150 characters for v2), the elicitation prompt and a
# boxed answer + EOS (~40), with room to spare: 272 + 288 = 560 for v2's default cap.
_CONTEXT_BEYOND_CAP = 288
UNCAPPED_CONTEXT = 512  # a task without a length cap writes short traces (v1: ~120 tokens on average)


@dataclass(frozen=True)
class TestbedTask:
    """One testbed task: its module, its knobs, and the testbed LM trained on it."""

    name: str  # "v2": what train_lm --task and hf-msv reproduce --task take
    lm_name: str  # what `hf_msv.collect.load_lm` and problem specs (``<lm_name>:<split>:<n>``) call it
    module: ModuleType
    knobs: Callable  # knob overrides -> the task's frozen knobs dataclass (raises on an unknown or bad knob)
    lm_dir: Path
    trainer: str = "python -m hf_msv.testbed.train_lm"  # the command that trains it (it takes train_lm's options)

    def generate_problems(self, split: str, n: int, seed: int = 0, **knobs):
        """``n`` problems of ``split``: every knob is validated, the generator's are used (solver knobs only
        shape traces)."""
        self.knobs(**knobs)
        gen = {k: v for k, v in knobs.items() if k in self.module.GEN_KNOBS}
        return self.module.generate_problems(split, n, seed=seed, **gen)

    def sampling_cap(self, knobs: dict | None = None) -> int | None:
        """The length cap (tokens) sampling applies to a trace, None for a task without one."""
        return getattr(self.knobs(**dict(knobs or {})), "max_trace_tokens", None)

    def context(self, knobs: dict | None = None) -> int:
        """Positions (``max_position_embeddings``) of an LM trained on this task: prompt + capped trace +
        elicitation."""
        cap = self.sampling_cap(knobs)
        return UNCAPPED_CONTEXT if cap is None else cap + _CONTEXT_BEYOND_CAP

    def train_command(self) -> str:
        """The command that trains this task's LM into its directory (what a missing-LM error tells the user)."""
        return f"{self.trainer} --task {self.name} --output-dir {self.lm_dir}"


TASKS = {
    "v2": TestbedTask("v2", "testbed", task_v2, task_v2.knobs_v2, _HERE / "lm-v2"),
}
DEFAULT_TASK = "v2"  # what "testbed" names
# LM names (``load_lm``, problem specs) -> task names; "testbed-v2" stays an alias of the default
TESTBED_LM_NAMES = {t.lm_name: t.name for t in TASKS.values()} | {"testbed-v2": "v2"}


def get_task(name: str) -> TestbedTask:
    """The task called ``name`` (``"v2"``, or a registered one) or whose LM is called ``name`` (``"testbed"`` and
    ``"testbed-v2"``: v2)."""
    name = TESTBED_LM_NAMES.get(name, name)
    if name not in TASKS:
        raise UserError(f"unknown testbed task {name!r}: use one of {sorted(TASKS)} or {sorted(TESTBED_LM_NAMES)}")
    return TASKS[name]


__all__ = ["DEFAULT_TASK", "TASKS", "TESTBED_LM_NAMES", "UNCAPPED_CONTEXT", "TestbedTask", "get_task"]
