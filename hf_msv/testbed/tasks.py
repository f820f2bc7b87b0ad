"""The testbed's tasks by name, so that training, loading and evaluating a testbed LM can pick one.

``"v2"`` (:mod:`hf_msv.testbed.task_v2`) is the default: its LM ships in ``hf_msv/testbed/lm-v2`` and is called
``"testbed"`` (``load_lm("testbed")``, ``--model testbed``, problem specs ``testbed:<split>:<n>``; ``"testbed-v2"``
is an alias). ``"v1"`` (:mod:`hf_msv.testbed.task`, LM in ``hf_msv/testbed/lm``) is ``"testbed-v1"``. Both task
modules have the same public shape (``generate_problems``, ``format_prompt``, ``make_training_trace``,
``make_elicitation_example``, ``GEN_KNOBS``); a :class:`TestbedTask` adds what differs around them: the knobs
dataclass, where the LM lives, its name and its context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from . import task, task_v2

_HERE = Path(__file__).resolve().parent
# Positions an LM needs beyond the trace cap: the prompt (<= ~150 characters for v2), the elicitation prompt and a
# boxed answer + EOS (~40), with room to spare: 272 + 288 = 560 for v2's default cap.
_CONTEXT_BEYOND_CAP = 288
V1_CONTEXT = 512  # v1 traces are uncapped but short (~120 tokens on average): the shipped LM's context


@dataclass(frozen=True)
class TestbedTask:
    """One testbed task: its module, its knobs, and the testbed LM trained on it."""

    name: str  # "v1" / "v2": what train_lm --task takes
    lm_name: str  # what `hf_msv.collect.load_lm` and problem specs (``<lm_name>:<split>:<n>``) call it
    module: ModuleType
    knobs: Callable  # knob overrides -> the task's frozen knobs dataclass (raises on an unknown or bad knob)
    lm_dir: Path

    def generate_problems(self, split: str, n: int, seed: int = 0, **knobs):
        """``n`` problems of ``split``: every knob is validated, the generator's are used (solver knobs only
        shape traces)."""
        self.knobs(**knobs)
        gen = {k: v for k, v in knobs.items() if k in self.module.GEN_KNOBS}
        return self.module.generate_problems(split, n, seed=seed, **gen)

    def sampling_cap(self, knobs: dict | None = None) -> int | None:
        """The length cap (tokens) sampling applies to a trace, None for a task without one (v1)."""
        return getattr(self.knobs(**dict(knobs or {})), "max_trace_tokens", None)

    def context(self, knobs: dict | None = None) -> int:
        """Positions (``max_position_embeddings``) of an LM trained on this task: prompt + capped trace +
        elicitation."""
        cap = self.sampling_cap(knobs)
        return V1_CONTEXT if cap is None else cap + _CONTEXT_BEYOND_CAP

    def train_command(self) -> str:
        """The command that trains this task's LM into its directory (what a missing-LM error tells the user)."""
        return f"python -m hf_msv.testbed.train_lm --task {self.name} --output-dir {self.lm_dir}"


TASKS = {
    "v1": TestbedTask("v1", "testbed-v1", task, task.TaskKnobs, _HERE / "lm"),
    "v2": TestbedTask("v2", "testbed", task_v2, task_v2.knobs_v2, _HERE / "lm-v2"),
}
DEFAULT_TASK = "v2"  # what "testbed" names; v1 is "testbed-v1"
# LM names (``load_lm``, problem specs) -> task names; "testbed-v2" stays an alias of the default
TESTBED_LM_NAMES = {t.lm_name: t.name for t in TASKS.values()} | {"testbed-v2": "v2"}


def get_task(name: str) -> TestbedTask:
    """The task called ``name`` (``"v1"``, ``"v2"``) or whose LM is called ``name`` (``"testbed"``: v2,
    ``"testbed-v1"``, ``"testbed-v2"``)."""
    name = TESTBED_LM_NAMES.get(name, name)
    if name not in TASKS:
        raise ValueError(f"unknown testbed task {name!r}: use one of {sorted(TASKS)} or {sorted(TESTBED_LM_NAMES)}")
    return TASKS[name]


__all__ = ["DEFAULT_TASK", "TASKS", "TESTBED_LM_NAMES", "TestbedTask", "get_task"]
