"""Is a re-made main collection the data the committed main study used? (split statistics against the report's)

Backs docs/testbed.md ("Reproducibility": collection is deterministic on one machine and nearly so across machines).

    python research/compare_main_collection.py --work-dir outputs/reproduce-v2 --splits train val eval

Compares each split's statistics (answers, accuracies, mean chain-of-thought length: exact counts,
`hf_msv.evaluation.split_statistics`) with the data block of the committed main results. A report continued on
another machine (`hf-msv reproduce --continue-report`) re-makes the main collection, whose shard fingerprints may
differ where CPU kernels round differently; this says by how much. Prints one line per split; the last line is JSON
({split: {"identical": bool, "differences": {stat: [ours, committed]}}}).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv=None) -> dict:
    from hf_msv.evaluation import load_split, split_statistics

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", default="outputs/reproduce-v2", help="the reproduction's work directory")
    ap.add_argument("--results", default="docs/results/testbed-v2-main.json", help="the committed main results")
    ap.add_argument("--splits", nargs="+", default=["val", "eval"], help="splits of <work-dir>/data to compare")
    args = ap.parse_args(argv)
    committed = json.loads(Path(args.results).read_text())["data"]
    out = {}
    for split in args.splits:
        problems, _ = load_split(Path(args.work_dir) / "data" / split, hidden=False)
        ours = split_statistics(problems)
        theirs = committed.get(split)
        diff = {k: [v, theirs.get(k)] for k, v in ours.items() if theirs is not None and theirs.get(k) != v}
        out[split] = {"identical": theirs is not None and not diff, "differences": diff, "statistics": ours}
        print(split, "no committed statistics" if theirs is None else "identical" if not diff else f"differs: {diff}")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
