"""DeepConf's token confidence of every chain-of-thought token, recorded during sampling without changing it."""

from __future__ import annotations

import numpy as np
import torch
from transformers import LogitsProcessor


def token_confidence(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """DeepConf's token confidence C = −(1/k) Σ_{j≤k} log P(j) of each row's next-token distribution, from the LM's
    raw logits (the one definition of every engine: transformers, vLLM).

    Args:
        logits: `(rows, vocab)` logits.
        top_k: k (capped at the vocabulary size).

    Returns:
        `(rows,)` float32 confidences, on the logits' device.
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return -logprobs.topk(min(top_k, logprobs.shape[-1]), dim=-1).values.mean(-1)


class ConfidenceRecorder(LogitsProcessor):
    """Passive logits processor that records DeepConf's token confidence C_t = −(1/k) Σ_{j≤k} log P_t(j) of every
    row at every decode step, from the LM's own log-probs (before temperature and top-k/top-p warpers); the scores
    are returned unchanged (``docs/collection.md``).

    Args:
        top_k: k (DeepConf uses 20).
    """

    def __init__(self, top_k: int = 20):
        self.top_k = top_k
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        """Record the step's token confidences (the `LogitsProcessor` interface).

        Args:
            input_ids (`(rows, seq_len)` long): the sequences so far (unused).
            scores (`(rows, vocab)` float): the step's logits.

        Returns:
            `scores`, unchanged.
        """
        # Stays on the device: one host transfer per generate call, not a synchronisation per decode step.
        self.steps.append(token_confidence(scores, self.top_k))
        return scores

    def table(self) -> np.ndarray:
        """`(steps, rows)` float32 confidences recorded so far."""
        if not self.steps:
            return np.zeros((0, 0), dtype=np.float32)
        return torch.stack(self.steps).float().cpu().numpy()


__all__ = ["ConfidenceRecorder", "token_confidence"]
