"""The same code paths on a CUDA GPU: skipped where there is none (CI has none; run ``pytest tests/test_cuda.py``
on a GPU machine). Each test repeats a CPU test's exact check with the LM, the verifier and the inputs on ``cuda``,
or checks what CUDA produced against the CPU computation of the same thing.
"""

from __future__ import annotations

import os

import pytest
import torch

from helpers.generation import TOK, ScriptedAnswers, generate, offline_scores, online_run, prompts, tiny_model
from hf_msv import MSVScorer, MSVVerifier, prepare_generation
from hf_msv.collect import collect
from hf_msv.data import ShardDataset, read_shard
from hf_msv.testbed import (
    TESTBED_VERIFIER_DIR,
    TESTBED_VERIFIER_TASK,
    format_prompt,
    generate_problems,
    get_task,
    load_testbed_lm,
)
from hf_msv.training import MSVTrainingConfig, evaluate_verifier, train_verifier

# HF_MSV_TEST_DEVICE=cpu runs these checks on CPU (to debug the tests themselves without a GPU).
DEVICE = torch.device(os.environ.get("HF_MSV_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_online_scores_on_cuda_equal_the_cpu_offline_forward():
    """As tests/test_generation.py's online test, LM and verifier on the GPU; the reference forward runs on CPU."""
    plain, hooked, results, cpu_verifier = online_run(4, 4, DEVICE)
    assert hooked.device == plain.device and torch.equal(plain, hooked)  # the hook leaves sampling unperturbed
    assert all(a.hidden_states.device.type == "cpu" for r in results for a in r.answers)
    offline, online = offline_scores(cpu_verifier, results, 4)
    torch.testing.assert_close(online, offline, atol=1e-4, rtol=1e-4)


def test_testbed_lm_and_shipped_verifier_stop_early_on_cuda():
    task = get_task(TESTBED_VERIFIER_TASK)  # the LM the shipped verifier was trained on, and its problems
    model, tokenizer = load_testbed_lm(device=DEVICE, task=task.name)
    verifier = MSVVerifier.from_pretrained(TESTBED_VERIFIER_DIR).to(DEVICE).eval()
    cpu_verifier = MSVVerifier.from_pretrained(TESTBED_VERIFIER_DIR).eval()
    problems = task.generate_problems("evaluation", 4)
    torch.manual_seed(0)
    # The raw MSV scores (not its stop head's statistic), to compare with an offline forward.
    with prepare_generation(model, tokenizer, MSVScorer(verifier), capture_hidden_states=True) as msv:
        results = msv.generate(
            [format_prompt(p) for p in problems], threshold=0.6, num_sequences=16, max_new_tokens=224
        )
    assert len(results) == 4 and all(r.chosen is not None for r in results)
    assert any(r.stopped_early for r in results)
    for r in results:
        if r.stopped_early:
            assert r.chosen.score >= 0.6 and r.tokens_decoded < r.tokens_without_early_stop_bounds[1]
    offline, online = offline_scores(cpu_verifier, results, 16)
    torch.testing.assert_close(online, offline, atol=1e-3, rtol=1e-3)


def test_collect_and_train_on_cuda_then_evaluate_on_cpu(tmp_path):
    """Shards collected by the LM on the GPU, a verifier trained there (accelerate picks the GPU): the checkpoint
    loads on CPU and scores the validation split as it did on the GPU."""
    model, tokenizer = load_testbed_lm(device=DEVICE)
    for split, name, count in (("train", "train", 8), ("validation", "val", 4)):
        collect(
            model,
            tokenizer,
            generate_problems(split, count),
            tmp_path / name,
            num_samples=8,
            max_new_tokens=160,
            prompt_template="testbed",
            checker="exact",
            progress=False,
        )
    problems, _ = read_shard(sorted((tmp_path / "train").glob("shard-*.safetensors"))[0])
    assert all(p.hidden_states.shape[0] == int(p.answer_length.sum()) > 0 for p in problems)
    config = MSVTrainingConfig(
        kind="msv",
        num_sequences=4,
        mode="streaming",
        learning_rate=1e-3,
        batch_size=8,
        num_epochs=2,
        progress=False,
        seed=0,
    )
    if DEVICE.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    result = train_verifier(tmp_path / "train", tmp_path / "val", tmp_path / "msv", config)
    if DEVICE.type == "cuda":  # training ran there: it needed GPU memory it has since freed
        assert torch.cuda.max_memory_allocated() > torch.cuda.memory_allocated()
    loaded = MSVVerifier.from_pretrained(tmp_path / "msv")
    assert next(loaded.parameters()).device.type == "cpu"
    val = ShardDataset(tmp_path / "val", num_sequences=4, mode="streaming", seed=0)
    assert abs(evaluate_verifier(loaded, val, "streaming")["bce"] - result.best_metrics["bce"]) < 1e-3


@pytest.mark.parametrize("offload", [True, False])
def test_answer_states_leave_the_accelerator_as_answers_complete(offload):
    """Offloading (the default) moves each answer's states to pinned CPU memory when it completes; opting out keeps
    them on the LM's device."""
    model = tiny_model("llama").to(DEVICE)
    ScriptedAnswers(model)
    with prepare_generation(
        model,
        TOK,
        delimiters=[],
        every_k_tokens=4,
        checker=None,
        capture_hidden_states=True,
        offload_hidden_states=offload,
    ) as msv:
        generate(msv, prompts().to(DEVICE), n=3, max_new_tokens=12)
        answers = [a for r in msv.pop_results() for a in r.answers]
    assert len(answers) == 2 * 3 * 3
    assert {a.hidden_states.device.type for a in answers} == {"cpu" if offload else DEVICE.type}
    if offload and DEVICE.type == "cuda":
        assert all(a.hidden_states.is_pinned() for a in answers)
