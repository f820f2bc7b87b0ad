"""The scoring queue: elicited answers wait until they become available and are then scored by the verifier.

An answer becomes available at the step its last token is fed (`MSVAnswer.end`: τ + P + L for a branch taken at τ
with P segment tokens and L answer tokens, decoded alongside the chain of thought). At step t every queued answer
with end ≤ t goes to the verifier's
online `MSVCache` in end-time order, which is what makes online scores equal the offline forward. When a prompt's
sequences have all ended, its remaining answers are scored at once (in end order). In terminal mode only the end
of each sequence is elicited, and a prompt's N terminal answers are scored once, offline, when its last sequence
ends (logit averaging happens inside the verifier). With N > M = ``verifier.config.num_sequences`` the N sequences
of a prompt are scored as independent groups of M (paper, "Scaling with MSV_M").
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ..modeling_msv import MSVCache
from .outputs import MSVAnswer

__all__ = ["ScoringQueue"]


class ScoringQueue:
    """Per-prompt queues of answers waiting for the verifier.

    Args:
        verifier: the `MSVVerifier`.
        num_sequences: N, sequences per prompt.
        streaming: score answers at their end step with the online cache (else only when a prompt has finished).
        keep_hidden_states: keep the answers' hidden states after scoring (else free them).

    Attributes:
        seconds: wall time spent in verifier calls.
    """

    def __init__(self, verifier, num_sequences: int, streaming: bool, keep_hidden_states: bool):
        self.verifier = verifier
        self.N = num_sequences
        self.streaming = streaming
        self.keep_hidden_states = keep_hidden_states
        self.cache = MSVCache() if streaming else None
        self.pending: dict[int, list[MSVAnswer]] = {}
        self.seconds = 0.0

    def push(self, answer: MSVAnswer):
        self.pending.setdefault(answer.prompt, []).append(answer)

    def has_pending(self, prompt: int) -> bool:
        return bool(self.pending.get(prompt))

    def discard(self, prompt: int):
        """Drop a decided prompt's waiting answers: they never become available (score stays `None`)."""
        for answer in self.pending.pop(prompt, []):
            if not self.keep_hidden_states:
                answer.hidden_states = None

    @torch.no_grad()
    def pop_due(self, t: int, finished: Sequence[bool]) -> dict[int, list[MSVAnswer]]:
        """Score what has become available by step t (everything of the prompts that have `finished`).

        Returns the newly scored answers per prompt, each list in end order.
        """
        ready: list[MSVAnswer] = []
        for prompt, queue in self.pending.items():
            if finished[prompt]:
                ready += queue
                self.pending[prompt] = []
            elif self.streaming:
                ready += [a for a in queue if a.end <= t]
                self.pending[prompt] = [a for a in queue if a.end > t]
        if not ready:
            return {}
        start = time.perf_counter()
        # End-time order per group keeps every call causal for the online cache (the verifier sorts internally).
        ready.sort(key=lambda a: (a.prompt, a.end, a.sequence))
        probabilities = self._forward(ready)
        scored: dict[int, list[MSVAnswer]] = {}
        for answer, score in zip(ready, probabilities):
            answer.score = score
            if not self.keep_hidden_states:
                answer.hidden_states = None
            scored.setdefault(answer.prompt, []).append(answer)
        self.seconds += time.perf_counter() - start
        return scored

    def _forward(self, ready: list[MSVAnswer]) -> list[float]:
        """One verifier call over `ready` (sorted by prompt, then end); the hidden states are concatenated as
        `(Σ L, d)` with a `(Σ L,)` token → answer index."""
        verifier = self.verifier
        M = verifier.config.num_sequences
        subgroups = -(-self.N // M)
        lengths = torch.tensor([a.length for a in ready])
        device = next(verifier.parameters()).device  # answer states may have been moved off the accelerator

        def column(values):
            return torch.tensor(values, dtype=torch.long, device=device)

        out = verifier(
            hidden_states=torch.cat([a.hidden_states for a in ready]).to(device, non_blocking=True),
            token_answer=torch.repeat_interleave(torch.arange(len(ready)), lengths).to(device),
            answer_group=column([a.prompt * subgroups + a.sequence // M for a in ready]),
            answer_sequence=column([a.sequence % M for a in ready]),
            answer_step=column([a.step for a in ready]),
            answer_end=column([a.end for a in ready]),
            answer_class=column([a.class_id for a in ready]),
            past_key_values=self.cache,
            use_cache=self.cache is not None,
        )
        return out.probabilities.tolist()
