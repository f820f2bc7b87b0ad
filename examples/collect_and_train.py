"""Collect answers with hidden states from an LM, then train a verifier on them.

    python examples/collect_and_train.py --train-problems 32 --val-problems 8 -n 8 --output-dir outputs/recipe
    python examples/collect_and_train.py --quick   # 4 / 2 problems x 4 samples into a temporary directory

The same two library calls as `hf-msv collect` / `hf-msv train`; at the paper's scale use 224/64 problems, N=64,
and `accelerate launch` to spread collection over GPUs.
"""

import argparse
import tempfile
from pathlib import Path

from hf_msv import MSVTrainingConfig, train_verifier
from hf_msv.collect import collect
from hf_msv.testbed import generate_problems, load_testbed_lm

parser = argparse.ArgumentParser()
parser.add_argument("--train-problems", type=int, default=32)
parser.add_argument("--val-problems", type=int, default=8)
parser.add_argument("-n", "--num-samples", type=int, default=8)
parser.add_argument("--max-new-tokens", type=int, default=272, help="the testbed LM's length cap")
parser.add_argument("--output-dir", default=None, help="default: outputs/recipe (--quick: a temporary directory)")
parser.add_argument(
    "--quick", action="store_true", help="4 / 2 problems x 4 samples, traces cut at 160 tokens, 8 training steps"
)
args = parser.parse_args()
if args.quick:
    args.train_problems, args.val_problems, args.num_samples, args.max_new_tokens = 4, 2, 4, 160
out = Path(args.output_dir or (tempfile.mkdtemp(prefix="recipe-") if args.quick else "outputs/recipe"))
model, tokenizer = load_testbed_lm()
for split, count in (("train", args.train_problems), ("validation", args.val_problems)):
    collect(
        model,
        tokenizer,
        generate_problems(split, count, seed=0),
        out / split,
        num_samples=args.num_samples,
        max_new_tokens=args.max_new_tokens,
        prompt_template="testbed",
        delimiters=["Wait"],
    )
# --quick caps training at 8 steps and decides on validation whether to leave the vote (no cross-validation)
quick = dict(max_steps=8, vote_folds=0) if args.quick else {}
result = train_verifier(
    out / "train",
    out / "validation",
    out / "verifier",
    MSVTrainingConfig(num_sequences=args.num_samples, mode="streaming", **quick),
)
print(result)
print(f"verifier saved to {out / 'verifier'}")
