"""Wall time of `hf_msv.training.train_verifier` with the default recipe (target: MSV_64 on 224 problems × 64
samples within 15 minutes on 2 CPU cores).

Real shards when given (``--train-dir`` / ``--val-dir``, e.g. the reproduction's 224 / 64 problems × 64 samples),
else synthetic shards shaped like the testbed's (`train_throughput.synthetic_problem`: the testbed LM's width, 64
sequences per problem, 1 terminal answer plus ~2.3 ``Wait`` answers per sequence). Everything `train_verifier` does
is timed: loading, the step budget with validation every K steps and early stopping, and the guard (calibrated
self-consistency and the linear probe on validation).

    python benchmarks/train_defaults.py --threads 2                      # synthetic, 224 / 64 problems
    python benchmarks/train_defaults.py --train-dir data/train --val-dir data/val --modes terminal streaming
    python benchmarks/train_defaults.py --quick       # terminal MSV_4 on 6 / 4 synthetic problems, 4 steps

Last line: JSON with, per mode, ``seconds``, ``steps``, ``max_steps``, ``stopped_early``, ``best_step``, the guard's
validation Brier of MSV_N and of calibrated self-consistency.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train-dir")
    parser.add_argument("--val-dir")
    parser.add_argument("--problems", type=int, default=224, help="synthetic training problems")
    parser.add_argument("--val-problems", type=int, default=64, help="synthetic validation problems")
    parser.add_argument("--num-sequences", type=int, default=64)
    parser.add_argument("--modes", nargs="+", default=["terminal", "streaming"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="cap the budget (a partial measurement: report seconds per step and extrapolate)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="terminal MSV_4 on 6 / 4 synthetic problems, at most 4 steps (checks the script, not a measurement)",
    )
    args = parser.parse_args()
    if args.quick:
        args.problems, args.val_problems, args.num_sequences, args.max_steps = 6, 4, 4, 4
        args.modes = ["terminal"]
    torch.set_num_threads(args.threads)

    from hf_msv.training import MSVTrainingConfig, train_verifier

    root = Path(tempfile.mkdtemp(prefix="train_defaults_"))
    report = {
        "threads": args.threads,
        "num_sequences": args.num_sequences,
        "data": "real" if args.train_dir else "synthetic",
    }
    try:
        train_dir, val_dir = args.train_dir, args.val_dir
        if not train_dir:
            from train_throughput import testbed_shape, write_split

            d, heads = testbed_shape()
            train_dir, val_dir = root / "train", root / "val"
            write_split(train_dir, args.problems, d, heads, 64, 2.3, 0)
            write_split(val_dir, args.val_problems, d, heads, 64, 2.3, 1)
        for mode in args.modes:
            start = time.perf_counter()
            result = train_verifier(
                train_dir,
                val_dir,
                root / f"msv-{mode}",
                MSVTrainingConfig(
                    num_sequences=args.num_sequences, mode=mode, max_steps=args.max_steps, progress=False
                ),
            )
            seconds = time.perf_counter() - start
            log = json.loads((root / f"msv-{mode}" / "training_log.json").read_text())
            report[mode] = {
                "seconds": round(seconds, 1),
                "steps": log["steps"],
                "max_steps": result.plan.max_steps,
                "seconds_per_step": round(seconds / max(1, log["steps"]), 3),
                "eval_steps": result.plan.eval_steps,
                "stopped_early": log["stopped_early"],
                "best_step": result.best_step,
                "val_brier": result.guard.verifier["brier"],
                "val_brier_self_consistency": result.guard.self_consistency["brier"],
            }
            print(
                f"MSV_{args.num_sequences} {mode}: {seconds:.0f} s, {log['steps']} steps "
                f"(budget {result.plan.max_steps}, stopped early: {log['stopped_early']})",
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
