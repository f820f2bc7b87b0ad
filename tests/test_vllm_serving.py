"""The serving controller (`hf_msv.vllm.AsyncVLLMController`) on the CPU build of vLLM: the synchronous controller's
results when every prompt arrives at once, staggered arrivals, cancellation, engine errors and preemption. Runs in
the `.venv-vllm` environment (`make test-vllm`); skipped without vLLM.

The engines run without chunked prefill, where per-request seeds are safe on the CPU backend: a prompt's chains are
then the same whatever else the engine runs, so runs can be compared chain by chain.
"""

import asyncio
import json
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import hf_msv.testbed  # noqa: E402
from helpers.generation import answer_group  # noqa: E402
from helpers.vllm_engines import (  # noqa: E402
    assert_confidence_equals_transformers,
    make_engine,
    no_requests_left,
    preemptions,
)
from hf_msv.evaluation.early_stop import replay  # noqa: E402
from hf_msv.modeling_msv import MSVVerifier  # noqa: E402
from hf_msv.testbed import TESTBED_VERIFIER_DIR, format_prompt  # noqa: E402
from hf_msv.testbed.tasks import get_task  # noqa: E402
from hf_msv.vllm import AsyncVLLMController, CaptureError, VLLMController  # noqa: E402

LM_DIR = Path(hf_msv.testbed.__file__).parent / "lm-v2"
LAMBDA = json.loads((TESTBED_VERIFIER_DIR / "early_stopping.json").read_text())["lambda"]
N, BUDGET, SEED = 8, 160, 11
SETTINGS = dict(num_sequences=N, max_new_tokens=BUDGET, threshold=LAMBDA)


@pytest.fixture(scope="module")
def engine():
    return make_engine(LM_DIR, enable_chunked_prefill=False)


@pytest.fixture(scope="module")
def controller(engine):
    verifier = MSVVerifier.from_pretrained(TESTBED_VERIFIER_DIR).eval()
    tokenizer = AutoTokenizer.from_pretrained(LM_DIR)
    return VLLMController(engine, tokenizer, verifier, checker="symbolic", capture_hidden_states=True)


@pytest.fixture(scope="module")
def prompts():
    return [format_prompt(p) for p in get_task("v2").generate_problems("evaluation", 4, seed=0)]


@pytest.fixture(scope="module")
def synchronous(engine, controller, prompts):
    """`VLLMController.generate` over the prompts, seeded, from an empty prefix cache."""
    assert engine.reset_prefix_cache()
    return controller.generate(prompts, seed=SEED, **SETTINGS)


def serve(server, prompts, delays=None):
    """Answer `prompts` on `server`, prompt i submitted once the engine has taken ``delays[i]`` steps; prompt i
    seeded as `VLLMController.generate` seeds it in a call over all of them."""

    async def one(i, prompt):
        while delays is not None and server.steps < delays[i]:
            await asyncio.sleep(0.005)
        return await server.answer(prompt, seed=SEED + i * N)

    async def main():
        async with server:
            return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)), return_exceptions=True)

    return asyncio.run(main())


def assert_valid(result, lam=LAMBDA):
    """A decided result: its choice and stop step are the evaluation replay's, its token counts add up."""
    group, scores = answer_group(result)
    r = replay(group, scores, lam)
    chosen = next(i for i, a in enumerate(result.answers) if a is result.chosen)
    assert (r["chosen"], r["steps"]) == (chosen, result.stop_step)
    if isinstance(scores, str):  # class snapshots: some class's value at or before t* reached λ
        events = group.events[scores]
        assert r["stopped"] == (events.statistic[events.time <= result.stop_step].max() >= lam)
    else:
        assert r["stopped"] == (result.chosen.score >= lam)
    assert result.tokens_decoded == sum(map(len, result.sequences)) <= result.token_budget
    assert ("stopped" in result.finish_reasons) == result.stopped_early


def decisions(result):
    """What the stopping rule decided, and every answer's place, tokens and class."""
    answers = [
        (a.sequence, a.step, a.tau, a.end, a.trigger, a.terminal, a.class_id, a.token_ids) for a in result.answers
    ]
    chosen = result.answers.index(result.chosen) if result.chosen is not None else None
    return (
        result.sequences,
        result.finish_reasons,
        result.tokens_decoded,
        result.elicitation_tokens,
        result.stopped_early,
        result.stop_step,
        chosen,
        answers,
    )


def test_all_at_once_equals_the_synchronous_controller(engine, controller, prompts, synchronous):
    """Submitted at once, the prompts enter the engine in the same step and order as `generate` sends them, and
    every engine step is the same: chains, answers, their steps and hidden states, stop decisions and token counts
    are equal. Both score every prompt in flight in one verifier call per step over one online cache; scores are
    equal up to float rounding only, because the server's cache drops each prompt that is done (its memory holds
    only the prompts in flight) and the verifier's arithmetic rounds differently over the shorter cache. The
    server's queue keeps nothing of a prompt once it is answered, and its verifier time is split among them."""
    assert engine.reset_prefix_cache()
    server = AsyncVLLMController(controller, **SETTINGS)
    served = serve(server, prompts)
    assert no_requests_left(engine)
    queue = server.core.queue
    assert not any(queue.pending.values()) and not queue.prompt_seconds
    assert sum(r.timings["verifier"] for r in served) == pytest.approx(queue.seconds)
    assert sum(r.stopped_early for r in synchronous) >= 1  # the rule stops some, not all, prompts
    for p, (ours, theirs) in enumerate(zip(served, synchronous)):
        assert ours.prompt == theirs.prompt == p
        assert decisions(ours) == decisions(theirs)
        for a, b in zip(ours.answers, theirs.answers):
            assert torch.equal(a.hidden_states, b.hidden_states)
            assert (a.score is None) == (b.score is None)
            assert a.score is None or abs(a.score - b.score) <= 1e-5
        assert_valid(ours)
    # The per-prompt accounting adds up to the call's: elicitation tokens, and the last prompt's steps are the call's.
    for key in ("elicitation_prefill_tokens", "elicitation_answer_tokens_fed"):
        assert sum(r.compute[key] for r in served) == synchronous[0].compute[key]
    assert max(r.compute["forward_calls"] for r in served) == synchronous[0].compute["forward_calls"]
    assert all(0 <= r.timings["queued"] <= r.timings["total"] for r in served)


def test_staggered_arrivals_complete_with_the_same_chains(engine, controller, prompts, synchronous):
    """Prompts arriving while others run: each completes, decided as the replay decides. Without chunked prefill
    or preemption every running request advances one token per step whatever else runs, and a seeded prompt
    samples the same tokens, so each prompt's chains and stop decision are those of the all-at-once run."""
    server = AsyncVLLMController(controller, **SETTINGS)
    served = serve(server, prompts, delays=[0, 5, 17, 40])
    assert no_requests_left(engine) and server.in_flight == 0
    for ours, theirs in zip(served, synchronous):
        assert_valid(ours)
        assert decisions(ours) == decisions(theirs)
    assert [r.prompt for r in served] == [0, 1, 2, 3]
    assert served[3].timings["queued"] < served[3].timings["total"]


def test_a_cancelled_prompt_leaves_nothing_and_the_others_are_intact(engine, controller, prompts, synchronous):
    server = AsyncVLLMController(controller, **SETTINGS)

    async def main():
        tasks = [asyncio.create_task(server.answer(p, seed=SEED + i * N)) for i, p in enumerate(prompts)]
        while server.steps < 12:
            await asyncio.sleep(0.005)
        assert not tasks[1].done()  # mid-flight: its chains are decoding
        tasks[1].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await server.aclose()
        return results

    served = asyncio.run(main())
    assert isinstance(served[1], asyncio.CancelledError)
    assert no_requests_left(engine) and server.in_flight == 0 and not server.session.busy
    assert not server.session.elicitations
    for i in (0, 2, 3):
        assert_valid(served[i])
        assert decisions(served[i]) == decisions(synchronous[i])


def test_closing_cancels_what_runs_and_refuses_more(engine, controller, prompts):
    server = AsyncVLLMController(controller, num_sequences=2, max_new_tokens=60)

    async def main():
        tasks = [asyncio.create_task(server.answer(p)) for p in prompts[:2]]
        while server.steps < 3:
            await asyncio.sleep(0.005)
        await server.aclose()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        with pytest.raises(RuntimeError, match="closed"):
            await server.answer(prompts[0])
        return results

    assert all(isinstance(r, asyncio.CancelledError) for r in asyncio.run(main()))
    assert no_requests_left(engine) and not server.session.busy and not server.session.elicitations


def test_an_engine_error_reaches_every_caller_and_leaves_nothing(engine, controller, prompts, monkeypatch):
    llm_engine, calls = engine.llm_engine, []
    step = llm_engine.step

    def failing_step():
        calls.append(1)
        outputs = step()
        if len(calls) == 9:
            raise RuntimeError("engine failed")
        return outputs

    monkeypatch.setattr(llm_engine, "step", failing_step)
    server = AsyncVLLMController(controller, **SETTINGS)
    served = serve(server, prompts)
    assert all(isinstance(r, RuntimeError) and "engine failed" in str(r) for r in served)
    assert no_requests_left(engine) and server.in_flight == 0 and not server.session.elicitations
    # The engine is usable afterwards: a prompt submitted later is answered.
    monkeypatch.setattr(llm_engine, "step", step)
    again = serve(AsyncVLLMController(controller, num_sequences=2, max_new_tokens=60, threshold=LAMBDA), prompts[:1])
    assert_valid(again[0]) and no_requests_left(engine)


def test_an_untested_vllm_version_is_refused(controller, monkeypatch):
    monkeypatch.setattr(vllm, "__version__", "0.40.0")
    with pytest.raises(CaptureError, match=r"found 0\.40\.0"):
        AsyncVLLMController(controller)


def answer_lags(results) -> list[int]:
    """Engine steps from each answer's delimiter to its availability, beyond the 1 + L its elicitation needs when
    the engine schedules it at once (prefilled in one step, then its L answer tokens, the last one fed)."""
    return [a.end - a.tau - (1 + len(a.token_ids)) for r in results for a in r.answers]


def test_chains_wait_in_the_controller_so_elicitations_run_at_once(engine, controller, prompts):
    """Two prompts of 64 chains fill the engine's 128 sequences. Sent at once (``elicitation_reserve=0``), the
    chains take every slot and each elicitation waits in the engine's queue until a chain ends; by default the
    second prompt's chains wait in the controller until the first prompt is done, so every answer is available
    1 + L steps after its delimiter, and both prompts complete with the same (seeded) chains and nothing left."""
    settings = dict(num_sequences=64, max_new_tokens=96, threshold=None)  # full decoding: the admission alone
    assert engine.llm_engine.vllm_config.scheduler_config.max_num_seqs == 128
    at_once = VLLMController(engine, controller.tokenizer, controller.verifier, elicitation_reserve=0.0)
    assert at_once.chain_slots == 128 and controller.chain_slots == 96
    crowded = at_once.generate(prompts[:2], seed=SEED, **settings)
    admitted = controller.generate(prompts[:2], seed=SEED, **settings)
    assert no_requests_left(engine)
    assert max(answer_lags(crowded)) > 10
    assert set(answer_lags(admitted)) == {0}
    assert [r.sequences for r in admitted] == [r.sequences for r in crowded]  # seeded: the same chains
    assert all(len(r.sequences) == 64 and len(r.answers) > 64 for r in admitted)
    with pytest.raises(ValueError, match="elicitation_reserve"):
        VLLMController(engine, controller.tokenizer, controller.verifier, elicitation_reserve=1.0)


def test_preemption_under_a_small_cache_keeps_the_answer_states(engine, controller, prompts):
    """A cache of 40 blocks (the longest request takes 18) preempts chains and elicitations and recomputes them;
    the captured states, read by position, equal those of a run whose cache holds everything (≤ 1e-4, as
    tests/test_vllm.py), the seeded chains are the same and their token confidences are transformers'. Last in the
    file: a second in-process engine."""
    settings = dict(num_sequences=N, max_new_tokens=BUDGET, threshold=None)  # every answer of every chain
    assert engine.reset_prefix_cache()
    reference = serve(AsyncVLLMController(controller, **settings), prompts[:2])
    small = make_engine(
        LM_DIR, enable_chunked_prefill=False, kv_cache_memory_bytes=40 * (128 << 10), disable_log_stats=False
    )
    small_controller = VLLMController(
        small,
        controller.tokenizer,
        controller.verifier,
        checker="symbolic",
        capture_hidden_states=True,
        confidence_top_k=4,
    )
    before = preemptions(small)
    served = serve(AsyncVLLMController(small_controller, **settings), prompts[:2])
    assert preemptions(small) > before and no_requests_left(small)
    compared = 0
    for ours, theirs in zip(served, reference):
        assert ours.sequences == theirs.sequences
        assert [a.token_ids for a in ours.answers] == [a.token_ids for a in theirs.answers]
        for a, b in zip(ours.answers, theirs.answers):
            assert (a.hidden_states - b.hidden_states).abs().max().item() <= 1e-4
            compared += 1
    assert compared > 20
    model = AutoModelForCausalLM.from_pretrained(LM_DIR, dtype=torch.float32).eval()
    ids = [controller.encode(p) for p in prompts[:2]]
    assert assert_confidence_equals_transformers(model, ids, served, top_k=4) > 0
