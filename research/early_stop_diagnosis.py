"""Why MSV_N reaches a weighted vote's peak accuracy only near full decoding (docs/msv_vote_pathway.md).

Usage:
    python research/early_stop_diagnosis.py --work-dir outputs/reproduce-v2 [--seed 0] [--ns 16 64] [--out r.json]

Scoring settings (R of streaming weighted voting, DeepConf's window and statistic) are read from the main study's
evaluation report in the work directory, so the groups and scores are the report's.

Scores the main study's evaluation groups (streaming answers) with one training seed's MSV_N and MSV_1 (for
MSV_1+WV), replays the stop rule over the λ sweep and, at matched mean stopping positions t*, splits each method's
groups by what full decoding would have given: how often a rule stops on a wrong answer that full decoding gets
right, how many answers backed that answer's class when it stopped, how early a correct answer is available at all,
and what a stopper that knew the gold answer would need.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from hf_msv.data import AnswerGroup, ShardDataset
from hf_msv.evaluation.config import MethodConfig
from hf_msv.evaluation.early_stop import LAMBDAS, early_stop_token_fraction, replay_many, tradeoff_curve
from hf_msv.evaluation.methods import draw_scores, method_plan, prepare_split, with_verifiers
from hf_msv.evaluation.verifiers import load_verifier_seeds


def replays(groups, method: str, lambdas) -> dict:
    """Per group and λ: stopped, correct, chosen, steps; plus each group's full-decoding outcome (a λ never
    reached)."""
    runs = [replay_many(g, g.scores[method], list(lambdas) + [np.inf]) for g in groups]
    stack = {k: np.stack([getattr(r, k) for r in runs]) for k in ("stopped", "correct", "chosen", "steps")}
    return {k: v[:, :-1] for k, v in stack.items()} | {
        "full_correct": stack["correct"][:, -1],
        "full_steps": stack["steps"][:, -1],
    }


def budget_index(r: dict, budget: float) -> int:
    """Index of the λ whose mean t* is closest to `budget` from below (the cheapest λ when none is)."""
    mean_steps = r["steps"].mean(0)
    ok = np.flatnonzero(mean_steps <= budget)
    return int(ok[np.argmax(mean_steps[ok])]) if ok.size else int(np.argmin(mean_steps))


def at_budget(r: dict, budget: float, lambdas) -> dict:
    """At the λ of `budget_index`: accuracy, and how the groups split by full-decoding outcome."""
    j = budget_index(r, budget)
    mean_steps = r["steps"].mean(0)
    hopeless = ~r["full_correct"]
    steps, stopped = r["steps"][:, j].astype(float), r["stopped"][:, j]
    return {
        "lambda": float(lambdas[j]),
        "mean_steps": float(mean_steps[j]),
        "accuracy": float(r["correct"][:, j].mean()),
        "accuracy_when_stopped": float(r["correct"][stopped, j].mean()) if stopped.any() else float("nan"),
        "full_accuracy": float(r["full_correct"].mean()),
        "stop_rate_right_at_full": float(stopped[~hopeless].mean()),
        "stop_rate_wrong_at_full": float(stopped[hopeless].mean()) if hopeless.any() else float("nan"),
        "steps_share_wrong_at_full": float(steps[hopeless].sum() / steps.sum()),
        "lost_by_stopping": float((r["full_correct"] & ~r["correct"][:, j]).mean()),
    }


def costly_stops(groups, r: dict, j: int) -> dict:
    """At λ index `j` of the `replays` `r` of `groups`: the groups stopped on a wrong answer that full decoding gets
    right, their share, and the median number of answers in the stopped answer's class (and available in all)
    when the rule stopped."""
    support, available = [], []
    costly = r["stopped"][:, j] & ~r["correct"][:, j] & r["full_correct"]
    for i in np.flatnonzero(costly):
        g, chosen = groups[i], r["chosen"][i, j]
        seen = g.end <= r["steps"][i, j]
        support.append(int((seen & (g.klass == g.klass[chosen])).sum()))
        available.append(int(seen.sum()))
    return {
        "share_of_groups": len(support) / len(groups),
        "median_class_support": float(np.median(support)) if support else float("nan"),
        "median_available": float(np.median(available)) if available else float("nan"),
    }


def evidence_at(groups, step: float) -> dict:
    """How often a correct answer is available at all at one fixed step."""
    available = [bool((g.correct & (g.end <= step)).any()) for g in groups]
    return {"step": float(step), "correct_available": float(np.mean(available))}


def clairvoyant_steps(groups, target: float) -> float:
    """Least mean t* with which a stopper that knows the gold answer reaches accuracy `target`: it stops each group
    at its first correct answer, the cheapest groups first, and every other group at its first answer."""
    first = np.array([g.end.min() for g in groups], dtype=float)
    solve = np.array([g.end[g.correct].min() if g.correct.any() else np.inf for g in groups], dtype=float)
    k = int(np.ceil(target * len(groups)))
    order = np.argsort(solve - first)
    cost = first.copy()
    cost[order[:k]] = solve[order[:k]]
    return float(cost.mean())


def class_mean_scores(g: AnswerGroup, method: str) -> np.ndarray:
    """(A,) each answer's score replaced, at its arrival, by the mean logit of its class's answers so far (causal):
    a stop rule on this cannot fire on one answer's upward noise."""
    s = np.clip(g.scores[method], 1e-6, 1 - 1e-6)
    logit = np.log(s / (1 - s))
    out = np.empty_like(logit)
    for a in range(len(s)):
        same = (g.klass == g.klass[a]) & (g.end <= g.end[a])
        out[a] = logit[same].mean()
    return 1 / (1 + np.exp(-out))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work-dir", required=True, help="hf-msv reproduce's --work-dir (data/ and verifiers/)")
    ap.add_argument("--seed", type=int, default=0, help="training seed of the verifiers (0, 1, 2)")
    ap.add_argument("--ns", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    work = Path(args.work_dir)
    tail = "" if args.seed == 0 else f"-seed{args.seed}"
    report = json.loads((work / "evaluations" / "testbed-v2-main" / "testbed-v2-main.json").read_text())["config"]
    method_config = MethodConfig(report["wv_threshold"], report["deepconf_window"], report["deepconf_stat"])
    split = prepare_split(ShardDataset(work / "data" / "eval"), method_config)
    out = {}
    for n in args.ns:
        specs = {
            "MSV_1": {"streaming": str(work / "verifiers" / f"msv1-streaming{tail}")},
            f"MSV_{n}": {"streaming": str(work / "verifiers" / f"msv{n}-streaming{tail}")},
        }
        entries = load_verifier_seeds(specs)[0]
        scored = with_verifiers(split, entries)
        plan = method_plan(entries, n, "streaming", scored)
        groups = draw_scores(scored, n, "streaming", plan, method_config).groups
        msv = f"MSV_{n}"
        for g in groups:
            g.scores[f"{msv} (class mean)"] = class_mean_scores(g, msv)
        r = {m: replays(groups, m, LAMBDAS) for m in (msv, "MSV_1+WV")}
        curves = {
            m: tradeoff_curve(groups, m)
            for m in (msv, f"{msv} (class mean)", "MSV_1+WV", "Probe+WV")
            if m in groups[0].scores
        }
        full_steps = r["MSV_1+WV"]["full_steps"].mean()
        out[n] = {
            f"{frac:.2f} of full t*": {m: at_budget(v, frac * full_steps, LAMBDAS) for m, v in r.items()}
            for frac in (0.3, 0.4, 0.5, 0.6)
        }
        out[n]["costly stops at half of full t*"] = {
            m: costly_stops(groups, v, budget_index(v, 0.5 * full_steps)) for m, v in r.items()
        }
        out[n]["evidence"] = {
            f"{frac:.2f} of full t*": evidence_at(groups, frac * full_steps) for frac in (0.3, 0.5, 0.7, 1.0)
        }
        out[n]["t* fraction to reach MSV_1+WV's peak"] = {
            m: early_stop_token_fraction(c, curves["MSV_1+WV"], x="steps") for m, c in curves.items()
        }
        out[n]["peak accuracy"] = {m: float(c.accuracy.max()) for m, c in curves.items()}
        target = float(r["MSV_1+WV"]["full_correct"].mean())
        out[n]["clairvoyant"] = {
            "target": target,
            "mean_steps": clairvoyant_steps(groups, target),
            "full_steps": float(full_steps),
        }
        print(json.dumps({n: out[n]}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
