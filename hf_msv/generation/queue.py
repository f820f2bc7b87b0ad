"""The scoring queue: elicited answers wait until they become available and are then scored.

An answer becomes available at the step its last token is fed (`MSVAnswer.end`: τ + P + L for a branch taken at τ
with P segment tokens and L answer tokens, decoded alongside the chain of thought). At step t every queued answer
with end ≤ t goes to the scorer (`hf_msv.generation.scorers`) in end-time order, which is what makes online scores
equal the offline ones (the MSV's online `MSVCache`, the weighted vote's causal rule). When a prompt's sequences
have all ended, its remaining answers are scored at once (in end order). In terminal mode only the end of each
sequence is elicited, and a prompt's N terminal answers are scored together when its last sequence ends.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from .outputs import MSVAnswer
from .scorers import StopRuleScorer, as_scorer, forget_prompt

__all__ = ["ScoringQueue"]


class ScoringQueue:
    """Per-prompt queues of answers waiting for the scorer.

    Args:
        verifier: an `MSVVerifier`, a `ProbeVerifier` (Probe+WV) or an `AnswerScorer` (see `scorers.as_scorer`).
        num_sequences: N, sequences per prompt.
        streaming: score answers at their end step (else only when a prompt has finished).
        keep_hidden_states: keep the answers' hidden states after scoring (else free them).
        threshold: the run's λ, which sets the stop head in effect (`StopHead.at`; `None`: full decoding).

    Attributes:
        scorer: the `AnswerScorer`.
        seconds: wall time spent in scorer calls.
        prompt_seconds: each prompt's share of it (a call's time split by the answers it scored), until `forget`.

    Raises:
        TypeError: `verifier` is none of the above.
    """

    def __init__(
        self, verifier, num_sequences: int, streaming: bool, keep_hidden_states: bool, threshold: float | None = None
    ):
        scorer = as_scorer(verifier)
        self.scorer = scorer.at(threshold) if isinstance(scorer, StopRuleScorer) else scorer
        self.stream = self.scorer.begin(num_sequences, streaming)
        self.N = num_sequences
        self.streaming = streaming
        self.keep_hidden_states = keep_hidden_states
        self.pending: dict[int, list[MSVAnswer]] = {}
        self.seconds = 0.0
        self.prompt_seconds: dict[int, float] = {}

    def push(self, answer: MSVAnswer):
        self.pending.setdefault(answer.prompt, []).append(answer)

    def has_pending(self, prompt: int) -> bool:
        return bool(self.pending.get(prompt))

    def discard(self, prompt: int):
        """Drop a decided prompt's waiting answers: they never become available (score stays `None`)."""
        for answer in self.pending.pop(prompt, []):
            if not self.keep_hidden_states:
                answer.hidden_states = None

    def forget(self, prompt: int):
        """A prompt that is done: drop its waiting answers and the scorer's state of it (a server's queue outlives
        its prompts)."""
        self.discard(prompt)
        self.prompt_seconds.pop(prompt, None)
        forget_prompt(self.stream, prompt)

    @torch.no_grad()
    def pop_due(self, t: int, finished: Mapping[int, bool]) -> dict[int, list[MSVAnswer]]:
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
        # End-time order per prompt keeps every call causal (the online cache, the weighted vote's history).
        ready.sort(key=lambda a: (a.prompt, a.end, a.sequence))
        probabilities = self.stream.score(ready)
        scored: dict[int, list[MSVAnswer]] = {}
        for answer, score in zip(ready, probabilities):
            answer.score = score
            if not self.keep_hidden_states:
                answer.hidden_states = None
            scored.setdefault(answer.prompt, []).append(answer)
        seconds = time.perf_counter() - start
        self.seconds += seconds
        for prompt, answers in scored.items():
            self.prompt_seconds[prompt] = self.prompt_seconds.get(prompt, 0.0) + seconds * len(answers) / len(ready)
        return scored
