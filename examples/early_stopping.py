"""Early stopping of parallel decoding inside plain `model.generate`.

    python examples/early_stopping.py -n 16                # the verifier's certified stop and pruning
    python examples/early_stopping.py --threshold 0.9      # your own λ (no pruning)
    python examples/early_stopping.py --quick              # N = 8, threshold 0.5 (a smoke run)

Uses the embedded default (testbed LM + its streaming MSV); pass --model/--verifier directories for your own.
"""

import argparse

import torch

from hf_msv import MSVEarlyStop, prepare_generation
from hf_msv.demo import load_custom, load_default
from hf_msv.testbed import TESTBED_VERIFIER_TASK, format_prompt, get_task

parser = argparse.ArgumentParser()
parser.add_argument("--threshold", type=float, help="λ (default: what the verifier certified, with its pruning)")
parser.add_argument("-n", "--num-sequences", type=int, default=16)
parser.add_argument("--max-new-tokens", type=int, help="default: the testbed's length cap (v2: 272), else 400")
parser.add_argument("--model")
parser.add_argument("--verifier")
parser.add_argument("--quick", action="store_true", help="N = 8 at threshold 0.5")
args = parser.parse_args()
if args.quick:
    args.num_sequences, args.threshold = 8, 0.5

model, tokenizer, verifier = load_custom(args.model, args.verifier) if args.model else load_default()
task = get_task(TESTBED_VERIFIER_TASK)
problem = task.generate_problems("evaluation", 1, seed=1)[0]  # a testbed problem
max_new_tokens = args.max_new_tokens or task.sampling_cap() or 400  # v2's LM was trained on traces cut at its cap
inputs = tokenizer([format_prompt(problem)], return_tensors="pt")

msv = prepare_generation(model, tokenizer, verifier, delimiters=["Wait"])
torch.manual_seed(0)
model.generate(
    **inputs,
    custom_generate=msv,  # the session is the decoding loop: elicitation, scoring, the stop and pruning
    do_sample=True,
    temperature=1.0,
    top_k=0,
    num_return_sequences=args.num_sequences,
    max_new_tokens=max_new_tokens,
    # The verifier's certified λ and pruning rule (MSVEarlyStop.from_verifier), or a λ of your own.
    stopping_criteria=[MSVEarlyStop.resolve("certified" if args.threshold is None else args.threshold, verifier)],
)
result = msv.pop_results()[0]

print(problem.question)
print(f"gold {problem.gold}; chosen {result.chosen.text} with confidence {result.confidence:.3f}")
print(
    f"stopped early: {result.stopped_early} at step {result.stop_step}; {len(result.answers)} answers elicited; "
    f"{result.tokens_decoded} chain-of-thought tokens of a {result.token_budget} budget; "
    f"{len(result.pruned)} chains pruned (chain, tokens decoded): {result.pruned}"
)
print("time split:", {k: round(v, 3) for k, v in result.timings.items()})
