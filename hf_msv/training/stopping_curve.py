"""The early-stopping trade-off of a trained streaming verifier on validation (`validation_tradeoff`), written to
``training_log.json["early_stopping"]``: accuracy and tokens as λ sweeps, and the λ a user would pick. The rule is
`hf_msv.generation.decide_stop`, the one `generate` applies; ``hf-msv evaluate`` replays the same rule with its
own λ rules and baselines. See ``docs/training.md``.
"""

from __future__ import annotations

import math

import numpy as np

from ..generation.stopping import decide_stop

__all__ = ["LAMBDAS", "TARGET_FRACTION", "validation_tradeoff"]

LAMBDAS = np.concatenate([np.linspace(0.0, 1.0, 101), [np.inf]])
TARGET_FRACTION = 0.95  # the evaluation's default target: 0.95 × full-decoding accuracy


def _group_curve(rows: np.ndarray, p: np.ndarray, labels: np.ndarray, structure: dict) -> tuple[np.ndarray, ...]:
    """(correct (Λ,), tokens (Λ,)) of one validation group; a chain's length is read as its last answer's end."""
    end, sequence = structure["end"][rows], structure["sequence"][rows]
    decision = decide_stop(end, p[rows], structure["terminal"][rows].astype(bool), LAMBDAS)
    lengths = np.array([end[sequence == s].max() for s in np.unique(sequence)])
    tokens = np.minimum(decision.stop_step[:, None], lengths[None, :]).sum(1)
    correct = np.where(decision.chosen >= 0, labels[rows][np.maximum(decision.chosen, 0)] > 0.5, False)
    return correct.astype(np.float64), tokens.astype(np.float64)


def validation_tradeoff(predictions, target_fraction: float = TARGET_FRACTION) -> dict:
    """Accuracy and tokens per group over `LAMBDAS` on the validation `predictions` (streaming, with
    ``structure``), and the λ chosen: the cheapest whose accuracy reaches `target_fraction` × full decoding's.

    Returns {"lambdas", "accuracy", "tokens" (lists, Λ; λ = ∞ as None), "target", "lambda", "reached",
    "accuracy_at_lambda", "tokens_at_lambda", "full_tokens"}. When only full decoding (λ = ∞) reaches the target,
    ``reached`` is False and ``lambda`` is the closest trade-off that stops: the most accurate finite λ (ties:
    cheaper), so the caller can say so rather than silently never stopping.
    """
    structure, p = predictions.structure, 1.0 / (1.0 + np.exp(-predictions.logits))
    curves = [_group_curve(np.flatnonzero(structure["group"] == g), p, predictions.labels, structure)
              for g in np.unique(structure["group"])]
    accuracy = np.mean([c[0] for c in curves], axis=0)
    tokens = np.mean([c[1] for c in curves], axis=0)
    full = int(np.flatnonzero(np.isinf(LAMBDAS))[0])
    target = target_fraction * accuracy[full]
    finite = np.isfinite(LAMBDAS) & (tokens < tokens[full])
    reached = finite & (accuracy >= target - 1e-12)
    if reached.any():
        pick = min(np.flatnonzero(reached), key=lambda i: (tokens[i], -accuracy[i]))
    elif finite.any():
        pick = min(np.flatnonzero(finite), key=lambda i: (-accuracy[i], tokens[i]))
    else:
        pick = full
    lam = float(LAMBDAS[pick])
    return {"lambdas": [None if math.isinf(x) else float(x) for x in LAMBDAS], "accuracy": accuracy.tolist(),
            "tokens": tokens.tolist(), "target": float(target), "lambda": None if math.isinf(lam) else lam,
            "reached": bool(reached.any()), "accuracy_at_lambda": float(accuracy[pick]),
            "tokens_at_lambda": float(tokens[pick]), "full_accuracy": float(accuracy[full]),
            "full_tokens": float(tokens[full])}
