"""Streaming verifiers compared at their deployable stopping rule (docs/early_stopping.md "What the Multi-Mask block
adds" and docs/vllm.md "Choosing an elicitation schedule").

Each variant is a trained streaming MSV with its validation and evaluation collections (an elicitation schedule is
a variant whose collections were respaced with ``hf-msv respace``; training seeds are variants sharing a name before
``/``). Per variant, as ``hf-msv train`` does: the stop head and λ are fitted on validation (`fit_early_stopping`:
the ε-guaranteed λ when the split certifies it, else the target rule's), then replayed on evaluation. Printed:
full-decoding accuracy (the best terminal answer), the best accuracy within 30 / 50 / 70 % of full decoding's
tokens, the deployed λ's accuracy, tokens and stop-time calibration, answers per chain and elicitation tokens
(prompt + answer) per chain-of-thought token. Each named variant is compared with the first one on the same
evaluation problems: per-problem correctness averaged over its seeds, paired 95 % bootstrap over problems.
``--rules-from NAME`` adds the field's training-free stopping rules (`hf_msv.stop_rules.STOP_RULES`: consensus of the
chains' latest answers, Adaptive-Consistency, probe stability) replayed on that variant's collections, their λ
chosen on validation the same way; ``--reference NAME [NAME ...]`` are the groups the others are compared with
(default: the first). A variant ending in ``,correctness-head`` fits the head that fires on "the class is correct"
(``hf-msv train --stop-statistic correctness``) instead of the default "stopping loses nothing against full
decoding". With
``--save DIR``, each seed's verifier is written there with its fitted stopping rule (for the vLLM benchmark). Last
line: JSON.

    python research/verifier_variants.py --epsilon 0.02 \
        --variant block/s0=runs/msv16,runs/val,runs/eval --variant no-block/s0=runs/noblock,runs/val,runs/eval
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from scipy.special import expit

from hf_msv import MSVVerifier
from hf_msv.data import ShardDataset, list_shards, read_shard
from hf_msv.lambda_rule import LAMBDAS, choose_lambda, lambda_index
from hf_msv.metrics import paired_bootstrap
from hf_msv.stop_rules import STOP_RULES, stop_statistic
from hf_msv.training.stopping_curve import fit_early_stopping, group_rows, replay_groups, stop_head_features
from hf_msv.training.trainer import validation_predictions

BUDGETS = (0.3, 0.5, 0.7)


def predictions(verifier, directories: str):
    """The verifier's streaming predictions on the groups of N of `directories` (``a+b`` joins collections)."""
    data = ShardDataset(directories.split("+"), num_sequences=verifier.config.num_sequences, mode="streaming")
    return validation_predictions(verifier, data, "streaming")


@functools.cache  # one read per collection, however many variants and rules replay on it
def elicitation_cost(directories: str) -> dict:
    """Answers per chain and elicited tokens (prompt + answer: ``end − τ``) per chain-of-thought token."""
    answers = chains = elicited = cot = 0
    for path in list_shards(directories.split("+")):
        for p in read_shard(path, hidden=False)[0]:
            answers, chains = answers + p.num_answers, chains + p.num_sequences
            elicited += int((p.answer_end - p.answer_tau).sum())
            cot += int(p.sequence_length.sum())
    return {"answers_per_chain": answers / chains, "elicited_tokens_per_cot_token": elicited / cot}


def per_problem(replay, column: int) -> dict:
    """Problem → correctness at LAMBDAS[column] (one group per problem at N = the collection's samples)."""
    return {str(q): float(c) for q, c in zip(replay.problem, replay.correct[:, column])}


def budget_column(replay, fraction: float) -> int:
    """The λ column with the best accuracy within `fraction` of full decoding's tokens."""
    accuracy, tokens = replay.correct.mean(0), replay.tokens.mean(0)
    allowed = np.flatnonzero(tokens <= fraction * tokens[-1] + 1e-9)
    return int(allowed[np.argmax(accuracy[allowed])])


def outcome(replay, choice, eval_dir) -> dict:
    """A stopping rule's figures on evaluation at the λ of `choice` (a `LambdaChoice`)."""
    lam = choice.lam
    j = lambda_index(lam)
    tokens = replay.tokens.mean(0)
    columns = {"full": LAMBDAS.size - 1, "deployed": j} | {f"{f:.0%}": budget_column(replay, f) for f in BUDGETS}
    return {
        "lambda": None if math.isinf(lam) else float(lam),
        "rule": choice.describe(),
        "certified": bool(choice.epsilon is not None and choice.reached),
        "accuracy": {name: float(replay.correct[:, c].mean()) for name, c in columns.items()},
        "tokens": float(tokens[j] / tokens[-1]),
        "at_stop": replay.at_stop(lam),
        **elicitation_cost(eval_dir),
        "_correct": {name: per_problem(replay, c) for name, c in columns.items()},
    }


def run_variant(
    verifier_dir, val_dir, eval_dir, epsilon, delta, save=None, correctness_head=False
) -> tuple[dict, tuple]:
    """A verifier's stopping rule fitted on validation and replayed on evaluation; also returns both splits'
    predictions (their group structure is what the training-free rules replay on)."""
    verifier = MSVVerifier.from_pretrained(verifier_dir).eval()
    n = verifier.config.num_sequences
    val, ev = predictions(verifier, val_dir), predictions(verifier, eval_dir)
    statistic = "correctness" if correctness_head else "no-loss"
    fit = fit_early_stopping(val, n, epsilon, delta, statistic=statistic)  # computes the validation features itself
    if save is not None:
        verifier.config.early_stopping = fit.config_entry()
        verifier.save_pretrained(save)
    xe = stop_head_features(expit(ev.logits), ev.structure, n)
    replay = replay_groups(fit.head.predict(xe), ev.labels, ev.structure, ev.problems, fit.head.confidence(xe))
    return outcome(replay, fit.choice, eval_dir) | {"penalty": fit.penalty.penalty}, (val, ev, n)


def rule_replay(rule: str, found, n: int):
    """A training-free rule's statistic replayed on one split's groups."""
    st = found.structure
    stat = np.zeros(len(found.labels))
    for rows in group_rows(st):
        stat[rows] = stop_statistic(
            rule, st["klass"][rows], st["sequence"][rows], st["step"][rows], st["end"][rows], n
        )
    return replay_groups(stat, found.labels, st, found.problems)


def run_rule(rule: str, splits: tuple, eval_dir: str, epsilon: float, delta: float) -> dict:
    """A training-free rule with its λ chosen on validation as the verifiers' is (the guarantee when certified)."""
    val, ev, n = splits
    rv = rule_replay(rule, val, n)
    guarantee = choose_lambda(LAMBDAS, rv.correct, rv.tokens, rv.problem, epsilon=epsilon, delta=delta)
    choice = guarantee if guarantee.reached else choose_lambda(LAMBDAS, rv.correct, rv.tokens, rv.problem)
    return outcome(rule_replay(rule, ev, n), choice, eval_dir)


def compare(group: list[dict], reference: list[dict]) -> dict:
    """Paired differences of seed-averaged per-problem correctness, per column."""
    out = {}
    for name in group[0]["_correct"]:
        problems = sorted(group[0]["_correct"][name])
        a = np.mean([[r["_correct"][name][q] for q in problems] for r in group], 0)
        b = np.mean([[r["_correct"][name][q] for q in problems] for r in reference], 0)
        d = paired_bootstrap(a, b)
        out[name] = [d["estimate"], d["low"], d["high"]]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--variant",
        action="append",
        required=True,
        help="NAME[/SEED]=VERIFIER,VAL_DIR,EVAL_DIR[,correctness-head] (DIR: a+b joins; correctness-head: the "
        "one-part head that fires on its confidence)",
    )
    parser.add_argument("--epsilon", type=float, default=0.02)
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--save", default=None, help="write each verifier with its fitted stopping rule here")
    parser.add_argument("--rules-from", default=None, help="add the training-free rules on this variant's data")
    parser.add_argument("--reference", nargs="+", default=None, help="the groups compared with (default: the first)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = defaultdict(list)
    for spec in args.variant:
        label, paths = spec.split("=", 1)
        verifier_dir, val_dir, eval_dir, *kind = paths.split(",")
        save = None if args.save is None else Path(args.save) / label.replace("/", "-")
        correctness = kind == ["correctness-head"]
        result, splits = run_variant(verifier_dir, val_dir, eval_dir, args.epsilon, args.delta, save, correctness)
        found = [(label, result)]
        if args.rules_from == label.split("/")[0] and not any(r in runs for r in STOP_RULES):
            found += [(rule, run_rule(rule, splits, eval_dir, args.epsilon, args.delta)) for rule in STOP_RULES]
        for label, result in found:
            runs[label.split("/")[0]].append(result)
            show(label, result)
    names = list(runs)
    references = args.reference or names[:1]
    summary = {}
    for name in names:
        group = runs[name]
        summary[name] = {
            "seeds": len(group),
            "mean": {k: float(np.mean([r["accuracy"][k] for r in group])) for k in group[0]["accuracy"]},
            "tokens": float(np.mean([r["tokens"] for r in group])),
            "stop_ece": float(np.nanmean([r["at_stop"]["ece"] for r in group])),
            "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in group],
        }
        for reference in [r for r in references if r != name]:
            diff = summary[name][f"minus_{reference}"] = compare(group, runs[reference])
            print(
                f"{name} − {reference}: "
                + "; ".join(f"{k} {v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]" for k, v in diff.items())
            )
    print(json.dumps(summary))


def show(label: str, result: dict):
    acc = result["accuracy"]
    print(
        f"{label:16s} full {acc['full']:.3f} | 30/50/70 % {acc['30%']:.3f} {acc['50%']:.3f} {acc['70%']:.3f}"
        f" | λ {result['lambda']} ({'ε' if result['certified'] else 'target'}) acc {acc['deployed']:.3f}"
        f" tokens {result['tokens']:.2f} | stop {result['at_stop']['stopped']:.2f}"
        f" acc {result['at_stop']['accuracy']:.3f} conf {result['at_stop']['confidence']:.3f}"
        f" ECE {result['at_stop']['ece']:.3f} | answers/chain {result['answers_per_chain']:.1f}"
        f" elicited/CoT {result['elicited_tokens_per_cot_token']:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
