"""Best-of-64 of MSV_64 trained with and without logit averaging, over training seeds, next to self-consistency.

On the testbed the C2 check (MSV_64 best-of-64 ≥ the best baseline + 2 pp) fails with the paper's logit averaging,
while the checker study's MSV_64 trained without it scored higher. One training run each is not enough to tell an
effect from luck, so this script collects a fresh 224 / 64 / 448 × 64 set (the reproduction's sizes and settings),
trains terminal MSV_64 both ways for several seeds and scores best-of-64 on every evaluation problem.

    python scripts/logit_averaging.py --device cuda --problems-per-batch 32 --seeds 3   # ~8 min on an H100

Prints one row per model; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", default="outputs/logit-averaging")
    parser.add_argument("--seeds", type=int, default=3, help="training seeds per variant")
    parser.add_argument("--device", default=None, help="where the LM samples (default: the GPU when there is one)")
    parser.add_argument("--problems-per-batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="the quick reproduction's sizes (a smoke run)")
    args = parser.parse_args(argv)

    import torch

    from hf_msv.baselines import self_consistency
    from hf_msv.collect import load_lm
    from hf_msv.evaluation import answer_group, load_split, load_verifier, score_problems, select_answers
    from hf_msv.metrics import best_of_n_accuracy
    from hf_msv.reproduce import ReproduceConfig, _collect_splits, _train, training_config

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = ReproduceConfig.quick_config() if args.quick else ReproduceConfig()
    cfg.problems_per_batch = args.problems_per_batch
    work, n = Path(args.work_dir), cfg.max_n
    data = work / "data"
    started = time.perf_counter()
    model, tokenizer = load_lm("testbed", device=args.device)
    _collect_splits(model, tokenizer, data, cfg, cfg.num_samples, (cfg.train_problems, cfg.val_problems,
                                                                    cfg.eval_problems))
    del model
    collected_s = time.perf_counter() - started

    problems, _ = load_split(data / "eval")
    everyone = [np.arange(n) for _ in problems]   # the first N sequences (all 64 at full size)
    groups = [answer_group(p, s, "terminal") for p, s in zip(problems, everyone)]
    votes = [self_consistency(g.klass, g.is_terminal) for g in groups]
    terminal_rows = [select_answers(p, s, "terminal")[0] for p, s in zip(problems, everyone)]
    out = {"self_consistency": best_of_n_accuracy(groups, votes), "with": [], "without": []}
    print(f"self-consistency best-of-{n}: {out['self_consistency']:.4f}")
    for seed in range(args.seeds):
        for variant, averaging in (("with", None), ("without", False)):   # None: the terminal default (on)
            path = _train(data / "train", data / "val", work / "verifiers" / f"msv{n}-{variant}-seed{seed}",
                          training_config("msv", n, "terminal", cfg.quick, seed=seed, logit_averaging=averaging))
            scores, _, _ = score_problems(load_verifier(str(path)), problems, everyone, mode="terminal")
            acc = best_of_n_accuracy(groups, [s[r] for s, r in zip(scores, terminal_rows)])
            out[variant].append(acc)
            print(f"MSV_{n} {variant:>7} logit averaging, seed {seed}: best-of-{n} {acc:.4f}")
    for variant in ("with", "without"):
        v = np.asarray(out[variant])
        out[f"{variant}_mean"], out[f"{variant}_std"] = float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0
        print(f"{variant} averaging: {v.mean():.4f} ± {out[f'{variant}_std']:.4f} "
              f"({100 * (v.mean() - out['self_consistency']):+.1f} pp over self-consistency)")
    out |= {"collect_s": collected_s, "total_s": time.perf_counter() - started}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
