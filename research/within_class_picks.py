"""Why picking the single top-scored answer can lose to a vote: inside the class self-consistency picks.

Backs docs/testbed.md ("A top-scored pick can lose to the vote": the checker study's random-checker result).

    python research/within_class_picks.py --work-dir outputs/reproduce-v2 --checker random \\
        --verifiers probe-terminal msv1-terminal msv64-terminal-nolavg msv64-terminal-nolavg-random msv64-terminal

For each verifier it scores every terminal answer of the evaluation split (one group of all collected sequences per
problem, the checker's classes) and reports, over the problems whose picked class mixes right and wrong members,
``within_auroc`` (how well the verifier ranks right members above wrong ones inside that class) and
``max_member_right`` (how often the top-scored member is right) against ``first_member_right`` (self-consistency's
own pick). CPU, a few minutes on one thread. Prints one row per verifier; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def within_class_picks(verifier_dir: Path, eval_dir: Path, checker: str | None, checker_kwargs: dict) -> dict:
    """The three numbers of the module docstring for one verifier checkpoint on `eval_dir` under `checker`."""
    from hf_msv.baselines import best_of_n, self_consistency
    from hf_msv.data.dataset import ShardDataset
    from hf_msv.data.groups import answer_group
    from hf_msv.evaluation.scoring import score_problems
    from hf_msv.evaluation.verifiers import load_verifier
    from hf_msv.metrics import auroc

    dataset = ShardDataset(eval_dir, checker=checker, checker_kwargs=checker_kwargs)
    scores, _, _ = score_problems(load_verifier(verifier_dir), dataset, mode="terminal")
    within, max_right, first_right = [], [], []
    for p, s in enumerate(scores):
        g = answer_group(dataset.answer_columns(p), mode="terminal", scores={"s": s})
        s = g.scores["s"]
        first = best_of_n(self_consistency(g.klass, g.is_terminal), g.is_terminal)
        members = np.flatnonzero(g.is_terminal & (g.klass == g.klass[first]))
        y = g.correct[members]
        if 0 < y.sum() < len(y):  # a mixed class: the pick inside it matters
            within.append(auroc(s[members], y))
            max_right.append(g.correct[members[np.argmax(s[members])]])
            first_right.append(g.correct[first])
    mean = lambda x: float(np.mean(x)) if x else float("nan")  # no mixed class: nothing to compare
    return {
        "mixed_classes": len(within),
        "within_auroc": mean(within),
        "max_member_right": mean(max_right),
        "first_member_right": mean(first_right),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path("outputs/reproduce-v2"),
        help="a reproduction's work directory (data/eval, verifiers/)",
    )
    parser.add_argument("--checker", default="random", help="equivalence checker of the classes (default: random)")
    parser.add_argument("--verifiers", nargs="+", required=True, help="names under WORK_DIR/verifiers")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

    from hf_msv.reproduction import CHECKER_KWARGS

    torch.set_num_threads(args.threads)
    kwargs = CHECKER_KWARGS.get(args.checker, {})
    rows = {}
    for name in args.verifiers:
        rows[name] = r = within_class_picks(
            args.work_dir / "verifiers" / name, args.work_dir / "data" / "eval", args.checker, kwargs
        )
        print(
            f"{name}: within-class AUROC {r['within_auroc']:.3f} over {r['mixed_classes']} mixed classes; "
            f"top-scored member right {r['max_member_right']:.3f} vs first member {r['first_member_right']:.3f}",
            flush=True,
        )
    summary = {"checker": args.checker, "rows": rows}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
