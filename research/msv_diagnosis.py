"""Where MSV_N loses to weighted votes of single-chain scores, measured on terminal shards (docs/msv_vote_pathway.md).

Usage:
    python research/msv_diagnosis.py --train T --validation V --evaluation E [--msv CKPT ...] [--out result.json]

Trains a Probe (plain torch, early-stopped on validation), then an MSV_N with `vote_pathway` started at the
calibrated weighted vote of that Probe, and compares per problem, at N = all collected sequences (one group per
problem), the vote, Probe+WV, the stacked [vote, Probe] baseline and every MSV (`--msv`: checkpoints trained with
`hf-msv train --mode terminal`). For each MSV it reports the picks lost to Probe+WV and what was picked instead,
how far the logit left the γ skip (the residual), the within-problem ranking (AUROC) of its per-answer part next to
the Probe's, and best-of-N with and without logit averaging.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from torch.nn import functional as F

from hf_msv import MSVConfig, MSVVerifier
from hf_msv.baselines import best_of_n, fit_logistic, fit_platt, logistic, self_consistency, weighted_voting
from hf_msv.data import VERIFIER_INPUTS, ShardDataset, collate_groups
from hf_msv.metrics import auroc
from hf_msv.modeling_probe import ProbeConfig, ProbeVerifier


def batch_of(path: str, n: int | None) -> dict:
    """Every problem's group of `n` sequences (default: all collected), terminal answers, packed."""
    data = ShardDataset(path, num_sequences=n, mode="terminal")
    return collate_groups([data[i] for i in range(len(data))], "terminal")


def inputs(batch: dict) -> dict:
    return {k: batch[k] for k in VERIFIER_INPUTS if k != "labels"}


def train_probe(train: dict, val: dict, seed: int, width: int = 1024, steps: int = 600) -> ProbeVerifier:
    """The Probe on every training answer (full batch, AdamW 1e-3), kept at its best validation BCE."""
    torch.manual_seed(seed)
    probe = ProbeVerifier(ProbeConfig(hidden_size=train["hidden_states"].shape[1], intermediate_size=width))
    optimizer = torch.optim.AdamW(probe.parameters(), lr=1e-3)
    best, state = np.inf, None
    for step in range(steps):
        loss = probe(train["hidden_states"], train["token_answer"], labels=train["labels"]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 19:
            with torch.no_grad():
                bce = float(probe(val["hidden_states"], val["token_answer"], labels=val["labels"]).loss)
            if bce < best:
                best, state = bce, {k: v.clone() for k, v in probe.state_dict().items()}
    probe.load_state_dict(state)
    return probe.eval()


def per_group(batch: dict, fn, *columns) -> np.ndarray:
    """Apply `fn(*columns[group])` group by group; returns the concatenated (A,) result."""
    group = batch["answer_group"].numpy()
    out = np.zeros(len(group))
    for g in np.unique(group):
        m = group == g
        out[m] = fn(*(c[m] for c in columns))
    return out


def probe_wv(batch: dict, probs: np.ndarray) -> np.ndarray:
    return per_group(batch, weighted_voting, probs, batch["answer_class"].numpy())


def train_vote_pathway(probe, train, val, seed: int, steps: int = 300, lr: float = 1e-4) -> MSVVerifier:
    """MSV_N with the vote pathway: the Probe loaded into it, anchored at Platt(Probe+WV share) on the training
    answers, then trained full-batch; kept at its best validation BCE (the anchor included)."""
    with torch.no_grad():
        share = probe_wv(train, probe(train["hidden_states"], train["token_answer"]).probabilities.numpy())
    d = train["hidden_states"].shape[1]
    torch.manual_seed(seed)
    config = MSVConfig(
        hidden_size=d,
        num_attention_heads=max(h for h in range(1, 13) if d % h == 0),
        num_sequences=int(train["answer_sequence"].max()) + 1,
        mode="terminal",
        gamma_skip=True,
        vote_pathway=True,
        vote_hidden_size=probe.config.intermediate_size,
    )
    model = MSVVerifier(config)
    model.load_vote_head_from_probe(probe)
    model.anchor_to_weighted_vote(*fit_platt(share, train["labels"].numpy()))
    optimizer = torch.optim.AdamW(model.parameter_groups(lr=lr, vote_lr=lr), weight_decay=0.01)
    best, state, curve = np.inf, None, []
    for step in range(steps + 1):
        if step % 20 == 0:
            with torch.no_grad():
                out = model.eval()(**inputs(val))
                bce = float(F.binary_cross_entropy_with_logits(out.logits, val["labels"]))
            curve.append((step, bce))
            if bce < best:
                best, state = bce, {k: v.clone() for k, v in model.state_dict().items()}
        if step == steps:
            break
        loss = model.train()(**inputs(train), labels=train["labels"]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.load_state_dict(state)
    model.curve = curve
    return model.eval()


def picks(batch: dict, scores: np.ndarray) -> dict[int, int]:
    """Group → the answer best-of-N picks."""
    group = batch["answer_group"].numpy()
    return {int(g): int(np.flatnonzero(group == g)[best_of_n(scores[group == g])]) for g in np.unique(group)}


def summary(batch: dict, scores: np.ndarray) -> dict:
    labels = batch["labels"].numpy()
    chosen = picks(batch, scores)
    return {
        "best_of_n": float(np.mean([labels[a] for a in chosen.values()])),
        "brier": float(np.mean((np.clip(scores, 0, 1) - labels) ** 2)),
    }


def within_problem_auroc(batch: dict, scores: np.ndarray) -> float:
    """Mean over problems with right and wrong answers of the AUROC of `scores` inside the problem."""
    group, labels = batch["answer_group"].numpy(), batch["labels"].numpy()
    values = [
        auroc(scores[group == g], labels[group == g])
        for g in np.unique(group)
        if 0 < labels[group == g].sum() < (group == g).sum()
    ]
    return float(np.mean(values))


def losses_to(batch: dict, reference: np.ndarray, scores: np.ndarray, vote: np.ndarray) -> dict:
    """Problems where `reference` picks right and `scores` wrong (and the reverse), and among the lost ones how
    often `scores` picked the plurality class and the mean vote share of the class it should have picked."""
    labels, klass = batch["labels"].numpy(), batch["answer_class"].numpy()
    ref, own, plural = picks(batch, reference), picks(batch, scores), picks(batch, vote)
    lost = [g for g in ref if labels[ref[g]] and not labels[own[g]]]
    won = [g for g in ref if labels[own[g]] and not labels[ref[g]]]
    return {
        "lost": len(lost),
        "won": len(won),
        "lost_picked_plurality": int(sum(klass[own[g]] == klass[plural[g]] for g in lost)),
        "lost_right_class_vote_share": float(np.mean([vote[ref[g]] for g in lost])) if lost else None,
        "lost_wrong_class_vote_share": float(np.mean([vote[own[g]] for g in lost])) if lost else None,
    }


def msv_report(path: str, batch: dict, probe_wv_scores: np.ndarray, vote: np.ndarray) -> dict:
    """One trained MSV: its scores, the residual over its γ skip, its per-answer ranking, averaging on/off."""
    model = MSVVerifier.from_pretrained(path).eval()
    with torch.no_grad():
        out = model(**inputs(batch))
        plain = MSVVerifier.from_pretrained(path, logit_averaging=False).eval()(**inputs(batch))
    probs, gamma = out.probabilities.numpy(), out.gamma.numpy()
    report = {
        "terminal": summary(batch, probs),
        "without_logit_averaging": summary(batch, plain.probabilities.numpy()),
        "auroc_within_problem": within_problem_auroc(batch, plain.logits.numpy()),
        "vs_probe_wv": losses_to(batch, probe_wv_scores, probs, vote),
    }
    if model.config.gamma_skip:
        w, b = float(model.gamma_skip_weight.detach()), float(model.gamma_skip_bias.detach())
        skip = w * gamma + b
        residual = plain.logits.numpy() - skip
        report["gamma_skip"] = [w, b]
        report["head_weight_norm"] = float(model.head.weight.detach().norm())
        report["residual_std"], report["skip_std"] = float(residual.std()), float(skip.std())
        report["residual_auroc_within_problem"] = within_problem_auroc(batch, residual) if residual.std() > 0 else None
    return report


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("train", "validation", "evaluation"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--msv", nargs="*", default=[], help="MSV checkpoints to diagnose (terminal)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    train, val, test = (batch_of(p, None) for p in (args.train, args.validation, args.evaluation))
    probe = train_probe(train, val, args.seed)
    with torch.no_grad():
        p = {
            name: probe(b["hidden_states"], b["token_answer"]).probabilities.numpy()
            for name, b in (("train", train), ("val", val), ("test", test))
        }
    vote = {
        name: per_group(b, self_consistency, b["answer_class"].numpy()) for name, b in (("val", val), ("test", test))
    }
    coef, intercept = fit_logistic(
        np.stack([vote["val"], np.log(p["val"]) - np.log1p(-p["val"])], 1), val["labels"].numpy()
    )
    stacked = logistic(np.stack([vote["test"], np.log(p["test"]) - np.log1p(-p["test"])], 1), coef, intercept)
    wv = probe_wv(test, p["test"])
    result = {
        "data": {
            name: {
                "problems": int(b["answer_group"].max()) + 1,
                "answers": len(b["labels"]),
                "accuracy": float(b["labels"].mean()),
            }
            for name, b in (("train", train), ("validation", val), ("evaluation", test))
        },
        "baselines": {
            "vote": summary(test, vote["test"]),
            "probe": summary(test, p["test"]),
            "probe_wv": summary(test, wv),
            "stacked": summary(test, stacked),
        },
        "probe_auroc_within_problem": within_problem_auroc(test, p["test"]),
        "msv": {path: msv_report(path, test, wv, vote["test"]) for path in args.msv},
    }
    model = train_vote_pathway(probe, train, val, args.seed)
    with torch.no_grad():
        out = model(**inputs(test))
    result["vote_pathway"] = {
        "terminal": summary(test, out.probabilities.numpy()),
        "validation_curve": model.curve,
        "vs_probe_wv": losses_to(test, wv, out.probabilities.numpy(), vote["test"]),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return result


if __name__ == "__main__":
    main()
