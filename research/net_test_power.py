"""How many calibration problems the net-loss test needs for a rule that moves outcomes both ways
(docs/pruning.md, "A learned regret clause and a support floor").

A pruning rule that loses no net accuracy but changes the output of a share c of the problems (c / 2 each way, net
mean d = 0) has per-problem net losses in {−1, 0, 1} with variance ≈ c. The guarantee certifies it when
`hf_msv.lambda_rule.net_loss_p_value` (the betting test `choose_jointly(loss="net")` runs) rejects
H0: E[loss] ≥ ε at the per-rule level δ / K. Simulated here, per (n, c, d): the share of draws it rejects (its power,
with a 95 % Wilson interval), beside a one-sided z-test's power (the normal approximation, which no finite-sample
guarantee reaches) and the n at which the z-test has 50 % and 80 % power. Each test of a rule's fixed sequence is
simulated alone: the rule is certified at a λ only if the tests from λ = ∞ down to it all pass.

``--study`` reads the calibration curve of each rule of a `research/pruning_study.py` JSON instead: per λ, the
losses and gains against full decoding on its calibration problems, and the power each test would have at 1,024,
3,072 and 6,144 problems if those rates held. Last line: JSON (also ``--output``).

    python research/net_test_power.py --output docs/results/net-test-power.json      # seconds
    python research/net_test_power.py --study docs/results/pruning-n64-floor.json \
        --output docs/results/net-test-power-n64-floor.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy.stats import binomtest, norm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from hf_msv.lambda_rule import net_loss_p_value

SIZES = (1024, 2048, 3072, 4096, 6144)
CHURNS = (0.036, 0.076)  # N = 64, head problems' table: steady 2 after 3 answers; the regret rule (per 1,024)
MEANS = (0.0, -0.002)


def power(n: int, churn: float, mean: float, epsilon: float, level: float, draws: int, seed: int) -> dict:
    """Rejection rate of `net_loss_p_value` over `draws` simulated calibration sets of `n` problems."""
    rng = np.random.default_rng(seed)
    up, down = churn / 2 + mean / 2, churn / 2 - mean / 2  # P(loss = 1), P(loss = −1)
    rejected = 0
    for draw in range(draws):
        losses = rng.choice(np.array([1.0, -1.0, 0.0]), size=n, p=[up, down, 1 - up - down])
        rejected += net_loss_p_value(losses, epsilon, level, seed=draw) <= level
    ci = binomtest(int(rejected), draws).proportion_ci(method="wilson")
    sd = math.sqrt(churn - mean**2)
    z = norm.sf(norm.isf(level) - (epsilon - mean) * math.sqrt(n) / sd)
    interval = [ci.low, ci.high]
    return {"n": n, "churn": churn, "mean": mean, "power": rejected / draws, "interval": interval, "z_power": z}


def z_problems(churn: float, mean: float, epsilon: float, level: float, target: float) -> int:
    """The n at which the z-test rejects with probability `target`."""
    sd = math.sqrt(churn - mean**2)
    return math.ceil(((norm.isf(level) + norm.isf(1 - target)) * sd / (epsilon - mean)) ** 2)


def study_rows(study: dict, sizes, epsilon: float, level: float, draws: int, seed: int) -> list[dict]:
    """Per rule and λ of a pruning study's calibration curves: losses, gains, churn, net and the power at `sizes`."""
    n = study["calibration_problems"]
    full = study["candidates"][0]["calibration_curve"][0]["accuracy"]  # no pruning at λ = ∞: full decoding
    rows = []
    for candidate in study["candidates"][1:]:
        for point in candidate["calibration_curve"]:
            losses = point["losses"]
            gains = losses + round((point["accuracy"] - full) * n)
            churn, mean = (losses + gains) / n, (losses - gains) / n
            at = {str(m): power(m, churn, mean, epsilon, level, draws, seed) for m in sizes}
            rows.append(
                {
                    "rule": candidate["describe"],
                    "lam": point["lam"],
                    "losses": losses,
                    "gains": gains,
                    "cot_fraction": point["cot_fraction"],
                    "power": {m: {"power": r["power"], "z_power": r["z_power"]} for m, r in at.items()},
                }
            )
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epsilon", type=float, default=0.01)
    parser.add_argument("--level", type=float, default=0.025, help="per-rule level: δ = 0.1 over K = 4 rules")
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2 sizes, 40 draws")
    parser.add_argument("--study", help="a research/pruning_study.py JSON: its rules' calibration curves")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    sizes, draws = (SIZES[:2], 40) if args.quick else (SIZES, args.draws)
    report = study_report(args, draws) if args.study else grid_report(args, sizes, draws)
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    return report


def study_report(args, draws: int) -> dict:
    study = json.loads(Path(args.study).read_text())
    rows = study_rows(study, (1024, 3072, 6144), args.epsilon, args.level, draws, args.seed)
    return {"study": args.study, "epsilon": args.epsilon, "level": args.level, "draws": draws, "rows": rows}


def grid_report(args, sizes, draws: int) -> dict:
    rows = [
        power(n, c, d, args.epsilon, args.level, draws, args.seed + i)
        for i, (n, c, d) in enumerate((n, c, d) for c in CHURNS for d in MEANS for n in sizes)
    ]
    needed = {
        f"churn={c},mean={d}": {f"z_{int(100 * t)}": z_problems(c, d, args.epsilon, args.level, t) for t in (0.5, 0.8)}
        for c in CHURNS
        for d in MEANS
    }
    return {"epsilon": args.epsilon, "level": args.level, "draws": draws, "rows": rows, "z_problems": needed}


if __name__ == "__main__":
    main()
