"""Testbed v1, the first testbed, kept for comparison with the package's testbed (v2): its task (:mod:`.task`) and
its LM (``lm/``), registered with the package on import as task ``"v1"`` and LM ``testbed-v1``.

    import research.testbed_v1          # from the repository root; then, like any testbed task:
    from hf_msv.testbed import load_testbed_lm
    model, tokenizer = load_testbed_lm(task="v1")   # also load_lm("testbed-v1"), problem specs testbed-v1:<split>:<n>

``python -m research.testbed_v1 --help`` lists the commands (retrain the LM, its reproduction, its quality
benchmark); ``README.md`` says what v1 is.
"""

from __future__ import annotations

from pathlib import Path

from hf_msv.testbed.registration import register_task
from hf_msv.testbed.tasks import TestbedTask

from . import task

LM_DIR = Path(__file__).resolve().parent / "lm"
TASK = TestbedTask("v1", "testbed-v1", task, task.TaskKnobs, LM_DIR, trainer="python -m research.testbed_v1 train-lm")


def register() -> None:
    """Task ``"v1"`` (``train_lm --task v1``, ``hf-msv reproduce --task v1``, ``get_task``) and LM ``testbed-v1``."""
    register_task(TASK)


register()

__all__ = ["LM_DIR", "TASK", "register", "task"]
