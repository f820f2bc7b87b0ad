"""The testbed: a small synthetic reasoning LM trained by hf_msv, shipped as the embedded default.

Nothing that can really solve math loads on a CPU-only machine without the Hub, so hf_msv ships its own *testbed*:
a ~1M-parameter character-level ``LlamaForCausalLM`` trained from scratch (on 2 CPU cores) on synthetic multi-step
arithmetic word problems (:mod:`hf_msv.testbed.task_v2`). Its sampled traces look like a reasoning model's (steps,
``Wait`` re-checks that mostly confirm and sometimes fix or break the answer, a length cap that cuts long chains, a
final ``### Final Answer ### \\boxed{}``), mix correct and wrong answers, and answer the elicitation prompt at any
``Wait``. It is a testbed for verifiers and early stopping, **not** a math model: its numbers say nothing about real
LMs on real benchmarks.

    from hf_msv.testbed import load_testbed_lm, generate_problems, format_prompt
    model, tokenizer = load_testbed_lm()
    problems = generate_problems("evaluation", 448)

The default task is testbed v2 (issue #17; its LM in ``hf_msv/testbed/lm-v2``, retrained with ``python -m
hf_msv.testbed.train_lm --no-bf16 --output-dir hf_msv/testbed/lm-v2``). The first testbed, v1
(:mod:`hf_msv.testbed.task`, LM in ``hf_msv/testbed/lm``), stays loadable for comparison:
``load_testbed_lm(task="v1")``, ``load_lm("testbed-v1")``, problem specs ``testbed-v1:<split>:<n>``; :mod:`.tasks`
maps the names.
"""

from __future__ import annotations

from pathlib import Path

from .task import DELIMITER, ELICITATION_PROMPT, SPLITS, TaskKnobs, format_prompt, split_of
from .task_v2 import TaskKnobsV2, generate_problems, make_elicitation_example, make_trace
from .tasks import DEFAULT_TASK, TASKS, TESTBED_LM_NAMES, get_task

TESTBED_LM_DIR = TASKS[DEFAULT_TASK].lm_dir  # the default testbed LM (v2)
TESTBED_V1_LM_DIR = TASKS["v1"].lm_dir
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
    "TESTBED_V1_LM_DIR",
    "TESTBED_V2_LM_DIR",
    "TESTBED_VERIFIER_DIR",
    "TESTBED_VERIFIER_TASK",
    "TaskKnobs",
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
    the default, ``"v2"``; :data:`TESTBED_V1_LM_DIR` for ``"v1"``; no remote code). The tokenizer prepends
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
