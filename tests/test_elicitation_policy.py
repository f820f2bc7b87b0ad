"""One elicitation policy: `resolve_elicitation`'s override semantics, and the same token streams branching at the
same points on the three engines — ``model.generate`` (`GenerationRun`), the vLLM controller's per-chain loop, and
trace re-encoding (`plan_branches`) — for delimiters (whole, split over tokens, merged with a prefix, at the last
token), every K tokens, EOS (also where every-K would fire) and the budget."""

from __future__ import annotations

import itertools
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from helpers.generation import ID, TOK, ScriptedAnswers, generate, prompts, tiny_model
from hf_msv.collect.reencode import plan_branches
from hf_msv.elicitation import ElicitationSettings, resolve_elicitation
from hf_msv.generation import ElicitationPolicy, MSVEarlyStop, eos_token_ids, prepare_generation

SETTINGS = ElicitationSettings(delimiters=("Wait",), every_k_tokens=5, max_answer_tokens=3)
BUDGET = 12
# (row, step) -> token: a delimiter split over two tokens and EOS on row 0, one merged with "\n\n" and one at the
# very last token on row 1, nothing on row 2 (every K and the budget), EOS at an every-K step on row 3.
SCHEDULE = {
    (0, 2): ID["Wa"],
    (0, 3): ID["it"],
    (0, 9): ID["<eos>"],
    (1, 4): ID["\n\nWait"],
    (1, BUDGET - 1): ID[" Wait"],
    (3, 4): ID["<eos>"],
}


def test_overrides_replace_their_field_only():
    base = ElicitationSettings(delimiters=("\n\n",), max_answer_tokens=9)
    settings = resolve_elicitation(None, base, every_k_tokens=5, elicitation_prompt="P")
    assert (settings.delimiters, settings.every_k_tokens, settings.prompt, settings.max_answer_tokens) == (
        ("\n\n",),
        5,
        "P",
        9,
    )
    assert resolve_elicitation(None, base.to_dict(), delimiters=None) == base  # None leaves a field as it is
    assert resolve_elicitation(None, None, delimiters=()).delimiters == ()
    verifier_config = SimpleNamespace(elicitation=base, mode="streaming")
    assert resolve_elicitation(verifier_config) == base
    with pytest.raises(ValueError, match="bogus"):
        resolve_elicitation(None, None, bogus=1)
    with pytest.raises(ValueError, match="built for 'streaming'"):
        resolve_elicitation(verifier_config, mode="terminal")


def test_eos_token_ids_reads_every_form():
    assert eos_token_ids(SimpleNamespace(eos_token_id=None)) == set()
    assert eos_token_ids(SimpleNamespace(eos_token_id=2)) == {2}
    assert eos_token_ids(SimpleNamespace(eos_token_id=[2, 7])) == {2, 7}
    assert eos_token_ids(SimpleNamespace(eos_token_id=torch.tensor([[2], [7]]))) == {2, 7}
    assert eos_token_ids(None, SimpleNamespace(eos_token_id=5)) == {5}


def points(items) -> list[tuple[int, int, str, bool]]:
    return sorted((a.sequence, a.tau, a.trigger, a.terminal) for a in items)


def live_generate(settings=SETTINGS):
    model = tiny_model("llama")
    ScriptedAnswers(model)
    with prepare_generation(model, TOK, elicitation=settings, checker=None) as msv:
        generate(msv, prompts(["Hi"]), n=4, max_new_tokens=BUDGET, schedule=SCHEDULE)
        return msv.pop_results()[0], model


def reencoded(sequences, policy):
    plans = [plan_branches(seq, n, policy) for n, seq in enumerate(sequences)]
    return points(
        SimpleNamespace(sequence=b.sequence, tau=b.tau, trigger=b.trigger, terminal=b.terminal)
        for plan in plans
        for b in plan
    )


def vllm_chains(sequences, policy, monkeypatch, chunk=3):
    """The vLLM controller's per-chain loop (`EngineSession.chain_tokens`) on `sequences`, delivered `chunk` tokens
    per engine step as vLLM's DELTA outputs do, with a recording engine in place of vLLM."""
    from hf_msv.generation.core import RunCore
    from hf_msv.vllm.controller import EngineSession, PromptRun

    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **kwargs: SimpleNamespace(**kwargs)
    sampling_params = types.ModuleType("vllm.sampling_params")
    sampling_params.RequestOutputKind = SimpleNamespace(DELTA="delta")
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling_params)
    engine = SimpleNamespace(add_request=lambda rid, prompt, params: rid, collective_rpc=lambda *args, **kwargs: [])
    controller = SimpleNamespace(
        engine=engine,
        settings=policy.settings,
        policy=policy,
        elicitor=policy.elicitor,
        verifier=None,
        capture_hidden_states=False,
        confidence_top_k=None,
    )
    session = EngineSession(controller, BUDGET, MSVEarlyStop(None), len(sequences))
    run = PromptRun(0, [ID["<bos>"]], len(sequences), RunCore(policy, None, MSVEarlyStop(None), False), None)
    for start in range(0, max(map(len, sequences)), chunk):
        for n, seq in enumerate(sequences):
            if start >= len(seq):
                continue
            end = min(start + chunk, len(seq))
            finish = None if end < len(seq) else ("stop" if seq[-1] in policy.eos_ids else "length")
            completion = SimpleNamespace(token_ids=seq[start:end], finish_reason=finish, logprobs=None)
            session.chain_tokens(run, n, completion)
    branches = [el.live.branch for el in session.elicitations.values()]
    return points(
        SimpleNamespace(sequence=b.row, tau=b.tau, trigger=b.trigger, terminal=b.is_terminal) for b in branches
    )


def test_three_engines_branch_at_the_same_points(monkeypatch):
    result, model = live_generate()
    live = points(result.answers)
    # The schedule's cases all occur live: the rule under test, not a vacuous comparison.
    assert (0, 3, "delimiter", False) in live and (0, 9, "eos", True) in live
    assert (1, 4, "delimiter", False) in live and (1, BUDGET - 1, "delimiter", True) in live
    assert (2, 4, "every_k", False) in live and (2, BUDGET - 1, "budget", True) in live
    assert (3, 4, "eos", True) in live and not any(p[0] == 3 and p[2] == "every_k" for p in live)

    policy = ElicitationPolicy(TOK, SETTINGS, eos_token_ids(model.generation_config))
    sequences = [list(s) for s in result.sequences]
    assert reencoded(sequences, policy) == live
    assert vllm_chains(sequences, policy, monkeypatch) == live
    assert vllm_chains(sequences, policy, monkeypatch, chunk=1) == live


def test_spaced_answers_branch_at_the_same_points(monkeypatch):
    spaced = SETTINGS.replace(min_gap_tokens=4)
    result, model = live_generate(spaced)
    live = points(result.answers)
    # Spacing skips the every-K step right after row 0's delimiter and row 1's delimiter at the last token (which
    # then gets a budget answer); EOS and a step 5 tokens after the last answer still fire.
    assert (
        (0, 3, "delimiter", False) in live and not any(p[:2] == (0, 4) for p in live) and (0, 9, "eos", True) in live
    )
    assert (1, 9, "every_k", False) in live and (1, BUDGET - 1, "budget", True) in live
    for row in range(4):
        steps = [tau for sequence, tau, trigger, _ in live if sequence == row and trigger not in ("eos", "budget")]
        assert all(later - earlier >= 4 for earlier, later in itertools.pairwise(steps))

    policy = ElicitationPolicy(TOK, spaced, eos_token_ids(model.generation_config))
    sequences = [list(s) for s in result.sequences]
    assert reencoded(sequences, policy) == live
    assert vllm_chains(sequences, policy, monkeypatch) == live
    assert vllm_chains(sequences, policy, monkeypatch, chunk=1) == live
    assert "min_gap_tokens" not in SETTINGS.to_dict() and ElicitationSettings.from_dict(spaced.to_dict()) == spaced
    with pytest.raises(ValueError, match="min_gap_tokens"):
        ElicitationSettings(min_gap_tokens=0)
