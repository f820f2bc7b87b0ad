"""Where a pruning rule loses (docs/pruning.md): the groups full decoding gets right and the pruned run (no stop)
gets wrong, with the support of the right class and of the output class among the chains' final answers, with
and without pruning. Last line: JSON (also written to ``--output``).

    python research/pruning_losses.py --verifier runs64/msv16-n64 --data-dir runs64/val128 \
        --regret-head runs64/regret.json --rule regret=0.02
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `import research.…`

from hf_msv.pruning import PRUNE_OFF
from hf_msv.training.pruned_replay import replay_pruning, sweep_group
from research.pruning_study import parse_rule, read_regret, scored_groups  # the same rule syntax


def losses(groups, full, pruned, head) -> list[dict]:
    """One row per group full decoding gets right and the pruned stream gets wrong (both without a stop)."""
    never = np.array([np.inf])
    rows = []
    for group, a, b in zip(groups, full, pruned):
        right, wrong = sweep_group(group, a, head, never), sweep_group(group, b, head, never)
        if not (right.correct[0] and not wrong.correct[0]):
            continue
        support = lambda stream, k, g=group: int((g.klass[stream.final] == k).sum())
        correct_class, output_class = int(group.klass[group.correct][0]), int(group.klass[wrong.chosen[0]])
        rows.append(
            {
                "problem": group.problem_id,
                "right_class_support": {"full": support(a, correct_class), "pruned": support(b, correct_class)},
                "output_class_support": {"full": support(a, output_class), "pruned": support(b, output_class)},
                "pruned_chains": int((b.cut < group.seq_len).sum()),
            }
        )
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--rule", required=True, help="e.g. regret=0.02,min_answers=2")
    parser.add_argument("--regret-head", default=None, help="the RegretHead JSON of research/fit_regret.py")
    parser.add_argument("--max-problems", type=int, default=None)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    rule = parse_rule(args.rule, read_regret(args.regret_head))
    _, head, groups, scorer, scores = scored_groups(args.verifier, args.data_dir, args.max_problems)
    full = replay_pruning(PRUNE_OFF, head, groups, scorer, scores)
    rows = losses(groups, full, replay_pruning(rule, head, groups, scorer, scores), head)
    small = [r for r in rows if r["output_class_support"]["pruned"] < r["right_class_support"]["pruned"]]
    out = {
        "rule": rule.describe(),
        "min_share": head.min_share,
        "groups": len(groups),
        "lost": len(rows),
        "lost_to_a_class_fewer_chains_hold": len(small),
        "output_class_support_median": float(np.median([r["output_class_support"]["pruned"] for r in rows]))
        if rows
        else None,
        "rows": rows,
    }
    if args.output:
        Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
