"""Best-of-64 of terminal MSV_64 variants against self-consistency, on a fresh collection, over training seeds.

The testbed's C2 check (MSV_64 best-of-64 ≥ the best baseline + 2 pp; docs/results/testbed.md) is close to the
training-seed noise, so the README's statements about what moves it come from here. The script collects
``max(--sizes)`` training, 64 validation and 448 evaluation problems × 64 samples (the reproduction's settings),
trains terminal MSV_64 with the reproduction's recipe for every training-set size (the first k problems, nested),
logit-averaging setting and seed, and scores best-of-64 on every evaluation problem.

    # logit averaging on vs off, 3 seeds (~5 min on an H100)
    python scripts/best_of_64.py --device cuda --problems-per-batch 32 --averaging on off --seeds 3
    # more training problems than the reproduction's training-size study (~7 min on an H100)
    python scripts/best_of_64.py --device cuda --problems-per-batch 64 --sizes 896 224 --seeds 2

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
    parser.add_argument("--sizes", type=int, nargs="+", default=[224], help="training problems per model")
    parser.add_argument("--averaging", nargs="+", choices=("on", "off"), default=["on"],
                        help="logit averaging over equivalent answers (on: the paper's terminal MSV)")
    parser.add_argument("--seeds", type=int, default=1, help="training seeds per variant")
    parser.add_argument("--work-dir", default="outputs/best-of-64")
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
    from hf_msv.reproduction import ReproduceConfig, collect_splits, train_or_reuse, training_config

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = ReproduceConfig.quick_config() if args.quick else ReproduceConfig()
    cfg.problems_per_batch, cfg.train_problems = args.problems_per_batch, max(args.sizes)
    work, n = Path(args.work_dir), cfg.max_n
    data = work / "data"
    started = time.perf_counter()
    model, tokenizer = load_lm("testbed", device=args.device)
    collect_splits(model, tokenizer, data, cfg, cfg.num_samples, (cfg.train_problems, cfg.val_problems,
                                                                   cfg.eval_problems))
    del model
    out = {"collect_s": time.perf_counter() - started, "models": {}}

    problems, _ = load_split(data / "eval")
    chosen = [np.arange(n) for _ in problems]   # the first N sequences (all 64 at full size)
    groups = [answer_group(p, s, "terminal") for p, s in zip(problems, chosen)]
    rows = [select_answers(p, s, "terminal")[0] for p, s in zip(problems, chosen)]
    out["self_consistency"] = best_of_n_accuracy(groups, [self_consistency(g.klass, g.is_terminal) for g in groups])
    print(f"self-consistency best-of-{n}: {out['self_consistency']:.4f}", flush=True)
    for k in args.sizes:
        for averaging in args.averaging:
            name = f"{k} problems, averaging {averaging}"
            for seed in range(args.seeds):
                config = training_config("msv", n, "terminal", cfg.quick, seed=seed,
                                          max_train_problems=None if k == cfg.train_problems else k,
                                          logit_averaging=None if averaging == "on" else False)  # None: on
                path = train_or_reuse(data / "train", data / "val",
                                      work / "verifiers" / f"msv{n}-{k}-averaging-{averaging}-seed{seed}", config)
                scores, _, _ = score_problems(load_verifier(str(path)), problems, chosen, mode="terminal")
                acc = best_of_n_accuracy(groups, [s[r] for s, r in zip(scores, rows)])
                out["models"].setdefault(name, []).append(acc)
                print(f"MSV_{n}, {name}, seed {seed}: best-of-{n} {acc:.4f} "
                      f"({100 * (acc - out['self_consistency']):+.1f} pp over self-consistency)", flush=True)
            v = np.asarray(out["models"][name])
            print(f"MSV_{n}, {name}: {v.mean():.4f} ± {v.std(ddof=1) if v.size > 1 else 0.0:.4f}", flush=True)
    out["total_s"] = time.perf_counter() - started
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
