"""Best-of-N with an MSV: sample N, read every final answer, pick the most likely correct one.

    python examples/best_of_n.py -n 16
    python examples/best_of_n.py --quick     # N = 4, one problem (a smoke run)

The shipped testbed verifier is a streaming MSV; here it scores the terminal answers only (no early stop, λ=None),
and the chosen answer is the best final answer. A terminal-mode MSV (`hf-msv train --mode terminal`) adds the
paper's logit averaging over equivalent answers.
"""

import argparse
from collections import Counter

import torch

from hf_msv import get_checker, msv_generate
from hf_msv.demo import load_default
from hf_msv.testbed import TESTBED_VERIFIER_TASK, format_prompt, get_task

parser = argparse.ArgumentParser()
parser.add_argument("-n", "--num-sequences", type=int, default=16)
parser.add_argument("--problems", type=int, default=3)
parser.add_argument("--quick", action="store_true", help="N = 4 on one problem")
args = parser.parse_args()
if args.quick:
    args.num_sequences, args.problems = 4, 1

model, tokenizer, verifier = load_default()  # the shipped MSV and the testbed LM it was trained on
task = get_task(TESTBED_VERIFIER_TASK)
checker = get_checker("symbolic")
for problem in task.generate_problems("evaluation", args.problems, seed=2):
    torch.manual_seed(0)
    result = msv_generate(
        model,
        tokenizer,
        [format_prompt(problem)],
        verifier=verifier,
        threshold=None,
        num_sequences=args.num_sequences,
        max_new_tokens=task.sampling_cap() or 400,
        generate_kwargs={"temperature": 1.0, "top_k": 0},
    )[0]
    finals = [a for a in result.answers if a.terminal]
    vote = Counter(a.text for a in finals if a.text is not None).most_common(1)
    print(
        f"{problem.id}: gold {problem.gold} | MSV best-of-{args.num_sequences}: {result.chosen.text} "
        f"(p={result.confidence:.2f}, correct={checker.is_correct(result.chosen.text, problem.gold)}) | "
        f"majority vote: {vote[0][0] if vote else None}"
    )
