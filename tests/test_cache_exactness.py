"""Property tests: MSV generation is exact on sliding-window and chunked-attention caches, whatever the split.

Tiny random Gemma-2 (eager) and Qwen2 (SDPA) LMs with sliding-window layers and Llama 4 LMs with chunked layers, with
random layer-type orders and windows / chunks smaller and larger than the context decode N > 1 sequences of several
prompts. The chain of thought carries "Wait" delimiters split over 1-4 tokens ("Wait", "Wa"+"it", "Wa"+"i"+"t",
"W"+"a"+"it", "W"+"a"+"i"+"t"), so branches leave out 0-3 consumed tokens. Properties: the sampled tokens are those
of a plain ``generate`` with the same seed (up to the stop step of a prompt that stops early); every delimiter
fires once with the right number of left-out tokens; every answer's tokens and hidden states equal a cache-free
recomputation of its context.
"""

from __future__ import annotations

import functools

import pytest
import torch
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.generation import (
    BOS,
    EOS,
    HIDDEN,
    ID,
    PAD,
    TOK,
    ScriptedAnswers,
    V,
    generate,
    prompts,
    recompute_answer,
    tiny_verifier,
)
from hf_msv.generation import prepare_generation

pytestmark = pytest.mark.usefixtures("single_thread")

SPLITS = [("Wait",), ("Wa", "it"), ("Wa", "i", "t"), ("W", "a", "it"), ("W", "a", "i", "t")]
PROMPTS = [("Hello there, solve 2+2", "Hi"), ("Hi", "What is 3*4? Think it through.", "A")]
MAX_NEW = 12
WINDOWS = [2, 3, 5, 9, 64]  # the contexts are 14-45 tokens: windows and chunks on both sides of them
ORDERS = [("sliding", "full"), ("full", "sliding"), ("sliding", "sliding"), ("sliding", "full", "sliding")]


@functools.cache
def windowed_model(family: str, window: int, order: tuple[str, ...]):
    """A tiny LM whose layers follow `order` ("sliding": a sliding-window layer for Gemma-2 and Qwen2, a chunked one
    for Llama 4); weights larger than the default init, so that a wrong context shows in the hidden states."""
    common = dict(
        vocab_size=V,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=len(order),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        initializer_range=0.2,
    )
    layer_types = [f"{kind}_attention" for kind in order]
    if family == "gemma2":
        config = transformers.Gemma2Config(sliding_window=window, layer_types=layer_types, **common)
    elif family == "qwen2":
        config = transformers.Qwen2Config(
            use_sliding_window=True, sliding_window=window, max_window_layers=0, layer_types=layer_types, **common
        )
    else:  # Llama 4: layers with RoPE use chunked attention, the others (no_rope_layers = 0) full attention
        config = transformers.Llama4TextConfig(
            attention_chunk_size=window,
            no_rope_layers=[int(kind == "sliding") for kind in order],
            intermediate_size_mlp=64,
            num_local_experts=1,
            num_experts_per_tok=1,
            **common,
        )
    torch.manual_seed(0)
    attention = "eager" if family == "gemma2" else "sdpa"  # Gemma-2 has no SDPA path
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention).eval()
    ScriptedAnswers(model)
    return model


@st.composite
def scenarios(draw):
    """A model, prompts, N, and a schedule of forced chain-of-thought tokens: split delimiters, sometimes an EOS."""
    model = (
        draw(st.sampled_from(["gemma2", "qwen2", "llama4"])),
        draw(st.sampled_from(WINDOWS)),
        draw(st.sampled_from(ORDERS)),
    )
    texts = draw(st.sampled_from(PROMPTS))
    n = draw(st.integers(2, 3))
    schedule, expected = {}, {}
    for row in range(n * len(texts)):
        step = draw(st.integers(0, 4))
        for _ in range(draw(st.integers(0, 2))):
            pieces = draw(st.sampled_from(SPLITS))
            if step + len(pieces) > MAX_NEW:
                break
            schedule.update({(row, step + i): ID[piece] for i, piece in enumerate(pieces)})
            expected[row // n, row % n, step + len(pieces) - 1] = len(pieces) - 1
            step += len(pieces) + draw(st.integers(0, 3))
        if step < MAX_NEW and draw(st.integers(0, 3)) == 0:  # this sequence ends early
            schedule[row, step] = EOS
    return model, texts, n, schedule, expected, draw(st.sampled_from([None, 4]))


def assert_exact(model, inputs, results):
    """Every answer's greedy tokens and `(L, d)` hidden states equal a cache-free forward over its context."""
    for result in results:
        for answer in result.answers:
            hidden, greedy = recompute_answer(model, inputs, result, answer)
            assert greedy == answer.token_ids
            assert answer.hidden_states.shape == (answer.length, HIDDEN)
            torch.testing.assert_close(answer.hidden_states, hidden, atol=1e-4, rtol=1e-4)


PROPERTY = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@PROPERTY
@given(scenarios())
def test_branches_exact_and_sampling_unperturbed(scenario):
    model_key, texts, n, schedule, expected, every_k = scenario
    model = windowed_model(*model_key)
    inputs = prompts(texts)
    plain = generate(model, inputs, n=n, max_new_tokens=MAX_NEW, schedule=schedule, criteria=False)
    with prepare_generation(
        model,
        TOK,
        delimiters=["Wait"],
        every_k_tokens=every_k,
        checker=None,
        max_answer_tokens=5,
        capture_hidden_states=True,
    ) as msv:
        hooked = generate(msv, inputs, n=n, max_new_tokens=MAX_NEW, schedule=schedule)
        results = msv.pop_results()
    assert torch.equal(plain, hooked)
    fired = {
        (r.prompt, a.sequence, a.tau): a.tau - a.cot_tokens
        for r in results
        for a in r.answers
        if a.trigger == "delimiter"
    }
    assert fired == expected
    assert_exact(model, inputs, results)


@PROPERTY
@given(scenarios(), st.sampled_from([0.0, 0.5]))
def test_early_stopping_keeps_sampling_and_answers_exact(scenario, threshold):
    """With early stopping on, a prompt that stops has its rows sampled as in plain generate up to the stop step
    and padded after it; the other prompts' rows are untouched; every answer stays exact."""
    model_key, texts, n, schedule, _, every_k = scenario
    model = windowed_model(*model_key)
    inputs = prompts(texts)
    plain = generate(model, inputs, n=n, max_new_tokens=MAX_NEW, schedule=schedule, criteria=False)
    with prepare_generation(
        model,
        TOK,
        tiny_verifier(),
        delimiters=["Wait"],
        every_k_tokens=every_k,
        checker="exact",
        max_answer_tokens=5,
        capture_hidden_states=True,
    ) as msv:
        hooked = generate(msv, inputs, n=n, max_new_tokens=MAX_NEW, schedule=schedule, threshold=threshold)
        results = msv.pop_results()
    start = inputs["input_ids"].shape[1]
    for result in results:
        rows = slice(result.prompt * n, (result.prompt + 1) * n)
        end = start + result.stop_step + 1 if result.stopped_early else plain.shape[1]
        assert torch.equal(hooked[rows, :end], plain[rows, :end])
        assert hooked[rows, end:].eq(PAD).all()
    assert_exact(model, inputs, results)
