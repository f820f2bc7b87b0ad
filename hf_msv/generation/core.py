"""The run core: what a generation call does with a chain's tokens, a completed elicitation and the verifier's scores,
the same on every engine.

An engine adapter moves tokens and rows; the core decides. `GenerationRun` (``model.generate``) and the vLLM
`EngineSession` both

1. feed each sampled chain token to `RunCore.feed` (and a chain the engine ended to `RunCore.end_chain`), and fork
   the `Branch` it returns into their batch (``generate``) or send it as a request (vLLM) when `RunCore.fork` agrees;
2. hand each completed elicitation to `RunCore.record`, which builds the `MSVAnswer`, assigns its class and queues it
   for the verifier;
3. after each engine step call `RunCore.decide`, which scores what has become available and applies the prompt's
   rule; its `Decision` lists the rows that leave the engine: a stopped prompt's rows and the pruned chains. A
   ``generate`` row leaves the decoding batch, a vLLM chain's request is aborted.

`RunSetup` makes the per-session objects and runs every check (verifier width, checker, delimiters) on both engines.
Design: docs/generation.md ("The run core").
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from .. import pruning
from ..answers import extract_boxed
from ..elicitation import ElicitationSettings, resolve_elicitation
from .delimiters import check_delimiters
from .forking import Branch, LiveBranch
from .outputs import MSVAnswer
from .policy import ElicitationPolicy
from .queue import ScoringQueue
from .stopping import MSVEarlyStop
from .tracking import BUDGET, EOS, LIVE, PRUNED, STOPPED, PromptGroup, RowTracker

if TYPE_CHECKING:
    from ..equivalence import EquivalenceChecker, EquivalenceClasses

__all__ = ["Decision", "RunCore", "RunSetup"]


@dataclass(frozen=True)
class RunSetup:
    """What a session (an `MSVSession`, a `VLLMController`) builds once, checked the same way on both engines.

    Args:
        settings: the resolved `ElicitationSettings`.
        policy: the `ElicitationPolicy` (EOS ids added per call with ``with_eos``).
        checker: the equivalence checker object (`None`: no classes).
    """

    settings: ElicitationSettings
    policy: ElicitationPolicy
    checker: EquivalenceChecker | None

    @classmethod
    def build(
        cls,
        tokenizer,
        verifier_config,
        lm_width: int,
        lm_name: str,
        *,
        elicitation: ElicitationSettings | None,
        checker,
        eos_ids: Iterable[int] = (),
        **overrides,
    ) -> RunSetup:
        """Check the verifier against the LM and the settings against the tokenizer, then build the session's objects.

        Args:
            tokenizer: the LM's tokenizer.
            verifier_config: the scorer's config (``hidden_size``, ``elicitation``), `None` without verifier.
            lm_width, lm_name: the LM's hidden size and name (for the error message).
            elicitation, overrides: as `hf_msv.elicitation.resolve_elicitation`.
            checker: an equivalence checker name or object; required with a verifier.
            eos_ids: the engine's EOS ids (``generate`` adds the call's own later).

        Raises:
            ValueError: a verifier of another width, a verifier without checker, a delimiter the tokenizer cannot
                express (it could never fire), invalid settings.
        """
        if verifier_config is not None and verifier_config.hidden_size != lm_width:
            raise ValueError(
                f"the verifier reads hidden states of width {verifier_config.hidden_size} (trained on "
                f"{getattr(verifier_config, 'base_model_name_or_path', None)!r}) but the LM {lm_name!r} has hidden "
                f"size {lm_width}."
            )
        if verifier_config is not None and checker is None:
            raise ValueError("a verifier needs equivalence classes: pass a checker (e.g. 'symbolic').")
        settings = resolve_elicitation(verifier_config, elicitation, **overrides)
        check_delimiters(tokenizer, settings.delimiters)
        if isinstance(checker, str):
            from ..equivalence import get_checker

            checker = get_checker(checker)
        return cls(settings, ElicitationPolicy(tokenizer, settings, eos_ids), checker)

    def new_classes(self) -> Callable[[], EquivalenceClasses] | None:
        """A factory of one prompt's `EquivalenceClasses` (`None` without checker)."""
        if self.checker is None:
            return None
        from ..equivalence import EquivalenceClasses

        return functools.partial(EquivalenceClasses, self.checker)


@dataclass
class Decision:
    """What the rule decided for one prompt at a release.

    Args:
        stopped: the rule's statistic reached λ: the prompt's elicitations still in flight are abandoned.
        rows: the tracker rows that leave the engine now (the stopped prompt's live rows; pruned chains).
    """

    stopped: bool = False
    rows: list[int] = field(default_factory=list)


class RunCore:
    """A call's per-answer path and rule, driven by an engine adapter (module docstring).

    Args:
        policy: the call's `ElicitationPolicy` (its EOS ids included).
        queue: the `ScoringQueue` (`None`: answers are collected, not scored, and nothing is decided).
        stop: the call's `MSVEarlyStop`: λ of the stop (`None`: never stop; terminal mode never stops, all answers
            arrive at the end), the pruning rule (applied at each arrival time of an undecided prompt by
            `hf_msv.pruning.prune_chains`, the function the replay calls) and the map of the reported confidence.
        keep_hidden_states: keep every answer's hidden states in the results.
        budget: chain-of-thought tokens per chain at most (a chain at its budget has ended for the rule).

    Attributes:
        equivalence_seconds: wall time spent assigning classes.
    """

    def __init__(
        self,
        policy: ElicitationPolicy,
        queue: ScoringQueue | None,
        stop: MSVEarlyStop,
        keep_hidden_states: bool,
        budget: int | None = None,
    ):
        self.policy, self.elicitor, self.queue = policy, policy.elicitor, queue
        self.threshold = stop.threshold if policy.streaming else None
        prune = stop.prune
        self.prune = prune if prune is not None and not prune.off and policy.streaming else None
        self.confidence_map = stop.confidence_map
        self.budget = budget
        self.keep_hidden_states = keep_hidden_states
        self.equivalence_seconds = 0.0

    # -- chains ------------------------------------------------------------------------------------------------

    def feed(self, tracker: RowTracker, row: int, token: int) -> Branch | None:
        """Append a chain's newest sampled token; returns the branch it fires (`None`: none). A chain whose token
        ends it (EOS) ends here."""
        history = tracker.history[row]
        history.append(token)
        t = len(history) - 1
        branch = self.policy.fire(row, history, t, tracker.last_branch[row])
        if branch is not None and branch.ends_chain:
            tracker.end_row(row, t, EOS)
        return branch

    def end_chain(self, tracker: RowTracker, row: int, eos: bool) -> Branch | None:
        """The engine ended a live chain after its newest token: at an end-of-sequence token the policy does not
        know (`eos`), or at its budget (``max_new_tokens``, ``max_model_len``). Returns its terminal answer's
        branch (`None` when the chain's last answer already is)."""
        t = len(tracker.history[row]) - 1
        tracker.end_row(row, t, EOS if eos else BUDGET)
        if eos:
            return Branch(row, "eos", t)
        return self.policy.at_budget(row, t, tracker.last_branch[row])

    def fork(self, tracker: RowTracker, branch: Branch) -> bool:
        """Start eliciting `branch`; False (nothing is elicited) when its prompt is decided."""
        group = tracker.group_of(branch.row)
        if group.decided:
            return False
        tracker.last_branch[branch.row] = branch
        group.inflight += 1
        tracker.inflight[branch.row] += 1
        return True

    def wants(self, tracker: RowTracker, branch: Branch) -> bool:
        """Whether an elicitation in flight is still worth decoding: its prompt is undecided, its chain not pruned
        (a pruned chain's answers after its cut never become available)."""
        return not tracker.group_of(branch.row).decided and tracker.status[branch.row] != PRUNED

    def abandon(self, tracker: RowTracker, branch: Branch):
        """An elicitation that will never complete (its prompt was decided, or the engine cut it)."""
        if tracker.status[branch.row] != PRUNED:  # a pruned chain's were discounted when it was pruned
            tracker.group_of(branch.row).inflight -= 1
            tracker.inflight[branch.row] -= 1

    # -- answers -----------------------------------------------------------------------------------------------

    def record(
        self, tracker: RowTracker, live: LiveBranch, *, prompt: int, end: int, hidden: torch.Tensor
    ) -> MSVAnswer:
        """A completed elicitation becomes an answer: recorded on its row, classed, queued for the verifier.

        Args:
            tracker: the rows of its prompt.
            live: the completed branch (its answer tokens and their log-probabilities).
            prompt: its prompt's key (`MSVAnswer.prompt`, its key in the scoring queue).
            end: the step at which it is available (`MSVAnswer.end`).
            hidden: `(L, d)` the states of its answer tokens.

        Returns:
            The `MSVAnswer`.
        """
        b, ids = live.branch, live.token_ids
        group = tracker.group_of(b.row)
        group.inflight -= 1
        tracker.inflight[b.row] -= 1
        text = self.elicitor.decode(ids)
        answer = MSVAnswer(
            text=extract_boxed(text),
            raw_text=text,
            token_ids=list(ids),
            prompt=prompt,
            sequence=b.row % tracker.N,
            step=tracker.num_answers[b.row],
            tau=b.tau,
            length=len(ids),
            end=end,
            trigger=b.trigger,
            terminal=b.is_terminal,
            cot_tokens=b.kept,
            elicitation_ids=list(b.prefix_ids) + list(self.elicitor.prompt_ids),
            hidden_states=hidden,
            token_logprobs=list(live.token_logprobs),
        )
        tracker.record_answer(b.row, answer, len(live.segment))
        start = time.perf_counter()
        if group.classes is not None:
            answer.class_id = group.classes.add(answer.text)
        self.equivalence_seconds += time.perf_counter() - start
        group.answers.append(answer)
        if self.queue is not None and not group.decided:
            self.queue.push(answer)
        elif not self.keep_hidden_states:
            answer.hidden_states = None  # nothing will read them
        return answer

    # -- scoring and the rule ------------------------------------------------------------------------------------

    def decide(self, t: int, prompts: Mapping[int, tuple[RowTracker, int]]) -> dict[int, Decision]:
        """Score what has become available by step `t` (everything of a settled prompt) and apply the rule to each
        undecided prompt that got scores or will get none.

        Args:
            t: the step (vLLM passes its answers as they become available, and a step past all of them).
            prompts: the prompts in flight, key → (their tracker, their group's index in it).

        Returns:
            key → `Decision`, for the prompts decided now.
        """
        queue = self.queue
        if queue is None:
            return {}
        groups = {key: tracker.groups[g] for key, (tracker, g) in prompts.items()}
        due = queue.pop_due(t, {key: group.settled for key, group in groups.items()})
        decisions = {}
        for key in sorted(prompts):
            group = groups[key]
            if not group.decided and (key in due or group.settled):
                decision = self._apply_rule(key, *prompts[key], group)
                if decision is None and key in due and self.prune is not None:
                    decision = self._prune(*prompts[key], group)
                if decision is not None:
                    decisions[key] = decision
        return decisions

    def _apply_rule(self, key: int, tracker: RowTracker, g: int, group: PromptGroup) -> Decision | None:
        """Decide `group` once λ is reached, or once all its answers are scored (`PromptGroup.apply_stop_rule`)."""
        assert self.queue is not None
        stopped = group.apply_stop_rule(self.threshold, self.queue.has_pending(key))
        if stopped is None:
            return None
        decision = Decision(stopped=stopped)
        if self.confidence_map is not None and group.confidence is not None:  # calibrated at the certified pair
            features = [group.stop_time_features(tracker.N)] if self.confidence_map.needs_features else None
            group.confidence = float(self.confidence_map([group.confidence], features)[0])
        if stopped:
            # Its live rows leave the engine; answers still decoding are abandoned (they were never available).
            group.stopped_early = not group.finished
            for row in tracker.rows_of(g):
                if tracker.status[row] == LIVE:
                    tracker.end_row(row, len(tracker.history[row]) - 1, STOPPED)
                    decision.rows.append(row)
            self.queue.discard(key)
        return decision

    def _prune(self, tracker: RowTracker, g: int, group: PromptGroup) -> Decision | None:
        """Apply the pruning rule at the prompt's latest arrival time, on its scored answers and that time's class
        snapshot: the chains it prunes leave the engine, their elicitations in flight are abandoned, and each one's
        held answer becomes its final answer.

        The replay decides at every arrival time in order; so does this, because both engines call `decide` after
        every step and an answer becomes available at the step it completes: a prompt with chains still decoding
        gets at most one new arrival time per call (only a settled prompt gets several, and it has none to prune).
        """
        assert self.prune is not None
        scored = sorted((a for a in group.answers if a.score is not None), key=lambda a: (a.end, a.sequence, a.step))
        if not scored:
            return None
        t = scored[-1].end
        snapshot = next((a.class_values for a in reversed(scored) if a.end == t and a.class_values), None)
        if snapshot is None:  # the scorer has no class-level statistic: nothing says which class is ruled out
            return None
        rows = list(tracker.rows_of(g))
        # The chains' status in the rule's terms: decoding, pruned, or ended (EOS, budget).
        # A chain that sampled its last budget token has ended, though the engine ends it only after this step.
        codes = {LIVE: pruning.DECODING, PRUNED: pruning.PRUNED}
        status = [codes.get(tracker.status[r], pruning.ENDED) for r in rows]
        if self.budget is not None:
            status = [pruning.ENDED if len(tracker.history[r]) >= self.budget else s for r, s in zip(rows, status)]
        columns = [(a.sequence, a.step, a.end, -1 if a.class_id is None else a.class_id) for a in scored]
        sequence, step, end, klass = (np.asarray(c, np.int64) for c in zip(*columns))
        row_klass = [-1 if v.answer.class_id is None else v.answer.class_id for v in snapshot]
        cut = pruning.prune_chains(
            self.prune, t, sequence, step, end, klass, row_klass, [v.confidence for v in snapshot], status
        )
        if not cut.any():
            return None
        decision = Decision()
        for n in np.flatnonzero(cut):
            row = rows[n]
            tracker.end_row(row, len(tracker.history[row]) - 1, PRUNED)
            group.inflight -= tracker.inflight[row]  # its elicitations in flight never complete
            tracker.inflight[row] = 0
            held = [a for a in scored if a.sequence == n]
            if held:
                group.final.add(id(held[-1]))
            decision.rows.append(row)
        return decision
