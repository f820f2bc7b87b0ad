"""The testbed: a small synthetic reasoning LM trained by hf_msv, shipped as the default LM of the demo and tests.

A ~0.9 M-parameter character-level ``LlamaForCausalLM`` trained from scratch on CPU on synthetic arithmetic word
problems (:mod:`.task_v2`), whose traces look like a reasoning model's (steps, ``Wait`` re-checks, a length cap, a
boxed final answer) and mix right and wrong answers. A testbed for verifiers and early stopping, not a math model.

    from hf_msv.testbed import load_testbed_lm, generate_problems, format_prompt
    model, tokenizer = load_testbed_lm()
    problems = generate_problems("evaluation", 448)

``testbed`` (alias ``testbed-v2``) names the LM in ``hf_msv/testbed/lm-v2``. :mod:`.tasks` maps the names,
:mod:`.registration` registers them with :mod:`hf_msv.registry` (its ``register_task`` adds another task, as
``research/testbed_v1`` does for the first testbed), :mod:`.train_lm` retrains an LM. Design, statistics and limits:
``docs/testbed.md``.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import MissingPathError
from .task_v2 import (
    DELIMITER,
    ELICITATION_PROMPT,
    SPLITS,
    TaskKnobsV2,
    format_prompt,
    generate_problems,
    make_elicitation_example,
    make_trace,
    split_of,
)
from .tasks import DEFAULT_TASK, TASKS, TESTBED_LM_NAMES, get_task

TESTBED_LM_DIR = TASKS[DEFAULT_TASK].lm_dir  # the default testbed LM (v2)
TESTBED_V2_LM_DIR = TASKS["v2"].lm_dir
# The streaming MSV_16 shipped in the package (`hf_msv.reproduction.train_shipped_verifier`) and the task of the LM
# it was trained on (the default testbed's), so the demo and the examples that use it load that task's LM and
# problems: a verifier reads its own LM's hidden states.
TESTBED_VERIFIER_DIR = Path(__file__).resolve().parent / "verifier"
TESTBED_VERIFIER_TASK = DEFAULT_TASK

__all__ = [
    "DEFAULT_TASK",
    "DELIMITER",
    "ELICITATION_PROMPT",
    "SPLITS",
    "TASKS",
    "TESTBED_LM_DIR",
    "TESTBED_LM_NAMES",
    "TESTBED_V2_LM_DIR",
    "TESTBED_VERIFIER_DIR",
    "TESTBED_VERIFIER_TASK",
    "TaskKnobsV2",
    "format_prompt",
    "generate_problems",
    "get_task",
    "load_testbed_lm",
    "make_elicitation_example",
    "make_trace",
    "split_of",
]


def load_testbed_lm(device="cpu", dtype=None, task: str = DEFAULT_TASK):
    """The testbed LM of ``task`` and its tokenizer: ``(model, tokenizer)``, model in eval mode on ``device``.

    Plain ``AutoModelForCausalLM`` / ``AutoTokenizer`` loads of the task's LM directory (:data:`TESTBED_LM_DIR` for
    the default, ``"v2"``; a registered task's own; no remote code). The tokenizer prepends ``<bos>``, pads on the
    left, and encodes the delimiter ``Wait`` as a single token.

    Raises:
        ValueError: an unknown ``task``.
        FileNotFoundError: the task's LM directory has no checkpoint (the message says how to train one).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t = get_task(task)
    if not (t.lm_dir / "config.json").exists():
        raise MissingPathError(f"no testbed {t.name} checkpoint at {t.lm_dir}; train it with `{t.train_command()}`")
    tokenizer = AutoTokenizer.from_pretrained(t.lm_dir)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(t.lm_dir, **kwargs).to(device).eval()  # pyright: ignore[reportArgumentType]  (transformers' wrapped `to` loses its self type)
    return model, tokenizer
