"""Verifier fits per hour with `hf_msv.reproduction.TrainingQueue`: one process with all the threads, or several
1-thread processes at once (``hf-msv reproduce --train-workers``).

A reproduction trains ~100 independent fits. An MSV step on testbed-sized data is a chain of small matrix products
that two threads of one process share poorly, so on 2 cores two 1-thread fits at once may finish sooner than one
2-thread fit after another. This measures it on `train_throughput.py`'s synthetic testbed-shaped shards: `--fits`
streaming MSV_16 fits (seeds 0, 1, ...; `--max-steps` each, no vote cross-validation) trained through the queue
with 1 worker × `--threads` threads, then with `--threads` workers × 1 thread, on the same data.

    python benchmarks/train_workers.py --threads 2            # 4 fits of 112 steps each way
    python benchmarks/train_workers.py --threads 2 --quick    # 2 fits of 4 steps on 16 problems (a smoke run)

Last line: JSON with each layout's seconds and ``speedup`` = seconds(1 worker) ÷ seconds(workers).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

# train_throughput.py sits beside this file (benchmarks/ is sys.path[0] when run as a script).
from train_throughput import testbed_shape, write_split


def run(queue_workers: int, threads: int, root: Path, fits: int, max_steps: int) -> float:
    """Wall seconds to train `fits` fits through a `TrainingQueue(queue_workers, threads)`."""
    from hf_msv.reproduction import TrainingQueue, train_or_reuse
    from hf_msv.training import MSVTrainingConfig

    torch.set_num_threads(threads)  # what the inline layout trains with
    queue = TrainingQueue(queue_workers, threads)
    start = time.perf_counter()
    try:
        for seed in range(fits):
            config = MSVTrainingConfig(
                kind="msv",
                num_sequences=16,
                mode="streaming",
                max_steps=max_steps,
                eval_steps=max_steps,
                vote_folds=0,
                progress=False,
                seed=seed,
            )
            train_or_reuse(
                root / "train",
                root / "val",
                root / f"w{queue_workers}" / f"fit{seed}",
                config,
                code="benchmark",
                queue=queue,
            )
        queue.wait()
    finally:
        queue.close()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2, help="CPU cores to use")
    parser.add_argument("--fits", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=112)
    parser.add_argument("--problems", type=int, default=64)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.fits, args.max_steps, args.problems = 2, 4, 16
    d, heads = testbed_shape()
    root = Path(tempfile.mkdtemp(prefix="train_workers_"))
    try:
        write_split(root / "train", args.problems, d, heads, 64, 2.3, 0)
        write_split(root / "val", 8, d, heads, 64, 2.3, 1)
        one = run(1, args.threads, root, args.fits, args.max_steps)
        print(f"1 worker x {args.threads} threads: {args.fits} fits in {one:.1f} s", flush=True)
        many = run(args.threads, 1, root, args.fits, args.max_steps)
        print(f"{args.threads} workers x 1 thread: {args.fits} fits in {many:.1f} s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {
                "threads": args.threads,
                "fits": args.fits,
                "max_steps": args.max_steps,
                "hidden_size": d,
                "one_worker_seconds": round(one, 2),
                "workers_seconds": round(many, 2),
                "speedup": round(one / many, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
