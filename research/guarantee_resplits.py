"""The early-stopping guarantee tested as a guarantee (docs/early_stopping.md, "The guarantee on new problems").

The whole pipeline `hf-msv train` runs after training, repeated over random re-splits of a pool of problems: the stop
head (and its cross-validated penalties) fitted on ``--head`` problems, λ chosen by Learn-then-Test at ε, δ on
``--calibration`` other problems (`hf_msv.training.stopping_curve.fit_early_stopping`'s steps), and the chosen λ
scored on every remaining problem. The risk of a re-split is its chosen λ's loss against full decoding on those
held-out problems (1[full decoding right ∧ stopped answer wrong], averaged): with ≥ 2,000 of them it stands for the
population's. Learn-then-Test promises P(risk > ε) ≤ δ over the draw of the calibration problems; the re-splits
estimate that probability (the violation rate) with its Monte-Carlo (Clopper-Pearson) interval.

The verifier's per-answer probabilities and every group's class snapshots are computed once: they do not depend on
the split. Last line: JSON (also written to ``--output``).

    python research/guarantee_resplits.py --verifier hf_msv/testbed/verifier --pool runs/pool runs/val256 \
        --resplits 200 --epsilon 0.01 --output docs/results/guarantee-resplits.json
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import expit
from scipy.stats import beta

from hf_msv import MSVVerifier
from hf_msv.data import ShardDataset
from hf_msv.generation import decide_stop
from hf_msv.lambda_rule import LAMBDAS, choose_lambda, lambda_index, problems_needed
from hf_msv.stop_rules import fit_stop_rule
from hf_msv.training.stopping_curve import stop_head_events
from hf_msv.training.trainer import validation_predictions


@dataclass(frozen=True)
class Pool:
    """Every pooled problem's groups, with the per-group pieces a re-split needs (lists indexed by group)."""

    problem: np.ndarray  # (G,) problem of each group
    events: list  # per group: ValidationEvents rows
    labels: list  # per group: (E,) correctness of each row's answer
    lengths: list  # per group: chain lengths
    event_problem: np.ndarray  # (E_total,) problem of each snapshot row
    all_events: object  # ValidationEvents of every group
    all_labels: np.ndarray


def load_pool(verifier: MSVVerifier, directories: list[str], batch_size: int) -> Pool:
    n = verifier.config.num_sequences
    events, labels, lengths, problem = [], [], [], []
    rows_all, labels_all, problems_all = [], [], []
    offset = 0
    for directory in directories:
        dataset = ShardDataset(directory, num_sequences=n, mode="streaming")
        predictions = validation_predictions(verifier, dataset, "streaming", batch_size)
        structure = {key: np.asarray(value) for key, value in predictions.structure.items()}
        structure["group"] = structure["group"] + offset
        offset = int(structure["group"].max()) + 1
        ev = stop_head_events(expit(predictions.logits), structure, n)
        for g in np.unique(structure["group"]):
            rows = np.flatnonzero(structure["group"] == g)
            mine = np.flatnonzero(ev.group == g)
            end, sequence = structure["end"][rows], structure["sequence"][rows]
            events.append(ev.take(mine))
            labels.append(predictions.labels[ev.answer[mine]] > 0.5)
            lengths.append(np.array([end[sequence == s].max() for s in np.unique(sequence)]))
            problem.append(str(predictions.problems[rows[0]]))
        rows_all.append(ev)
        labels_all.append(predictions.labels[ev.answer] > 0.5)
        problems_all.append(np.asarray(predictions.problems)[ev.answer].astype(str))
    from hf_msv.training.stopping_curve import ValidationEvents

    merged = ValidationEvents(
        *(np.concatenate([getattr(e, f) for e in rows_all]) for f in ValidationEvents.__dataclass_fields__)
    )
    return Pool(
        np.asarray(problem), events, labels, lengths, np.concatenate(problems_all), merged, np.concatenate(labels_all)
    )


def replay(pool: Pool, groups: np.ndarray, head) -> tuple[np.ndarray, np.ndarray]:
    """(G, Λ) correct and tokens of `head`'s rule on `groups`."""
    correct, tokens = [], []
    for g in groups:
        ev = pool.events[g]
        d = decide_stop(ev.time, head.predict(ev.features), ev.terminal, LAMBDAS, head.confidence(ev.features), True)
        correct.append(np.where(d.chosen >= 0, pool.labels[g][np.maximum(d.chosen, 0)], False))
        tokens.append(np.minimum(d.stop_step[:, None], pool.lengths[g][None, :]).sum(1))
    return np.asarray(correct), np.asarray(tokens)


def one_resplit(pool: Pool, rng, args) -> dict:
    problems = rng.permutation(np.unique(pool.problem))
    head_p = problems[: args.head]
    cal_p = problems[args.head : args.head + args.calibration]
    held_p = problems[args.head + args.calibration :]
    rows = np.isin(pool.event_problem, head_p)
    ev = pool.all_events.take(rows)
    fit = fit_stop_rule(
        ev.features, pool.all_labels[rows], ev.group, ev.time, ev.terminal, pool.event_problem[rows],
        args.num_chains, args.statistic,
    )  # fmt: skip
    cal_g = np.flatnonzero(np.isin(pool.problem, cal_p))
    correct, tokens = replay(pool, cal_g, fit.head)
    choice = choose_lambda(LAMBDAS, correct, tokens, pool.problem[cal_g], epsilon=args.epsilon, delta=args.delta)
    held_g = np.flatnonzero(np.isin(pool.problem, held_p))
    j = lambda_index(choice.lam)
    c_held, t_held = replay(pool, held_g, fit.head)
    loss = c_held[:, -1] & ~c_held[:, j]
    return {
        "lam": None if math.isinf(choice.lam) else choice.lam,
        "certified": choice.reached,
        "risk": float(loss.mean()),
        "held_out_accuracy": float(c_held[:, j].mean()),
        "held_out_full_accuracy": float(c_held[:, -1].mean()),
        "held_out_token_fraction": float(t_held[:, j].mean() / t_held[:, -1].mean()),
    }


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    a = (1 - level) / 2
    low = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return low, high


def summarise(runs: list[dict], args, pool_size: int) -> dict:
    risk = np.array([r["risk"] for r in runs])
    violations = int((risk > args.epsilon).sum())
    n = len(runs)
    se = risk.std(ddof=1) / math.sqrt(n)
    # Re-splits needed for the Monte-Carlo interval of the violation rate to have half-width 0.03 at rate δ.
    needed = math.ceil((1.96 / 0.03) ** 2 * args.delta * (1 - args.delta))
    return {
        "resplits": n,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "statistic": args.statistic,
        "head_problems": args.head,
        "calibration_problems": args.calibration,
        "held_out_problems": pool_size - args.head - args.calibration,
        "problems_needed_without_loss": problems_needed(args.epsilon, args.delta),
        "violation_rate": violations / n,
        "violation_rate_interval": clopper_pearson(violations, n),
        "resplits_for_a_0.03_interval": needed,
        "mean_risk": float(risk.mean()),
        "mean_risk_interval": (float(risk.mean() - 1.96 * se), float(risk.mean() + 1.96 * se)),
        "certified_rate": float(np.mean([r["certified"] for r in runs])),
        "mean_held_out_token_fraction": float(np.mean([r["held_out_token_fraction"] for r in runs])),
        "mean_held_out_accuracy": float(np.mean([r["held_out_accuracy"] for r in runs])),
        "mean_held_out_full_accuracy": float(np.mean([r["held_out_full_accuracy"] for r in runs])),
        "seed": args.seed,
        "runs": runs,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", required=True, help="a streaming MSV directory")
    parser.add_argument("--pool", nargs="+", required=True, help="shard directories of distinct problems")
    parser.add_argument("--resplits", type=int, default=200)
    parser.add_argument("--head", type=int, default=256, help="problems the stop head is fitted on")
    parser.add_argument("--calibration", type=int, default=1024, help="problems λ is chosen on")
    parser.add_argument("--epsilon", type=float, default=0.01)
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--statistic", default="no-loss")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    verifier = MSVVerifier.from_pretrained(args.verifier).eval()
    args.num_chains = verifier.config.num_sequences
    pool = load_pool(verifier, args.pool, args.batch_size)
    size = np.unique(pool.problem).size
    if size <= args.head + args.calibration:
        parser.error(f"the pool holds {size} problems: none left out of --head + --calibration")
    rng = np.random.default_rng(args.seed)
    runs = []
    for i in range(args.resplits):
        runs.append(one_resplit(pool, rng, args))
        if (i + 1) % 10 == 0:
            print(f"{i + 1} re-splits, violations so far {sum(r['risk'] > args.epsilon for r in runs)}", flush=True)
    out = summarise(runs, args, size)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}))
    return out


if __name__ == "__main__":
    main()
