"""The state of one ``generate`` call: per step, which rows fire, their elicitation, scoring and the stopping rule.

`GenerationRun` only orchestrates; each concept lives in its own module: row and group bookkeeping
(`tracking.RowTracker`), branching and answer decoding (`forking.AnswerElicitor`), the verifier queue
(`scoring.ScoringQueue`), the stopping rule (`stopping.decide_stop`) and token accounting
(`accounting.assemble_results`). Time t is the shared decode step, 0 at the first generated token.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..answers import extract_boxed
from .accounting import assemble_results
from .caches import RecurrentHistory, has_recurrent_state
from .delimiters import DelimiterMatcher
from .forking import AnswerElicitor, Branch, DecodeState
from .outputs import MSVAnswer, MSVResult, answer_sort_key
from .scoring import ScoringQueue
from .stopping import decide_stop
from .tracking import BUDGET, EOS, LIVE, STOPPED, RowTracker

__all__ = ["GenerationRun"]


class GenerationRun:
    """State of one ``generate`` call, created by the session's ``generate`` wrapper and driven by `MSVEarlyStop`.

    Args:
        elicitor: the session's `AnswerElicitor`.
        matcher: text-delimiter matcher (`None`: no text delimiters).
        every_k_tokens: also elicit after every K generated tokens (`None`: never).
        streaming: elicit at delimiters and score at τ + L (else only terminal answers, scored at the end).
        verifier: the `MSVVerifier`, or `None` to only collect answers.
        new_classes: factory of one prompt's `EquivalenceClasses` (`None`: no class assignment).
        keep_hidden_states: keep every answer's `(L, d)` hidden states in the results.
        num_sequences: N, rows per prompt.
        eos_ids: end-of-sequence token ids of the call.
        max_new_tokens, max_length: the call's token budget (max_new_tokens wins when set).
        threshold: λ (`None`: never stop).
    """

    def __init__(self, elicitor: AnswerElicitor, *, matcher: DelimiterMatcher | None, every_k_tokens: int | None,
                 streaming: bool, verifier, new_classes: Callable[[], object] | None, keep_hidden_states: bool,
                 num_sequences: int, eos_ids: set[int], max_new_tokens: int | None, max_length: int | None,
                 threshold: float | None):
        self.elicitor, self.matcher, self.every_k_tokens = elicitor, matcher, every_k_tokens
        self.streaming, self.verifier, self.new_classes = streaming, verifier, new_classes
        self.keep_hidden_states = keep_hidden_states
        self.N, self.eos_ids = num_sequences, eos_ids
        self.max_new_tokens, self.max_length = max_new_tokens, max_length
        self.threshold = threshold
        self.state = DecodeState()  # recorded by the session's pre-hook at every main-loop forward
        self.timings = dict.fromkeys(("elicitation", "verifier", "equivalence"), 0.0)
        self.prompt_length: int | None = None
        self.last_step = -1
        self.tracker: RowTracker | None = None
        self.queue: ScoringQueue | None = None
        self.history: RecurrentHistory | None = None  # recurrent states before possible delimiter starts

    def record(self, kwargs: dict):
        """Forward pre-hook callback: keep references to the decode forward's cache, mask and positions."""
        self.state.record(kwargs)

    # -- per step --------------------------------------------------------------------------------------------

    def _start(self, input_ids: torch.LongTensor):
        self.tracker = RowTracker(input_ids.shape[0], self.N, self.new_classes)
        self.prompt_length = input_ids.shape[1] - 1
        self.budget = (self.max_new_tokens if self.max_new_tokens is not None
                       else max(0, (self.max_length or 0) - self.prompt_length))
        if self.verifier is not None:
            self.queue = ScoringQueue(self.verifier, self.N, self.streaming, self.keep_hidden_states)
        self.done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        if self.state.cache is None:
            raise RuntimeError("MSV generation needs the cache of the decoding loop: call generate with "
                               "use_cache=True (the LM's forward must take it as past_key_values or cache_params).")
        if self.state.attention_mask is not None and self.state.attention_mask.dim() != 2:
            raise NotImplementedError("MSV generation needs a 2D attention mask (dynamic cache).")
        if self.matcher is not None and not self.elicitor.keep_delimiter and has_recurrent_state(self.state.cache):
            # A branch drops up to window - 1 consumed delimiter tokens, which recurrent layers cannot forget.
            self.history = RecurrentHistory(horizon=self.matcher.window - 1)

    def step(self, input_ids: torch.LongTensor) -> torch.BoolTensor:
        """Called by `MSVEarlyStop` right after token t has been sampled for every row; returns the rows to stop."""
        if self.tracker is None:
            self._start(input_ids)
        t = input_ids.shape[1] - self.prompt_length - 1
        self.last_step = t
        branches = self._fired_branches(input_ids[:, -1].tolist(), t)
        if branches:
            self._elicit(branches, t)
        if self.history is not None:
            start = time.perf_counter()
            self._update_history(t)
            self.timings["elicitation"] += time.perf_counter() - start  # branching work, not chain of thought
        self._release(t)
        return self.done

    def _fired_branches(self, newest: list[int], t: int) -> list[Branch]:
        """Append each live row's newest token and return the rows that fire: EOS, a delimiter, or every K."""
        tracker, matcher, every_k = self.tracker, self.matcher, self.every_k_tokens
        branches = []
        for row, token in enumerate(newest):
            if tracker.status[row] != LIVE:
                continue
            history = tracker.history[row]
            history.append(token)
            if token in self.eos_ids:
                tracker.end_row(row, t, EOS)
                branches.append(Branch(row, "eos"))
            elif self.streaming:
                branch = None
                if matcher is not None and matcher.could_complete(token):
                    found = matcher.match(history)
                    if found is not None:
                        branch = self.elicitor.delimiter_branch(row, found)
                if branch is None and every_k and len(history) % every_k == 0:
                    branch = Branch(row, "every_k", feed_newest=True)
                if branch is not None:
                    branches.append(branch)
        return branches

    def _update_history(self, t: int):
        """After the branches of step t: keep the recurrent states of delimiters that may still complete, and save
        the state before token t of the rows where one may start (the cache holds every token but the newest)."""
        tracker, matcher, history = self.tracker, self.matcher, self.history
        starts = []
        for row, status in enumerate(tracker.status):
            tokens = tracker.history[row]
            for step in history.steps(row):
                if status != LIVE or not matcher.could_start(tokens, back=t + 1 - step):
                    history.discard(row, step)
            if status == LIVE and matcher.could_start(tokens):
                starts.append(row)
        history.save(self.state.cache, starts, t)
        history.forget(t)

    def finalize(self) -> list[MSVResult]:
        """After the decoding loop: terminal answers of rows still live, last scores, results."""
        if self.tracker is None:  # generate produced no token
            return []
        t, tracker = self.last_step, self.tracker
        branches = []
        for row, status in enumerate(tracker.status):
            if status != LIVE:
                continue
            tracker.end_row(row, t, BUDGET)
            previous = tracker.last_answer[row]
            if previous is not None and previous.tau == t:
                # A delimiter fired at the very last token: that answer already saw the whole sequence (up to the
                # delimiter), so it is the terminal answer; eliciting again would duplicate it.
                previous.terminal = True
            else:
                branches.append(Branch(row, "budget", feed_newest=True))
        if branches:
            self._elicit(branches, t)
        self._release(t)
        return assemble_results(tracker, self.budget, self.threshold, self.keep_hidden_states, dict(self.timings))

    # -- elicitation -----------------------------------------------------------------------------------------

    def _elicit(self, branches: list[Branch], t: int):
        """Elicit one answer per branch fired at step t, assign its equivalence class and queue it for scoring."""
        tracker = self.tracker
        start = time.perf_counter()
        elicited = self.elicitor.elicit(self.state, branches, tracker.history, self.eos_ids, self.done.device,
                                        step=t, history=self.history)
        answers = []
        for b, e in zip(branches, elicited):
            row = b.row
            kept = len(tracker.history[row]) - (0 if b.feed_newest else 1) - b.drop
            answer = MSVAnswer(
                text=extract_boxed(e.raw_text), raw_text=e.raw_text, token_ids=e.token_ids, prompt=row // self.N,
                sequence=row % self.N, step=tracker.num_answers[row], tau=t, length=len(e.token_ids),
                trigger=b.trigger, terminal=b.trigger in ("eos", "budget"), cot_tokens=kept,
                elicitation_ids=b.prefix_ids + self.elicitor.prompt_ids, hidden_states=e.hidden_states,
                token_logprobs=e.token_logprobs)
            tracker.record_answer(row, answer, e.fed_tokens)
            answers.append(answer)
        self.timings["elicitation"] += time.perf_counter() - start

        start = time.perf_counter()
        for answer in answers:
            group = tracker.groups[answer.prompt]
            if group.classes is not None:
                answer.class_id = group.classes.add(answer.text)
            group.answers.append(answer)
            if self.queue is not None and not group.decided:
                self.queue.push(answer)
            elif self.queue is None and not self.keep_hidden_states:
                answer.hidden_states = None  # collection without hidden states: nothing will read them
        self.timings["equivalence"] += time.perf_counter() - start

    # -- scoring and stopping --------------------------------------------------------------------------------

    def _release(self, t: int):
        """Score what has become available by step t and apply the stopping rule to the prompts that got scores."""
        if self.queue is None:
            return
        released = self.queue.release(t, [group.finished for group in self.tracker.groups])
        self.timings["verifier"] = self.queue.seconds
        for prompt in sorted(released):
            self._apply_stop_rule(prompt, t)

    def _apply_stop_rule(self, prompt: int, t: int):
        """Decide `prompt` once λ is reached, or once all its answers are scored (the rule: `decide_stop`)."""
        group = self.tracker.groups[prompt]
        # Every answer available so far, in `MSVResult.answers` order: the rule breaks ties by this order, so
        # replaying the result offline (`hf_msv.evaluation.early_stop.replay`) reaches the same decision.
        scored = sorted((a for a in group.answers if a.score is not None), key=answer_sort_key)
        # Terminal mode never stops: all answers arrive at the end.
        threshold = self.threshold if self.streaming else None
        decision = decide_stop([a.end for a in scored], [a.score for a in scored], [a.terminal for a in scored],
                               threshold)
        stopped = bool(decision.stopped[0])
        if not stopped and not (group.finished and not self.queue.has_pending(prompt)):
            return
        index = int(decision.chosen[0])
        group.decided, group.stop_step = True, int(decision.stop_step[0])
        group.chosen = scored[index] if index >= 0 else None
        if stopped:
            group.stopped_early = not group.finished
            if group.stopped_early:
                for row in self.tracker.rows_of(prompt):
                    if self.tracker.status[row] == LIVE:
                        self.tracker.end_row(row, t, STOPPED)
                self.done[prompt * self.N:(prompt + 1) * self.N] = True
            self.queue.discard(prompt)
