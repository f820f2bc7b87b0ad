"""The one early-stopping rule (`hf_msv.generation.decide_stop`): its tie and fallback rules, its incremental use by
the generation hook, and real `MSVResult`s replayed offline by `hf_msv.evaluation.early_stop` to the same decision."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.generation import (
    EOS,
    ID,
    TOK,
    P,
    ScriptedAnswers,
    answer_group,
    generate,
    prompts,
    tiny_model,
    tiny_verifier,
)
from hf_msv import MSVVerifier
from hf_msv.evaluation.early_stop import replay, replay_many
from hf_msv.generation import MSVResult, decide_stop, prepare_generation

pytestmark = pytest.mark.usefixtures("single_thread")


def decide(end, scores, terminal, lam, select=None):
    d = decide_stop(end, scores, terminal, lam, select=select)
    assert all(v.shape == (1,) for v in vars(d).values())
    return bool(d.stopped[0]), int(d.stop_step[0]), int(d.chosen[0]), int(d.num_available[0])


# ----------------------------------------------------------------------------------------------------------------
# The rule
# ----------------------------------------------------------------------------------------------------------------


def test_stop_at_first_time_the_running_max_reaches_lambda():
    end, scores, terminal = [4, 5, 8, 9, 12], [0.3, 0.6, 0.7, 0.5, 0.9], [0, 0, 1, 0, 1]
    assert decide(end, scores, terminal, 0.65) == (True, 8, 2, 3)
    assert decide(end, scores, terminal, 0.0) == (True, 4, 0, 1)
    # λ never reached: run to the end (t* = last availability), best terminal answer.
    assert decide(end, scores, terminal, 0.95) == (False, 12, 4, 5)
    assert decide(end, scores, terminal, None) == (False, 12, 4, 5)


def test_output_is_the_best_available_answer_not_the_one_that_crossed():
    # Answer 1 crosses λ = .5 at t = 6, but answer 2 (available at 6 too) is better.
    assert decide([3, 6, 6], [0.2, 0.55, 0.8], [1, 1, 1], 0.5) == (True, 6, 2, 3)


def test_ties_go_to_the_answer_available_first_then_the_lower_index():
    # Given in elicitation order (τ): answer 0 is elicited first but becomes available last.
    end, terminal = [9, 7, 7], [1, 1, 1]
    assert decide(end, [0.8, 0.8, 0.8], terminal, 0.8) == (True, 7, 1, 2)
    assert decide(end, [0.8, 0.8, 0.8], terminal, 0.9) == (False, 9, 1, 3)  # fallback, same tie rule
    assert decide(end, [0.8, 0.2, 0.8], terminal, 0.9) == (False, 9, 2, 3)


def test_fallback_without_terminal_answers_and_without_scores():
    assert decide([2, 3], [0.4, 0.6], [0, 0], 0.9) == (False, 3, 1, 2)  # best answer overall
    assert decide([2, 3], [0.4, np.nan], [0, 1], 0.9) == (False, 3, 0, 2)  # an unscored terminal answer never wins
    assert decide([2, 3], [None, None], [1, 1], 0.0) == (False, 3, -1, 2)  # nothing scored: no answer
    assert decide([], [], [], 0.5) == (False, -1, -1, 0)


def test_a_separate_selection_picks_the_output_and_leaves_the_timing():
    """A stop head's statistic times the stop; its confidence (`select`) picks among the same candidates."""
    end, scores, terminal = [3, 6, 6, 9], [0.2, 0.7, 0.3, 0.4], [0, 0, 1, 1]
    select = [0.9, 0.5, 0.6, 0.95]
    assert decide(end, scores, terminal, 0.6) == (True, 6, 1, 3)
    assert decide(end, scores, terminal, 0.6, select) == (True, 6, 0, 3)  # answer 1 crossed, answer 0 is chosen
    assert decide(end, scores, terminal, 0.8, select) == (False, 9, 3, 4)  # never reached: best terminal by select
    # An answer without a score is never a candidate, whatever its selection value.
    assert decide(end, [np.nan, 0.7, 0.3, 0.4], terminal, 0.6, [0.99, 0.5, 0.6, 0.1]) == (True, 6, 2, 3)
    with pytest.raises(ValueError, match="one entry per answer"):
        decide_stop(end, scores, terminal, 0.6, select=[0.5])


def test_unscored_answers_never_reach_lambda():
    assert decide([2, 5], [np.nan, 0.7], [0, 1], 0.0) == (True, 5, 1, 2)
    assert decide([2, 5], [np.nan, 0.7], [0, 1], -np.inf) == (True, 5, 1, 2)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_vectorised_thresholds_and_incremental_use_agree(data):
    """The hook applies the rule each time answers are scored (all answers with end ≤ t, in the given order);
    the replay applies it once to every answer, for many λ. They must reach the same decision."""
    a = data.draw(st.integers(1, 12))
    end = np.array(data.draw(st.lists(st.integers(1, 6), min_size=a, max_size=a)))
    # Few distinct values, so that ties are frequent; nan is an answer that was never scored.
    scores = np.array(data.draw(st.lists(st.sampled_from([0.2, 0.5, 0.5, 0.8, np.nan]), min_size=a, max_size=a)))
    terminal = np.array(data.draw(st.lists(st.booleans(), min_size=a, max_size=a)))
    select = data.draw(st.none() | st.lists(st.sampled_from([0.1, 0.6, 0.6, 0.9]), min_size=a, max_size=a))
    select = None if select is None else np.array(select)
    lambdas = np.array([0.0, 0.2, 0.5, 0.6, 0.8, 0.9, np.inf])
    full = decide_stop(end, scores, terminal, lambdas, select=select)
    for i, lam in enumerate(lambdas):
        assert decide(end, scores, terminal, lam, select) == (
            full.stopped[i],
            full.stop_step[i],
            full.chosen[i],
            full.num_available[i],
        )
        for t in sorted(set(end)):
            seen = np.flatnonzero(end <= t)  # the answers scored by step t, in the given order
            d = decide_stop(end[seen], scores[seen], terminal[seen], lam, None if select is None else select[seen])
            if d.stopped[0]:
                assert full.stopped[i] and full.stop_step[i] == d.stop_step[0] == t
                assert full.chosen[i] == seen[d.chosen[0]] and full.num_available[i] == d.num_available[0]
                break
        else:
            assert not full.stopped[i]


# ----------------------------------------------------------------------------------------------------------------
# Generation results replayed offline
# ----------------------------------------------------------------------------------------------------------------


def chosen_index(result: MSVResult) -> int:
    return next(i for i, a in enumerate(result.answers) if a is result.chosen)


def assert_replays_to_the_same_decision(result: MSVResult, lam: float | None) -> bool:
    """Replay `result` at λ; assert the same chosen answer and stop step. Returns whether λ was reached."""
    group, scores = answer_group(result)
    r = replay(group, scores, np.inf if lam is None else lam)
    assert result.chosen is not None
    assert (r["chosen"], r["steps"]) == (chosen_index(result), result.stop_step)
    assert r["stopped"] or not result.stopped_early
    if result.stopped_early:
        assert r["stopped"]
        if isinstance(scores, np.ndarray):  # answers (not class snapshots): the chosen one reached λ itself
            assert result.chosen.score >= lam
    return r["stopped"]


def constant_verifier(probability: float, num_sequences: int = 4):
    """A verifier whose every score is `probability` (exactly, for 0.5 = sigmoid(0)): all answers tie."""
    verifier = tiny_verifier(num_sequences=num_sequences)
    with torch.no_grad():
        verifier.head.weight.zero_()
        verifier.head.bias.fill_(float(np.log(probability / (1 - probability))))
    return verifier


def test_tiny_lm_results_replay_to_the_same_decision():
    """Two prompts × 6 sequences (N > M = 4), scripted delimiters and EOS: λ = 0 stops at the first answer, λ in
    between stops somewhere, λ > 1 never stops."""
    model = tiny_model("llama")
    ScriptedAnswers(model)
    schedule = {(r, s): ID["Wait"] for r in range(12) for s in range(r % 4 + 1, 16, 5)}
    schedule |= {(2, 9): EOS, (7, 4): EOS}
    outcomes = set()
    with prepare_generation(model, TOK, tiny_verifier(num_sequences=4), delimiters=["Wait"], checker="exact") as msv:
        for lam in (0.0, 0.3, 0.45, 0.5, 0.55, 0.6, 1.01, None):
            generate(msv, prompts(), n=6, max_new_tokens=16, schedule=schedule, threshold=lam, seed=5)
            for result in msv.pop_results():
                outcomes.add(assert_replays_to_the_same_decision(result, lam))
    assert outcomes == {True, False}


def test_tied_scores_replay_to_the_same_decision():
    """Every score equal: the stop goes to the first available answer (lowest index among equal ends) and the
    fallback to the terminal answer available first."""
    model = tiny_model("qwen2")
    ScriptedAnswers(model)
    # Rows 1 and 2 fire together at step 3 (same τ + L); row 0 fires later; every row also ends.
    schedule = {(1, 3): ID["Wait"], (2, 3): ID["Wait"], (0, 5): ID["Wait"], (2, 6): EOS}
    with prepare_generation(model, TOK, constant_verifier(0.5), delimiters=["Wait"], checker="exact") as msv:
        generate(msv, prompts(["Hi"]), n=3, max_new_tokens=10, schedule=schedule, threshold=0.5)
        (stopped,) = msv.pop_results()
        generate(msv, prompts(["Hi"]), n=3, max_new_tokens=10, schedule=schedule, threshold=0.6)
        (never,) = msv.pop_results()
    assert len({a.score for r in (stopped, never) for a in r.answers if a.score is not None}) == 1
    assert assert_replays_to_the_same_decision(stopped, 0.5)
    assert (stopped.chosen.sequence, stopped.chosen.tau, stopped.stop_step) == (1, 3, 3 + P + 3)
    assert not assert_replays_to_the_same_decision(never, 0.6)
    # Terminal answers: row 2's EOS at τ = 6 (end 6 + P + 3) is available before the budget answers of rows 0, 1
    # (τ = 9, fed the newest token too: end 9 + 1 + P + 3).
    assert (never.chosen.sequence, never.chosen.trigger, never.stop_step) == (2, "eos", 9 + 1 + P + 3)


def test_testbed_results_replay_to_the_same_decision():
    """The shipped testbed LM and MSV: real scores, λ that stop early, late or never."""
    from hf_msv.testbed import TESTBED_VERIFIER_DIR, TESTBED_VERIFIER_TASK, format_prompt, get_task, load_testbed_lm

    task = get_task(TESTBED_VERIFIER_TASK)  # the LM the shipped verifier was trained on, and its problems
    model, tokenizer = load_testbed_lm(device="cpu", task=task.name)
    verifier = MSVVerifier.from_pretrained(TESTBED_VERIFIER_DIR).eval()
    problems = [format_prompt(p) for p in task.generate_problems("evaluation", 2, seed=1)]
    outcomes, reasons = set(), set()
    with prepare_generation(model, tokenizer, verifier) as msv:
        for lam in (0.3, 0.9, None):
            torch.manual_seed(0)
            for result in msv.generate(problems, threshold=lam, num_sequences=8, max_new_tokens=128):
                outcomes.add(assert_replays_to_the_same_decision(result, lam))
                reasons.add(result.stopped_early)
                # The whole λ grid at once gives the same decision at this λ.
                group, scores = answer_group(result)
                many = replay_many(group, scores, [0.0, np.inf if lam is None else lam, np.inf])
                assert many.chosen[1] == chosen_index(result)
    assert outcomes == {True, False} and reasons == {True, False}
