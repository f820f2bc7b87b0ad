"""A support floor for the group stop at low budgets (docs/pruning.md, "The default against the field's rules").

At a low λ the stop head fires on a class few chains hold. This replays the verifier's certified pruning rule
exactly (`replay_pruning`) and the group stop over the λ grid with a floor: a class snapshot can stop the group only
when at least k chains' latest answers are in the class (its stop statistic counts as 0 below it; it stays a
candidate output); the output is the current class of highest confidence (the library's choice) or the class
whose floored statistic is highest (the class that stopped the group). Per k and output: accuracy and CoT token
fraction of full decoding's over λ, and the interpolated curve (upper hull) at 30 / 50 / 70 %. Last line: JSON
(also ``--output``).

    python research/stop_support_floor.py --verifier hf_msv/testbed/verifier --data runs/pool \
        --output runs/support-floor.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from hf_msv import MSVVerifier
from hf_msv.evaluation.early_stop import TradeoffCurve, interpolated_curve
from hf_msv.generation import decide_stop
from hf_msv.lambda_rule import LAMBDAS
from hf_msv.pruning import PRUNE_OFF, PruneRule, held_answers
from hf_msv.stop_rules import StopHead, stop_events
from hf_msv.training.pruned_replay import MSVGroupScorer, load_replay_groups, replay_pruning

FLOORS = (1, 2, 3, 4)
BUDGETS = (0.3, 0.5, 0.7)


def snapshots(group, stream, head):
    """The class snapshots of a pruned stream (held answers count) and each row's support: the chains whose latest
    available answer at the row's time is in its class."""
    k = np.flatnonzero(stream.keep)
    seq, step, end, klass = group.sequence[k], group.step[k], group.end[k], group.klass[k]
    ev = stop_events(head, klass, seq, step, end, group.num_chains, stream.scores[k], times=np.unique(end))
    support = np.zeros(ev.time.size, np.int64)
    for t in np.unique(ev.time):
        held, _ = held_answers(int(t), seq, step, end, group.num_chains)
        classes = klass[held[held >= 0]]
        rows = np.flatnonzero(ev.time == t)
        support[rows] = [(classes == c).sum() for c in ev.klass[rows]]
    return ev, k, support


def sweep(group, stream, head, floor: int, output: str = "confidence"):
    """(Λ,) correct and CoT tokens, the stop applied with the floor; the output is the
    current class of highest confidence (the library's) or of highest floored statistic (the class that stopped)."""
    ev, k, support = snapshots(group, stream, head)
    statistic = np.where(support >= floor, ev.statistic, 0.0)
    select = ev.confidence if output == "confidence" else statistic + 1e-6 * ev.confidence  # ties: confidence
    d = decide_stop(ev.time, statistic, stream.final[k][ev.answer], LAMBDAS, select, snapshots=True)
    chosen = np.where(d.chosen >= 0, k[ev.answer[np.maximum(d.chosen, 0)]], -1)
    correct = np.where(chosen >= 0, group.correct[np.maximum(chosen, 0)], False)
    cuts = np.where(d.stopped[:, None], np.minimum(stream.cut[None, :], d.stop_step[:, None]), stream.cut[None, :])
    cot = np.minimum(cuts, group.seq_len[None, :]).sum(1)
    return correct, cot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", default="hf_msv/testbed/verifier")
    parser.add_argument("--data", required=True, help="collected shards (problems the stop head was not fitted on)")
    parser.add_argument("--max-problems", type=int, default=None)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    verifier = MSVVerifier.from_pretrained(args.verifier).eval()
    head, rule = StopHead.of(verifier.config), PruneRule.of(verifier.config)
    assert head is not None
    head = head.at(
        math.inf
    )  # the plain head: these figures are the certified λ's and above, where a floor below a switch is off
    groups = load_replay_groups(args.data, head.num_chains, args.max_problems)
    scorer = MSVGroupScorer(verifier)
    scores = scorer(groups, [np.ones(g.sequence.size, bool) for g in groups])
    streams = replay_pruning(rule, head, groups, scorer, scores)
    # Full decoding (no pruning, no stop) closes every curve: the budgets are fractions of its tokens.
    off = replay_pruning(PRUNE_OFF, head, groups, scorer, scores)
    full_correct = float(np.mean([sweep(g, s, head, 1)[0][-1] for g, s in zip(groups, off)]))
    full = float(np.mean([g.seq_len.sum() for g in groups]))
    lambdas = np.r_[LAMBDAS[:-1], 2.0, np.inf]  # 2.0: the rule alone (λ = ∞ with pruning); ∞: full decoding
    out = {"verifier": args.verifier, "data": args.data, "problems": len(groups), "rule": rule.describe()}
    out["floors"] = []
    for floor, output in [(f, "confidence") for f in FLOORS] + [(f, "statistic") for f in FLOORS]:
        parts = [sweep(g, s, head, floor, output) for g, s in zip(groups, streams)]
        correct = np.r_[np.stack([p[0] for p in parts]).mean(0), full_correct]
        cot = np.r_[np.stack([p[1] for p in parts]).mean(0), full]
        zero = np.zeros_like(cot)
        hull = interpolated_curve(TradeoffCurve(lambdas, correct, cot, zero, zero, zero))
        out["floors"].append(
            {
                "floor": floor,
                "output": output,
                "interpolated_accuracy": {f"{b:g}": hull.at(b) for b in BUDGETS},
                "curve": {"accuracy": correct.tolist(), "cot_fraction": (cot / full).tolist()},
            }
        )
        print(json.dumps({"floor": floor, "output": output} | out["floors"][-1]["interpolated_accuracy"]), flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps(out, default=float) + "\n")
    hulls = [{"floor": f["floor"], "output": f["output"], **f["interpolated_accuracy"]} for f in out["floors"]]
    print(json.dumps({k: v for k, v in out.items() if k != "floors"} | {"hulls": hulls}))


if __name__ == "__main__":
    main()
