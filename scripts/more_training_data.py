"""Best-of-64 of terminal MSV_64 trained on more problems than the reproduction's training-size study (448), against
self-consistency on the same evaluation set.

The study (docs/results/testbed.md, section 9) shows MSV_64's best-of-64 gain over the best baseline growing with
training problems (56 → 448: −2.8 → +1.8 pp) while the Probe plateaus. This checks the next doubling on a fresh
collection: the first k of `--train-problems` training problems (nested), 64 validation and 448 evaluation problems
× 64 samples, the reproduction's recipe, `--seeds` training seeds per size.

    python scripts/more_training_data.py --device cuda --problems-per-batch 64 --sizes 224 896   # ~9 min, H100

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
    parser.add_argument("--sizes", type=int, nargs="+", default=[224, 896], help="training problems per model")
    parser.add_argument("--seeds", type=int, default=1, help="training seeds per size")
    parser.add_argument("--work-dir", default="outputs/more-training-data")
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
    cfg.problems_per_batch, cfg.train_problems = args.problems_per_batch, max(args.sizes)
    work, n = Path(args.work_dir), cfg.max_n
    data = work / "data"
    started = time.perf_counter()
    model, tokenizer = load_lm("testbed", device=args.device)
    _collect_splits(model, tokenizer, data, cfg, cfg.num_samples, (cfg.train_problems, cfg.val_problems,
                                                                    cfg.eval_problems))
    del model
    out = {"collect_s": time.perf_counter() - started, "sizes": {}}

    problems, _ = load_split(data / "eval")
    everyone = [np.arange(n) for _ in problems]
    groups = [answer_group(p, s, "terminal") for p, s in zip(problems, everyone)]
    out["self_consistency"] = best_of_n_accuracy(groups, [self_consistency(g.klass, g.is_terminal) for g in groups])
    print(f"self-consistency best-of-{n}: {out['self_consistency']:.4f}", flush=True)
    terminal_rows = [select_answers(p, s, "terminal")[0] for p, s in zip(problems, everyone)]
    for k in args.sizes:
        for seed in range(args.seeds):
            limit = None if k == cfg.train_problems else k
            path = _train(data / "train", data / "val", work / "verifiers" / f"msv{n}-terminal-{k}-seed{seed}",
                          training_config("msv", n, "terminal", cfg.quick, seed=seed,
                                                          max_train_problems=limit))
            scores, _, _ = score_problems(load_verifier(str(path)), problems, everyone, mode="terminal")
            acc = best_of_n_accuracy(groups, [s[r] for s, r in zip(scores, terminal_rows)])
            out["sizes"].setdefault(str(k), []).append(acc)
            print(f"MSV_{n} on {k} problems, seed {seed}: best-of-{n} {acc:.4f} "
                  f"({100 * (acc - out['self_consistency']):+.1f} pp over self-consistency)", flush=True)
    out["total_s"] = time.perf_counter() - started
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
