"""The state of one ``generate`` call: per step, which rows fire, their branches' progress, scoring and the rule.

`GenerationRun` is the ``generate`` adapter of the run core (`core.RunCore`: tokens → branches → answers → the
rule's decisions, shared with vLLM); it keeps what only ``generate`` has: the decoding batch's rows (`lockstep`),
recurrent histories (`caches`), hidden states offloaded off the accelerator, and token accounting
(`accounting.assemble_results`). Time t is the shared
decode step, 0 at the first generated token; forward number t (the prefill is forward 0) computes token t of the
main rows and the next token of every branch row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .accounting import assemble_results
from .caches import RecurrentHistory, has_recurrent_state
from .core import RunCore
from .forking import Branch, LiveBranch
from .outputs import MSVResult
from .policy import ElicitationPolicy
from .queue import ScoringQueue
from .tracking import LIVE, RowTracker

if TYPE_CHECKING:
    from ..equivalence import EquivalenceClasses
    from .stopping import MSVEarlyStop

__all__ = ["GenerationRun"]


class GenerationRun:
    """State of one ``generate`` call, created by `MSVSession`'s ``generate`` wrapper, driven by `MSVEarlyStop` (one
    `step` per sampled token) and by the decoding loop (`lockstep.lockstep_sample`) for the branches.

    Args:
        policy: where answers are elicited (`policy.ElicitationPolicy`, with the call's EOS ids).
        verifier: the `AnswerScorer` (or a verifier, see `scorers.as_scorer`), or `None` to only collect answers.
        new_classes: factory of one prompt's `EquivalenceClasses` (`None`: no class assignment).
        keep_hidden_states: keep every answer's `(L, d)` hidden states in the results.
        offload_hidden_states: move each answer's hidden states to CPU when it completes (pinned, non-blocking
            on CUDA), so accelerator memory holds only the live answers' states.
        num_sequences: N, rows per prompt.
        max_new_tokens, max_length: the call's token budget (max_new_tokens wins when set).
        stop: the call's `MSVEarlyStop` (λ, the pruning rule: a pruned row leaves the decoding batch as a stopped
            prompt's rows do, and the reported confidence's map), handed whole to the run core.
    """

    def __init__(
        self,
        policy: ElicitationPolicy,
        verifier=None,
        *,
        new_classes: Callable[[], EquivalenceClasses] | None,
        keep_hidden_states: bool,
        offload_hidden_states: bool,
        num_sequences: int,
        max_new_tokens: int | None,
        max_length: int | None,
        stop: MSVEarlyStop,
    ):
        self.policy = policy
        self.elicitor, self.matcher, self.streaming = policy.elicitor, policy.matcher, policy.streaming
        self.eos_ids = policy.eos_ids
        self.verifier, self.new_classes = verifier, new_classes
        self.keep_hidden_states, self.offload = keep_hidden_states, offload_hidden_states
        self.N = num_sequences
        self.max_new_tokens, self.max_length = max_new_tokens, max_length
        self.stop, self.threshold = stop, stop.threshold
        self.timings: dict[str, float] = dict.fromkeys(("elicitation", "verifier", "equivalence"), 0.0)
        self.compute: dict[str, int] = {}
        self.prompt_length = 0  # set at the first step
        self.last_step = -1
        self._tracker: RowTracker | None = None  # made at the first step, when the batch's rows are known
        self.queue: ScoringQueue | None = None
        self.forks: list[LiveBranch] = []
        self._core: RunCore | None = None
        self.history: RecurrentHistory | None = None  # recurrent states before possible delimiter starts

    # -- per step (called by MSVEarlyStop) -------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether the first step has run (``generate`` may produce no token at all)."""
        return self._tracker is not None

    @property
    def tracker(self) -> RowTracker:
        """The row and group bookkeeping (`tracking.RowTracker`), from the first step on."""
        if self._tracker is None:
            raise RuntimeError("GenerationRun.tracker is made at the first step")
        return self._tracker

    @property
    def core(self) -> RunCore:
        """The per-answer path and rule (`core.RunCore`), from the first step on."""
        if self._core is None:
            raise RuntimeError("GenerationRun.core is made at the first step")
        return self._core

    def _start(self, input_ids: torch.LongTensor):
        self._tracker = RowTracker(input_ids.shape[0], self.N, self.new_classes)
        self.prompt_length = input_ids.shape[1] - 1
        self.budget = (
            self.max_new_tokens
            if self.max_new_tokens is not None
            else max(0, (self.max_length or 0) - self.prompt_length)
        )
        if self.verifier is not None:
            self.queue = ScoringQueue(self.verifier, self.N, self.streaming, self.keep_hidden_states, self.threshold)
        self._core = RunCore(self.policy, self.queue, self.stop, self.keep_hidden_states, budget=self.budget)
        self.done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def step(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """Called by `MSVEarlyStop` right after token t has been sampled for every row; returns the rows to stop.
        Rows that fire become pending forks (`take_forks`)."""
        if not self.started:
            self._start(input_ids)
        t = input_ids.shape[1] - self.prompt_length - 1
        self.last_step = t
        for branch in self._fired_branches(input_ids[:, -1].tolist(), t):
            self._fork(branch)
        self._score_due(t)
        return self.done

    def _fired_branches(self, newest: list[int], t: int) -> list[Branch]:
        """Append each live row's newest token and return the rows that fire (`RunCore.feed`)."""
        tracker, core = self.tracker, self.core
        branches = [core.feed(tracker, row, token) for row, token in enumerate(newest) if tracker.status[row] == LIVE]
        return [branch for branch in branches if branch is not None]

    def _fork(self, branch: Branch):
        # The branch's segment starts with the newest token when it belongs to the context: it is not cached yet.
        if self.core.fork(self.tracker, branch):
            self.forks.append(self.elicitor.start(branch, self.tracker.history[branch.row]))

    # -- called by the decoding loop -------------------------------------------------------------------------

    def bind_cache(self, cache):
        """The decoding loop's cache after the prefill: a recurrent one needs a `RecurrentHistory` when branches
        drop consumed delimiter tokens (up to the matcher's window - 1), which recurrent layers cannot forget."""
        if self.matcher is not None and not self.elicitor.keep_delimiter and has_recurrent_state(cache):
            self.history = RecurrentHistory(horizon=self.matcher.window - 1)

    def update_history(self, t: int, cache, rows: dict[int, int]):
        """After the forks of step t, before token t is fed (`cache` holds every token but the newest): keep the
        recurrent states of delimiters that may still complete, and save the state before token t of the rows
        where one may start. `rows` maps each ``generate`` row still decoding to its batch row."""
        start = time.perf_counter()
        tracker, matcher, history = self.tracker, self.matcher, self.history
        assert matcher is not None and history is not None, "update_history runs only after bind_cache made one"
        starts = []
        for row, status in enumerate(tracker.status):
            live = status == LIVE and row in rows
            tokens = tracker.history[row]
            for step in history.steps(row):
                if not live or not matcher.could_start(tokens, back=t + 1 - step):
                    history.discard(row, step)
            if live and matcher.could_start(tokens):
                starts.append(row)
        history.save(cache, [rows[row] for row in starts], t, keys=starts)
        history.forget(t)
        self.timings["elicitation"] += time.perf_counter() - start  # branching work, not chain of thought

    def take_forks(self, t: int, unfinished: list[bool]) -> list[LiveBranch]:
        """The branches that fired at step t (for the loop to fork into its batch), with the terminal answers of
        the rows ``generate`` ended for another reason than EOS or our rule (the budget, another criterion);
        `unfinished` is ``generate``'s per-row flag after step t."""
        if self.started:
            self._end_budget_rows(t, unfinished)
        forks, self.forks = self.forks, []
        for live in forks:
            if not self.wants(live):  # its prompt was decided in the same step
                self.core.abandon(self.tracker, live.branch)
        return [live for live in forks if self.wants(live)]

    def _end_budget_rows(self, t: int, unfinished: list[bool]):
        tracker = self.tracker
        for row, status in enumerate(tracker.status):
            if status == LIVE and not unfinished[row]:
                branch = self.core.end_chain(tracker, row, eos=False)
                if branch is not None:
                    self._fork(branch)

    def wants(self, live: LiveBranch) -> bool:
        """Whether a branch is still worth decoding (`RunCore.wants`): its prompt is undecided, its row not pruned."""
        return self.core.wants(self.tracker, live.branch)

    def advance_branches(self, branches: list[LiveBranch], out, n_main: int, t: int, forward_seconds: float):
        """Consume forward t's outputs for the branch rows (batch rows ``n_main:``, in `branches` order): keep the
        hidden state of each answer token fed, choose each next answer token greedily, complete closed answers."""
        start = time.perf_counter()
        logits = out.logits[n_main:, -1].float()
        chosen = logits.argmax(-1)
        logprobs = torch.log_softmax(logits, -1).gather(1, chosen[:, None]).squeeze(1)
        # One read of the device for both (float64 holds every token id exactly).
        chosen, logprobs = torch.stack([chosen.double(), logprobs.double()]).tolist()
        chosen = [int(c) for c in chosen]
        # After the final norm; the loop asks for hidden states only when a branch is answering.
        states = out.hidden_states[-1][n_main:, -1] if out.hidden_states is not None else None
        for i, live in enumerate(branches):
            if live.answering:
                assert states is not None, "a branch answered in a forward without hidden states"
                live.hidden.append(states[i])
            else:
                live.fed += 1
            if live.answering and not live.closed:
                live.token_ids.append(chosen[i])
                live.token_logprobs.append(logprobs[i])
                live.closed = self.elicitor.ends_answer(live.token_ids, self.eos_ids)
            if live.complete:
                self._complete(live, t)
        self.timings["elicitation"] += forward_seconds + time.perf_counter() - start

    def tail_step(self, t: int):
        """A step after every main row has ended: score what became available and apply the rule."""
        self.last_step = t
        self._score_due(t)

    def count_forwards(self, forwards: int, rows: int):
        self.compute = {"forward_calls": forwards, "rows_computed": rows}

    def finalize(self) -> list[MSVResult]:
        """After the decoding loop: the last scores and the results."""
        if not self.started:  # generate produced no token
            return []
        self._score_due(self.last_step)
        self.timings["equivalence"] = self.core.equivalence_seconds
        results = assemble_results(
            self.tracker, self.budget, self.threshold, self.keep_hidden_states, dict(self.timings)
        )
        if self.offload and torch.cuda.is_available():
            torch.cuda.synchronize()  # the non-blocking copies to pinned memory have landed
        for result in results:
            result.compute = dict(self.compute)
        return results

    # -- answers ---------------------------------------------------------------------------------------------

    def _complete(self, live: LiveBranch, t: int):
        """The answer of `live` is complete at step t (`RunCore.record`)."""
        row = live.branch.row
        self.core.record(self.tracker, live, prompt=row // self.N, end=t, hidden=self._store(live.hidden))

    def _store(self, states: list[torch.Tensor]) -> torch.Tensor:
        """`(L, d)` answer states, copied off the accelerator when offloading (pinned memory, non-blocking)."""
        hidden = torch.stack(states)
        if not self.offload or hidden.device.type == "cpu":
            return hidden
        pinned = hidden.device.type == "cuda"
        host = torch.empty(hidden.shape, dtype=hidden.dtype, pin_memory=pinned)
        return host.copy_(hidden, non_blocking=pinned)

    # -- scoring and stopping --------------------------------------------------------------------------------

    def _score_due(self, t: int):
        """Score what has become available by step t and apply the rule (`RunCore.decide`); the rows it cuts leave
        the decoding batch."""
        if self.queue is None:
            return
        decisions = self.core.decide(t, {p: (self.tracker, p) for p in range(len(self.tracker.groups))})
        self.timings["verifier"] = self.queue.seconds
        for decision in decisions.values():
            for row in decision.rows:
                self.done[row] = True
