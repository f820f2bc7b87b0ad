"""Tests of hf_msv.generation on tiny random LMs of several architectures (CPU, a few seconds each).

The LMs are real transformers models with random weights and a small character-level tokenizer whose vocabulary
also holds whole-word tokens ("Wait", " Wait", "\\n\\nWait", "Wa", "it"), so a delimiter can arrive as one token,
split over tokens or merged with what precedes it. Two test-only instruments (tests/helpers/generation.py) make
runs deterministic:

* `ForceTokens`, a logits processor for the *sampled* chain of thought: it forbids delimiter and EOS tokens
  everywhere except where a test schedules them, so a test decides when delimiters fire and sequences end.
* `ScriptedAnswers`, a forward hook on the LM that makes its greedy continuation after ``\\boxed`` write ``{d}``
  (d the digit the random LM prefers in that context) or, with ``close=False``, never close the box.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from transformers import LogitsProcessorList

from helpers.generation import (
    ARCHS,
    EOS,
    HIDDEN,
    ID,
    PAD,
    TOK,
    ForceTokens,
    P,
    ScriptedAnswers,
    generate,
    make_tokenizer,
    offline_scores,
    online_run,
    prompts,
    recompute_answer,
    tiny_model,
    tiny_verifier,
)
from hf_msv import ElicitationSettings
from hf_msv.answers import ELICITATION_PROMPT
from hf_msv.generation import (
    DelimiterMatcher,
    MSVEarlyStop,
    fork_cache,
    msv_generate,
    prepare_generation,
)

pytestmark = pytest.mark.usefixtures("single_thread")


# ----------------------------------------------------------------------------------------------------------------
# Invariance and exactness across architectures
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_sampling_unperturbed_and_branches_exact(arch):
    """With early stopping off, the sampled tokens equal plain generate's; every answer's tokens and hidden states
    equal a cache-free recomputation of its context (so forking, masking and positions are right)."""
    model = tiny_model(arch)
    inputs = prompts()
    torch.manual_seed(7)
    plain = model.generate(**inputs, do_sample=True, num_return_sequences=3, max_new_tokens=24)
    # "e" and "ab" fire often under random sampling, multi-character "ab" spans two tokens (drop > 0).
    with prepare_generation(
        model,
        TOK,
        delimiters=["Wait", "e", "ab"],
        every_k_tokens=5,
        checker=None,
        max_answer_tokens=6,
        capture_hidden_states=True,
    ) as msv:
        torch.manual_seed(7)
        hooked = model.generate(
            custom_generate=msv, **inputs, do_sample=True, num_return_sequences=3, max_new_tokens=24
        )
        results = msv.pop_results()
    assert torch.equal(plain, hooked)
    answers = [(r, a) for r in results for a in r.answers]
    assert len(answers) >= 6 and {a.trigger for _, a in answers} >= {"delimiter", "every_k"}
    for result, answer in answers:
        hidden, greedy = recompute_answer(model, inputs, result, answer)
        assert greedy == answer.token_ids
        assert answer.hidden_states.shape == (answer.length, HIDDEN)
        torch.testing.assert_close(answer.hidden_states, hidden, atol=1e-4, rtol=1e-4)


def test_hidden_states_are_after_final_norm():
    model = tiny_model("llama")
    with prepare_generation(
        model, TOK, delimiters=[], checker=None, max_answer_tokens=3, capture_hidden_states=True
    ) as msv:
        generate(msv, prompts(["Hi"]), n=1, max_new_tokens=4)
        answer = msv.pop_results()[0].answers[0]
    # The LM head applied to the captured state gives the logits that chose the next answer token.
    logits = model.lm_head(answer.hidden_states)
    assert logits[:-1].argmax(-1).tolist() == answer.token_ids[1:]


# ----------------------------------------------------------------------------------------------------------------
# Delimiters
# ----------------------------------------------------------------------------------------------------------------


def test_delimiter_matcher_is_robust_to_tokenisation():
    matcher = DelimiterMatcher(TOK, ["Wait", "\n\n"])
    ids = lambda *tokens: [ID[t] for t in tokens]
    assert matcher.match(ids("o", "k", "Wait")).num_tokens == 1
    split = matcher.match(ids("o", "k", "Wa", "it"))
    assert (split.delimiter, split.num_tokens, split.prefix) == ("Wait", 2, "")
    assert matcher.match(ids("o", "k", "Wa")) is None  # not complete yet
    merged = matcher.match(ids("o", "k", " Wait"))
    assert (merged.num_tokens, merged.prefix) == (1, " ")
    # "\n\nWait" holds both delimiters; the earliest-starting occurrence wins.
    both = matcher.match(ids("o", "k", "\n\nWait"))
    assert (both.delimiter, both.prefix) == ("\n\n", "")
    # An occurrence counts once, at the token that completes it.
    assert matcher.match(ids("Wait", "o")) is None
    assert matcher.match(ids("W", "a", "i", "t")).num_tokens == 4
    assert not matcher.could_complete(ID["x"]) and matcher.could_complete(ID["t"])


def test_delimiter_matcher_decodes_a_vocabulary_once(monkeypatch):
    """The per-vocabulary table is decoded once per tokenizer (~2 s for a 150k vocabulary, which each new `MSVSession`
    set-up paid again), and again when tokens were added since."""
    tokenizer = make_tokenizer()
    calls = []
    decode = tokenizer.batch_decode
    monkeypatch.setattr(tokenizer, "batch_decode", lambda *a, **k: calls.append(1) or decode(*a, **k))
    first = DelimiterMatcher(tokenizer, ["Wait"])
    second = DelimiterMatcher(tokenizer, ["\n\n"])
    assert len(calls) == 1
    assert second.could_complete(tokenizer.convert_tokens_to_ids("\n\n"))
    assert not second.could_complete(tokenizer.convert_tokens_to_ids("Wait")) and first.could_complete(ID["Wait"])
    tokenizer.add_tokens(["Waiting"])
    assert DelimiterMatcher(tokenizer, ["Wait"]).could_complete(len(tokenizer) - 1) and len(calls) == 2


def test_delimiter_variants_branch_before_the_delimiter():
    """Three rows fire at the same step with different tokenisations of "Wait": one token, "Wa"+"it" (one token
    to hide from the branch), "\\n\\nWait" (its "\\n\\n" is fed again). One batched elicitation must equal each
    branch recomputed from scratch."""
    model = tiny_model("llama")
    ScriptedAnswers(model)
    inputs = prompts(["Hello there, solve 2+2"])
    schedule = {(0, 0): ID["Wait"], (0, 4): ID["Wait"], (1, 3): ID["Wa"], (1, 4): ID["it"], (2, 4): ID["\n\nWait"]}
    with prepare_generation(model, TOK, delimiters=["Wait"], checker=None, capture_hidden_states=True) as msv:
        generate(msv, inputs, n=3, max_new_tokens=8, schedule=schedule)
        result = msv.pop_results()[0]
    prompt_ids = TOK(ELICITATION_PROMPT, add_special_tokens=False)["input_ids"]
    at = {(a.sequence, a.tau): a for a in result.answers}
    first = at[(0, 0)]  # delimiter at the very first generated token
    assert (first.trigger, first.cot_tokens, first.elicitation_ids) == ("delimiter", 0, prompt_ids)
    assert at[(0, 4)].cot_tokens == 4
    assert (at[(1, 4)].cot_tokens, at[(1, 4)].elicitation_ids) == (3, prompt_ids)
    assert (at[(2, 4)].cot_tokens, at[(2, 4)].elicitation_ids) == (4, [ID["\n\n"]] + prompt_ids)
    for answer in result.answers:
        hidden, greedy = recompute_answer(model, inputs, result, answer)
        assert greedy == answer.token_ids
        torch.testing.assert_close(answer.hidden_states, hidden, atol=1e-4, rtol=1e-4)
        if answer.trigger == "delimiter":
            assert answer.length == 3 and answer.text == answer.raw_text[1]  # "{d}"


def test_keep_delimiter_and_every_k():
    model = tiny_model("qwen2")
    ScriptedAnswers(model)
    inputs = prompts(["Hi"])
    with prepare_generation(
        model, TOK, delimiters=["Wait"], every_k_tokens=4, keep_delimiter=True, checker=None
    ) as msv:
        generate(msv, inputs, n=2, max_new_tokens=10, schedule={(0, 1): ID["Wait"]})
        result = msv.pop_results()[0]
    by_sequence = {
        n: [(a.tau, a.trigger, a.cot_tokens, a.step) for a in result.answers if a.sequence == n] for n in range(2)
    }
    assert by_sequence[0] == [(1, "delimiter", 2, 0), (3, "every_k", 4, 1), (7, "every_k", 8, 2), (9, "budget", 10, 3)]
    assert by_sequence[1] == [(3, "every_k", 4, 0), (7, "every_k", 8, 1), (9, "budget", 10, 2)]
    assert [a.terminal for a in result.answers if a.sequence == 1] == [False, False, True]


def test_answer_at_last_step_is_the_terminal_answer():
    model = tiny_model("llama")
    with prepare_generation(model, TOK, delimiters=[], every_k_tokens=5, checker=None, max_answer_tokens=2) as msv:
        generate(msv, prompts(["Hi"]), n=2, max_new_tokens=10)
        result = msv.pop_results()[0]
    assert [(a.tau, a.terminal) for a in result.answers if a.sequence == 0] == [(4, False), (9, True)]


# ----------------------------------------------------------------------------------------------------------------
# Edge cases
# ----------------------------------------------------------------------------------------------------------------


def test_no_delimiter_gives_one_terminal_answer_per_sequence():
    model = tiny_model("gpt2")
    ScriptedAnswers(model)
    with prepare_generation(model, TOK, delimiters=["Wait"], checker=None) as msv:
        out = generate(msv, prompts(), n=3, max_new_tokens=9)
        results = msv.pop_results()
    assert len(results) == 2
    for result in results:
        assert [(a.sequence, a.tau, a.trigger, a.terminal) for a in result.answers] == [
            (n, 8, "budget", True) for n in range(3)
        ]
        assert result.finish_reasons == ["budget"] * 3 and result.tokens_decoded == 27 == result.token_budget
        assert result.tokens_without_early_stop == 27 and result.chosen is None
    assert out.shape[0] == 6


def test_unclosed_box_is_no_answer():
    model = tiny_model("llama")
    ScriptedAnswers(model, close=False)
    with prepare_generation(model, TOK, delimiters=[], checker=None, max_answer_tokens=5) as msv:
        generate(msv, prompts(["Hi"]), n=2, max_new_tokens=4)
        answers = msv.pop_results()[0].answers
    assert all(a.text is None and a.length == 5 and a.raw_text == "{1111" for a in answers)


def test_sequences_ending_at_different_steps_and_n_equals_one():
    model = tiny_model("phi3")
    ScriptedAnswers(model)
    verifier = tiny_verifier(num_sequences=4)
    with prepare_generation(model, TOK, verifier, delimiters=["Wait"], checker="exact") as msv:
        out = generate(
            msv,
            prompts(["Hello there", "Hi"]),
            n=3,
            max_new_tokens=10,
            threshold=2.0,
            schedule={(0, 2): EOS, (1, 5): EOS, (3, 0): EOS, (5, 1): ID["Wait"]},
        )
        first, second = msv.pop_results()
        # N = 1
        generate(msv, prompts(["Hi"]), n=1, max_new_tokens=5, threshold=2.0)
        (single,) = msv.pop_results()
    assert [(a.sequence, a.tau, a.trigger) for a in first.answers] == [(0, 2, "eos"), (1, 5, "eos"), (2, 9, "budget")]
    assert [a.cot_tokens for a in first.answers] == [2, 5, 10]  # EOS is not part of a branch
    assert first.finish_reasons == ["eos", "eos", "budget"] and first.tokens_decoded == 3 + 6 + 10
    assert [len(s) for s in first.sequences] == [3, 6, 10]
    assert out[0, -7:].tolist() == [PAD] * 7  # generate pads finished rows as usual
    assert [(a.sequence, a.tau, a.trigger) for a in second.answers] == [
        (0, 0, "eos"),
        (2, 1, "delimiter"),
        (1, 9, "budget"),
        (2, 9, "budget"),
    ]
    assert all(a.score is not None for r in (first, second, single) for a in r.answers)
    assert len(single.answers) == 1 and single.chosen is single.answers[0]


# ----------------------------------------------------------------------------------------------------------------
# Verifier scoring and early stopping
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n, group_size", [(4, 4), (6, 4)])
def test_online_scores_equal_offline_forward(n, group_size):
    """λ > 1: nothing stops, every answer is scored online in end-time order; scores equal the offline forward
    (with N > M, sequences are scored in independent groups of M)."""
    plain, hooked, results, verifier = online_run(n, group_size)
    assert torch.equal(plain, hooked)
    assert all(a.score is not None for r in results for a in r.answers)
    assert len({a.end for r in results for a in r.answers}) > 3  # several scoring times
    offline, online = offline_scores(verifier, results, group_size)
    torch.testing.assert_close(online, offline, atol=1e-5, rtol=1e-5)
    for result in results:
        assert not result.stopped_early and result.chosen is not None
        final = {}
        for answer in result.answers:
            final[answer.sequence] = answer
        assert result.chosen.score == max(a.score for a in final.values())  # best among final answers
        # Same text, same class; different text, different class (exact checker).
        texts = {}
        for answer in result.answers:
            if answer.text is not None:
                assert texts.setdefault(answer.text, answer.class_id) == answer.class_id
        assert len(set(texts.values())) == len(texts)


def test_threshold_zero_stops_a_prompt_at_its_first_answer():
    """A branch taken at τ feeds its P prompt tokens and its L = 3 answer tokens one per step alongside the main
    rows: the answer is available at τ + P + 3. A stopped prompt's rows leave the batch; the output stays padded."""
    model = tiny_model("qwen2")
    ScriptedAnswers(model)
    verifier = tiny_verifier()
    schedule = {(0, 3): ID["Wait"], (3, 6): ID["Wait"]}  # prompt 0 at step 3, prompt 1 at step 6
    inputs = prompts()
    budget = 30
    with prepare_generation(model, TOK, verifier, delimiters=["Wait"], checker="exact") as msv:
        out = generate(msv, inputs, n=2, max_new_tokens=budget, schedule={**schedule, (2, 7): EOS}, threshold=0.0)
        first, second = msv.pop_results()
    generated = out[:, inputs["input_ids"].shape[1] :]
    t0, t1 = 3 + P + 3, 6 + P + 3
    assert generated.shape == (4, t1 + 1)  # generate returns once both prompts have stopped
    # Prompt 0: answer elicited at τ=3 becomes available at t* = τ + P + L; both rows stop there.
    assert first.stopped_early and first.stop_step == t0 and first.chosen.tau == 3 and first.chosen.end == t0
    assert first.finish_reasons == ["stopped", "stopped"] and first.tokens_decoded == 2 * (t0 + 1)
    assert first.tokens_without_early_stop is None
    assert first.tokens_without_early_stop_bounds == (2 * (t0 + 1), 2 * budget)
    assert generated[:2, t0 + 1 :].eq(PAD).all()  # stopped rows are padded like finished ones
    # Prompt 1 (rows 2, 3): row 2 ends at step 7, row 3 fires at step 6 and its answer stops the prompt; row 2's
    # EOS answer (available at 7 + P + 3) was still decoding and is abandoned with the prompt's rows.
    assert second.stopped_early and second.stop_step == t1 and second.chosen.tau == 6
    assert second.finish_reasons == ["eos", "stopped"] and second.tokens_decoded == 8 + t1 + 1
    assert [(a.sequence, a.tau) for a in second.answers] == [(1, 6)]
    assert set(first.timings) == {"total", "cot", "elicitation", "verifier", "equivalence"}
    assert all(v >= 0 for v in first.timings.values())
    assert first.compute["forward_calls"] == t1 + 1  # no forward beyond the main steps: branches ride along


def test_stopped_prompts_leave_the_batch_and_branches_add_no_forwards():
    """One prompt stops at its first answer, the other never does: the rows computed shrink by the stopped rows'
    remaining steps, and elicitation adds forward calls only in the tail after the last main step."""
    model = tiny_model("llama")
    ScriptedAnswers(model)
    budget = 40
    schedule = {(r, s): ID["Wait"] for r in range(4) for s in (5, 20)}
    calls = {}
    for lam, verifier in ((None, tiny_verifier()), (0.0, tiny_verifier())):
        with prepare_generation(model, TOK, verifier, delimiters=["Wait"], checker="exact") as msv:
            # λ = 0 stops prompt 0 at its first answer; prompt 1 never fires before its budget, so it never stops.
            only_first = {k: v for k, v in schedule.items() if k[0] < 2}
            generate(msv, prompts(), n=2, max_new_tokens=budget, schedule=only_first, threshold=lam)
            calls[lam] = msv.pop_results()
    full, stopped = calls[None], calls[0.0]
    # Without stopping: budget main forwards, then the terminal answers' tail (P + 1 newest token + 3 answer tokens).
    assert full[0].compute["forward_calls"] == budget + 1 + P + 3
    assert stopped[0].stopped_early and not stopped[1].stopped_early
    t_stop = 5 + P + 3
    saved = 2 * (budget - 1 - t_stop)  # prompt 0's two main rows leave after t*
    assert full[0].compute["rows_computed"] - stopped[0].compute["rows_computed"] >= saved
    assert [len(s) for s in stopped[0].sequences] == [t_stop + 1] * 2


def test_threshold_above_one_never_stops_and_chooses_best_final_answer():
    model = tiny_model("gpt_neox")
    ScriptedAnswers(model)
    verifier = tiny_verifier(bias=3.0)  # all scores high, but never above λ = 1.01
    schedule = {(0, 2): ID["Wait"], (1, 4): ID["Wait"]}
    with prepare_generation(model, TOK, verifier, delimiters=["Wait"], checker="exact") as msv:
        generate(msv, prompts(["Hi"]), n=3, max_new_tokens=8, schedule=schedule, threshold=1.01)
        (result,) = msv.pop_results()
    # Never stopped: t* is when the last answer became available (the budget answers, τ = 7, fed the newest token
    # and the prompt, L = 3), not 7.
    assert not result.stopped_early and result.stop_step == 7 + 1 + P + 3 == max(a.end for a in result.answers)
    final = [a for a in result.answers if a.terminal]
    assert len(final) == 3 and result.chosen in final
    assert result.confidence == max(a.score for a in final)


def test_terminal_mode_scores_once_offline():
    model = tiny_model("mistral")
    ScriptedAnswers(model)
    verifier = tiny_verifier(mode="terminal", num_sequences=4)
    with prepare_generation(
        model, TOK, verifier, delimiters=["Wait"], checker="exact", capture_hidden_states=True
    ) as msv:
        assert msv.elicitation.mode == "terminal"
        generate(msv, prompts(), n=4, max_new_tokens=6, schedule={(0, 1): ID["Wait"], (1, 2): EOS}, threshold=0.0)
        results = msv.pop_results()
    for result in results:
        assert [a.terminal for a in result.answers] == [True] * 4  # delimiters are ignored
        assert not result.stopped_early and result.chosen.score == max(a.score for a in result.answers)
    offline, online = offline_scores(verifier, results, 4)
    torch.testing.assert_close(online, offline, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# API
# ----------------------------------------------------------------------------------------------------------------


def test_hidden_size_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match=r"16.*32|32.*16"):
        prepare_generation(tiny_model("llama"), TOK, tiny_verifier(hidden=16))


def test_mode_mismatch_and_unbound_criterion():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="terminal"):
        prepare_generation(model, TOK, tiny_verifier(mode="terminal"), mode="streaming")
    with pytest.raises(RuntimeError, match="prepare_generation"):
        generate(model, prompts(["Hi"]), n=1, max_new_tokens=2)
    prepare_generation(model, TOK, checker=None)
    with pytest.raises(RuntimeError, match="custom_generate=msv"):  # prepared, but its loop not passed
        generate(model, prompts(["Hi"]), n=1, max_new_tokens=2)
    with prepare_generation(model, TOK, checker=None) as msv, pytest.raises(ValueError, match="verifier"):
        generate(msv, prompts(["Hi"]), n=1, max_new_tokens=2, threshold=0.5)
    other = prepare_generation(tiny_model("llama"), TOK, checker=None)
    with pytest.raises(ValueError, match="another model"):
        model.generate(**prompts(["Hi"]), custom_generate=other, max_new_tokens=2)


def test_verifier_config_provides_defaults_and_the_model_is_not_modified():
    model = tiny_model("llama")
    verifier = tiny_verifier()
    verifier.config.elicitation = verifier.config.elicitation.replace(delimiters=("\n\n",), max_answer_tokens=7)
    before = dict(vars(model))
    msv = prepare_generation(model, TOK, verifier, checker="exact")
    e = msv.elicitation
    assert (e.delimiters, e.max_answer_tokens, e.every_k_tokens) == (("\n\n",), 7, None)
    assert vars(model) == before and len(model._forward_pre_hooks) == 0  # no patched generate, no hook
    assert prepare_generation(model, TOK, checker=None) is not msv  # sessions are independent


def test_msv_generate_and_criterion_free_collection():
    model = tiny_model("llama")
    ScriptedAnswers(model)
    results = msv_generate(
        model,
        TOK,
        ["Hello", "Hi there"],
        verifier=tiny_verifier(),
        threshold=0.0,
        num_sequences=2,
        max_new_tokens=6,
        checker="exact",
        delimiters=[],
        generate_kwargs={"logits_processor": LogitsProcessorList([ForceTokens(3)])},
    )
    assert [r.prompt for r in results] == [0, 1] and all(r.chosen is not None for r in results)
    assert "generate" not in vars(model)
    # Collection: no verifier, no MSVEarlyStop passed.
    with prepare_generation(model, TOK, checker=None, delimiters=[], capture_hidden_states=True) as msv:
        torch.manual_seed(0)
        model.generate(
            custom_generate=msv,
            **prompts(["Hi"]),
            do_sample=True,
            num_return_sequences=3,
            max_new_tokens=3,
            logits_processor=LogitsProcessorList([ForceTokens(2)]),
        )
        (result,) = msv.results
    assert result.num_sequences == 3 and all(a.hidden_states.device.type == "cpu" for a in result.answers)
    assert result.elicitation_tokens == sum(len(a.elicitation_ids) + 1 + a.length for a in result.answers)


def test_fork_cache_leaves_the_original_untouched():
    model = tiny_model("llama")
    inputs = prompts()
    with torch.no_grad():
        out = model(**inputs, use_cache=True)
    cache = out.past_key_values
    before = [layer.keys.clone() for layer in cache.layers]
    fork = fork_cache(cache, torch.tensor([1]))
    fork.update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), 0)
    assert fork.layers[0].keys.shape[0] == 1 and fork.get_seq_length() == cache.get_seq_length() + 1
    assert all(torch.equal(b, layer.keys) for b, layer in zip(before, cache.layers))


@pytest.fixture
def private_modules_cache(monkeypatch, tmp_path):
    """transformers' module cache in `tmp_path` (loaded remote code is copied there, not into the user's home), and
    afterwards sys.path and the ``transformers_modules`` package of sys.modules as they were: left pointing at
    `tmp_path`, they would hide every later test's remote code."""
    import transformers.dynamic_module_utils as dynamic

    def ours(name: str) -> bool:
        return name.split(".")[0] == "transformers_modules"

    saved = {name: module for name, module in sys.modules.items() if ours(name)}
    for name in saved:
        del sys.modules[name]
    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))  # transformers appends its module cache to it
    yield
    for name in [name for name in sys.modules if ours(name)]:
        del sys.modules[name]
    sys.modules.update(saved)


def test_hub_layout_loop_samples_like_plain_generate(private_modules_cache):
    """``custom_generate/generate.py`` (transformers' Hub layout, loaded by ``generate`` itself from the repository
    root) decodes with the lockstep loop: same tokens as plain generate, finished rows padded."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    model = tiny_model("gpt2")
    inputs = prompts()
    processors = LogitsProcessorList([ForceTokens(inputs["input_ids"].shape[1], {(1, 3): EOS})])
    outs = []
    for custom in (None, str(root)):
        torch.manual_seed(3)
        extra = dict(custom_generate=custom, trust_remote_code=True) if custom else {}
        outs.append(
            model.generate(
                **inputs,
                do_sample=True,
                num_return_sequences=2,
                max_new_tokens=10,
                logits_processor=processors,
                **extra,
            )
        )
    assert torch.equal(outs[0], outs[1])
    assert outs[1][1, -6:].eq(PAD).all()  # row 1 ended at step 3 and left the batch; padded as generate pads


def test_row_ended_by_another_criterion_gets_its_terminal_answer():
    """A criterion other than EOS / the budget / ours ends one row early: the row leaves the batch with a terminal
    answer of its own, exact like every branch."""
    from transformers import StoppingCriteria

    class StopRow(StoppingCriteria):
        def __init__(self, row: int, length: int):
            self.row, self.length = row, length

        def __call__(self, input_ids, scores, **kwargs):
            done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
            done[self.row] = input_ids.shape[1] >= self.length
            return done

    model = tiny_model("llama")
    ScriptedAnswers(model)
    inputs = prompts(["Hi"])
    with prepare_generation(model, TOK, delimiters=[], checker=None, capture_hidden_states=True) as msv:
        torch.manual_seed(0)
        model.generate(
            custom_generate=msv,
            **inputs,
            do_sample=True,
            num_return_sequences=2,
            max_new_tokens=10,
            logits_processor=LogitsProcessorList([ForceTokens(inputs["input_ids"].shape[1])]),
            stopping_criteria=[StopRow(1, inputs["input_ids"].shape[1] + 5), MSVEarlyStop(None)],
        )
        (result,) = msv.pop_results()
    assert [(a.sequence, a.tau, a.trigger, a.terminal) for a in result.answers] == [
        (1, 4, "budget", True),
        (0, 9, "budget", True),
    ]
    assert [len(s) for s in result.sequences] == [10, 5]
    for answer in result.answers:
        hidden, greedy = recompute_answer(model, inputs, result, answer)
        assert greedy == answer.token_ids
        torch.testing.assert_close(answer.hidden_states, hidden, atol=1e-4, rtol=1e-4)


def test_elicitation_settings_and_keyword_overrides():
    model = tiny_model("llama")
    settings = ElicitationSettings(delimiters=("\n\n",), max_answer_tokens=9)
    with prepare_generation(model, TOK, elicitation=settings, checker=None) as msv:
        assert msv.elicitation == settings
    # Each override replaces its field only: every_k_tokens adds to the base's delimiters.
    with prepare_generation(
        model, TOK, elicitation=settings, every_k_tokens=5, elicitation_prompt="P", checker=None
    ) as msv:
        e = msv.elicitation
        assert (e.delimiters, e.every_k_tokens, e.prompt, e.max_answer_tokens) == (("\n\n",), 5, "P", 9)
    with prepare_generation(model, TOK, elicitation=settings, delimiters=(), every_k_tokens=5, checker=None) as msv:
        assert (msv.elicitation.delimiters, msv.elicitation.every_k_tokens) == ((), 5)
    with pytest.raises(ValueError, match="bogus"):
        prepare_generation(model, TOK, checker=None, bogus=1)
    with pytest.raises(ValueError, match="every_k_tokens"):
        prepare_generation(model, TOK, checker=None, every_k_tokens=0)


def test_untested_transformers_warns_once_and_tested_ones_do_not():
    from hf_msv.generation.lockstep import NEWEST_TESTED_TRANSFORMERS, warn_if_untested_transformers

    major, minor = NEWEST_TESTED_TRANSFORMERS
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not warn_if_untested_transformers(f"{major}.{minor}.3")
        assert not warn_if_untested_transformers("5.12.0")
        assert warn_if_untested_transformers(f"{major}.{minor + 1}.0.dev0")
        assert warn_if_untested_transformers(f"{major}.{minor + 1}.0.dev0")  # cached: no second warning
    assert len(caught) == 1 and f"{major}.{minor}" in str(caught[0].message)
