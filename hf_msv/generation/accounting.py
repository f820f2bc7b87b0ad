"""Token accounting: one `MSVResult` per prompt from the row bookkeeping of a finished ``generate`` call.

Per prompt, ``tokens_decoded`` counts chain-of-thought tokens sampled while each sequence was live (up to and
including its EOS, its last budget token, or the stop step); ``token_budget`` is N × max_new_tokens. What full
decoding would have used is known only when the prompt did not stop early (``tokens_without_early_stop``); otherwise
it is reported as bounds: the tokens already decoded, and that plus the budget left to the sequences that were cut.
Stopped and finished rows leave the decoding batch (`lockstep`), so these counts are work actually done;
``MSVResult.compute`` has the forward calls and rows × steps of the whole call.
"""

from __future__ import annotations

from .outputs import MSVResult, answer_sort_key
from .tracking import PRUNED, STOPPED, RowTracker

__all__ = ["assemble_results"]


def assemble_results(
    tracker: RowTracker, budget: int, threshold: float | None, keep_hidden_states: bool, timings: dict[str, float]
) -> list[MSVResult]:
    """One `MSVResult` per prompt, in prompt order.

    Args:
        tracker: the call's rows and groups, after the decoding loop.
        budget: max_new_tokens of the call (per sequence).
        threshold: λ of the call.
        keep_hidden_states: keep the answers' hidden states (else drop them).
        timings: wall seconds per phase, shared by all results.
    """
    results = []
    for p, group in enumerate(tracker.groups):
        rows = tracker.rows_of(p)
        decoded = sum(tracker.end_step[r] + 1 for r in rows)
        cut = [r for r in rows if tracker.status[r] in (STOPPED, PRUNED)]
        upper = decoded + sum(max(0, budget - (tracker.end_step[r] + 1)) for r in cut)
        for answer in group.answers:
            if not keep_hidden_states:
                answer.hidden_states = None
        # Without a verifier nothing is decided: report the step at which the last sequence ended.
        stop_step = group.stop_step if group.stop_step is not None else tracker.last_step(p)
        results.append(
            MSVResult(
                prompt=p,
                answers=sorted(group.answers, key=answer_sort_key),
                chosen=group.chosen,
                confidence=group.confidence,
                stopped_early=group.stopped_early,
                stop_step=stop_step,
                threshold=threshold,
                sequences=[list(tracker.history[r]) for r in rows],
                finish_reasons=[tracker.status[r] for r in rows],
                tokens_decoded=decoded,
                token_budget=tracker.N * budget,
                tokens_without_early_stop=None if cut else decoded,
                tokens_without_early_stop_bounds=(decoded, upper),
                elicitation_tokens=sum(tracker.elicitation_tokens[r] for r in rows),
                answer_tokens=sum(a.length for a in group.answers),
                timings=timings,
            )
        )
    return results
