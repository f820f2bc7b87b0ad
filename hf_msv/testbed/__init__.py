"""The testbed: a small synthetic reasoning LM trained by hf_msv, shipped as the embedded default.

Nothing that can really solve math loads on a CPU-only machine without the Hub, so hf_msv ships its own *testbed*:
a ~2M-parameter character-level ``LlamaForCausalLM`` trained from scratch (on 2 CPU cores) on a synthetic multi-step
arithmetic word-problem task (:mod:`hf_msv.testbed.task`). Its sampled traces look like a reasoning model's (steps,
``Wait`` re-checks that sometimes fix and sometimes break the answer, a final ``### Final Answer ### \\boxed{}``),
mix correct and wrong answers, and answer the elicitation prompt at any ``Wait``. It is a testbed for verifiers and
early stopping, **not** a math model: its numbers say nothing about real LMs on real benchmarks.

    from hf_msv.testbed import load_testbed_lm, generate_problems, format_prompt
    model, tokenizer = load_testbed_lm()
    problems = generate_problems("evaluation", 448)

Retrain the shipped checkpoint with ``python -m hf_msv.testbed.train_lm --output-dir hf_msv/testbed/lm``. A second
task, testbed v2 (:mod:`hf_msv.testbed.task_v2`, issue #17), is selectable everywhere v1 is (:mod:`.tasks`); its LM
ships in ``hf_msv/testbed/lm-v2`` (``load_testbed_lm(task="v2")``, ``load_lm("testbed-v2")``; retrain it with
``python -m hf_msv.testbed.train_lm --task v2 --no-bf16 --output-dir hf_msv/testbed/lm-v2``).
"""

from __future__ import annotations

from pathlib import Path

from .task import (
    DELIMITER,
    ELICITATION_PROMPT,
    SPLITS,
    TaskKnobs,
    format_prompt,
    generate_problems,
    make_elicitation_example,
    make_trace,
    split_of,
)
from .tasks import TASKS, TESTBED_LM_NAMES, get_task

TESTBED_LM_DIR = TASKS["v1"].lm_dir
TESTBED_V2_LM_DIR = TASKS["v2"].lm_dir  # shipped; v1 stays the default until the v2 verifier and demo ship
# The streaming MSV_16 trained on the testbed LM (`hf_msv.reproduction.train_shipped_verifier`).
TESTBED_VERIFIER_DIR = Path(__file__).resolve().parent / "verifier"

__all__ = [
    "DELIMITER",
    "ELICITATION_PROMPT",
    "SPLITS",
    "TASKS",
    "TESTBED_LM_DIR",
    "TESTBED_LM_NAMES",
    "TESTBED_V2_LM_DIR",
    "TESTBED_VERIFIER_DIR",
    "TaskKnobs",
    "format_prompt",
    "generate_problems",
    "get_task",
    "load_testbed_lm",
    "make_elicitation_example",
    "make_trace",
    "split_of",
]


def load_testbed_lm(device="cpu", dtype=None, task: str = "v1"):
    """The testbed LM of ``task`` and its tokenizer: ``(model, tokenizer)``, model in eval mode on ``device``.

    Plain ``AutoModelForCausalLM`` / ``AutoTokenizer`` loads of the task's LM directory (:data:`TESTBED_LM_DIR`, the
    shipped one, for ``"v1"``; :data:`TESTBED_V2_LM_DIR` for ``"v2"``; no remote code). The tokenizer prepends
    ``<bos>``, pads on the left, and encodes the delimiter ``Wait`` as a single token.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t = get_task(task)
    if not (t.lm_dir / "config.json").exists():
        raise FileNotFoundError(f"no testbed {t.name} checkpoint at {t.lm_dir}; train it with `{t.train_command()}`")
    tokenizer = AutoTokenizer.from_pretrained(t.lm_dir)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(t.lm_dir, **kwargs).to(device).eval()
    return model, tokenizer
