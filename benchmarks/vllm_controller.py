"""The vLLM controller against plain vLLM sampling of the same prompts and N (docs/vllm.md). Last stdout line: JSON.

CPU mode (default): the shipped testbed LM and MSV_16 at its default (the λ and pruning rule it certified), 32
evaluation problems, N = 16 and 64. Per N: plain vLLM CoT tokens/s; the controller's CoT tokens/s with elicitation
and scoring on and no stopping; the elicitation and verifier share of its wall time and the tokens the engine
computed for elicitation per CoT token (machine-independent: on a CPU the ratio follows it); wall time, tokens saved,
chains pruned and accuracy with the default's early stopping and pruning against the controller's full decoding
(paired interval over problems), and a second full decoding against the first (unseeded runs differ by sampling:
the noise of that interval), beside `hf-msv demo` on the same problems (shipped verifier only). Then N = 16 with
answers every 64 and 128 tokens (cost only). ``--verifier DIR`` runs a streaming MSV saved with its stopping rule
instead (its λ, and the elicitation schedule it was trained on, e.g. a ``min_gap_tokens`` spacing); ``--problems P``
sets the number of problems; ``--no-demo`` leaves the demo out (scripts/gpu_checks.sh: device time).
GPU mode (``--gpu``): a Qwen2.5-1.5B-shaped Llama with random weights (``load_format="dummy"``, the testbed's
vocabulary), answers every 256 tokens, a random MSV; throughput and shares only. ``--smoke`` runs the GPU mode's
code on CPU with a tiny config. ``--quick``: 4 problems, N = 8, short chains.

    .venv-vllm/bin/python benchmarks/vllm_controller.py [--quick | --gpu | --smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from _report import rounded  # benchmarks/ is the script's directory

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def make_engine(path, **kwargs):
    import vllm

    options = dict(block_size=32, enable_prefix_caching=True, seed=0, max_num_seqs=1024, async_scheduling=False)
    options.update(kwargs)
    return vllm.LLM(model=str(path), **options)


def plain_vllm(llm, prompt_ids, n, budget) -> dict:
    # Unseeded, like the controller: per-request seeds crash the CPU backend with chunked prefill (docs/vllm.md).
    from vllm import SamplingParams

    params = SamplingParams(n=n, max_tokens=budget, temperature=1.0, top_k=-1, detokenize=False)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def stop_vs_full(stop_ok, full_ok) -> list:
    """Early stopping's accuracy minus full decoding's, paired over problems (95 % bootstrap; the runs sample
    different chains, so the interval carries sampling noise too)."""
    import numpy as np

    from hf_msv.metrics import paired_bootstrap

    d = paired_bootstrap(np.array(stop_ok, float), np.array(full_ok, float))
    return [d["estimate"], d["low"], d["high"]]


def controller_run(controller, prompts, n, budget, threshold) -> tuple[dict, list]:
    start = time.perf_counter()
    results = controller.generate(prompts, num_sequences=n, max_new_tokens=budget, threshold=threshold)
    seconds = time.perf_counter() - start
    tokens = sum(r.tokens_decoded for r in results)
    timings, compute = results[0].timings, results[0].compute
    elicited = compute["elicitation_prefill_tokens"] + compute["elicitation_answer_tokens_fed"]
    answers = sum(len(r.answers) for r in results)
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "elicitation_tokens_per_cot_token": elicited / tokens,
        "elicitation_prefill_per_answer": compute["elicitation_prefill_tokens"] / max(1, answers),
        "elicitation_share": timings["elicitation"] / timings["total"],
        "verifier_share": timings["verifier"] / timings["total"],
        "answers": answers,
        "chains_pruned": sum(len(r.pruned) for r in results),
    }, results


def correct(results, problems, checker) -> list[bool]:
    return [r.chosen is not None and checker.is_correct(r.chosen.text, p.gold) for r, p in zip(results, problems)]


def demo_parity(n, budget, problems, stop_results, full_results, checker) -> dict:
    """`hf-msv demo` (transformers `generate` with the generation hook) on the same problems and N at the same
    default (the certified λ and pruning), beside the
    controller: accuracy with early stopping and tokens saved, and the controller's paired differences in accuracy
    and in the per-problem fraction of tokens saved (95 % bootstrap over problems; the two paths sample different
    chains, so the intervals carry sampling noise)."""
    import contextlib
    import io

    import numpy as np

    from hf_msv.demo import DemoConfig, run_demo
    from hf_msv.metrics import paired_bootstrap

    with contextlib.redirect_stdout(io.StringIO()):  # the demo's table; the last stdout line stays the JSON
        rows = run_demo(
            DemoConfig(problems=len(problems), num_sequences=n, max_new_tokens=budget, seed=0, figure=False)
        )
    assert [r.problem.id for r in rows] == [p.id for p in problems]
    vllm_ok = np.array(correct(stop_results, problems, checker), float)
    demo_ok = np.array([bool(r.correct) for r in rows], float)
    vllm_used = np.array([r.tokens_decoded for r in stop_results], float)
    vllm_full = np.array([r.tokens_decoded for r in full_results], float)
    demo_used = np.array([r.tokens_used for r in rows], float)
    demo_full = np.array([r.tokens_full for r in rows], float)
    saved = paired_bootstrap(1 - vllm_used / vllm_full, 1 - demo_used / demo_full)
    accuracy = paired_bootstrap(vllm_ok, demo_ok)
    return {
        "demo_accuracy_early_stop": demo_ok.mean(),
        "demo_tokens_saved": 1 - demo_used.sum() / demo_full.sum(),
        "accuracy_difference": [accuracy["estimate"], accuracy["low"], accuracy["high"]],
        "tokens_saved_per_problem_difference": [saved["estimate"], saved["low"], saved["high"]],
    }


def cpu_mode(quick: bool, verifier_dir: str | None = None, num_problems: int | None = None, demo: bool = True) -> dict:
    import hf_msv.testbed
    from hf_msv.equivalence import get_checker
    from hf_msv.generation import MSVEarlyStop
    from hf_msv.modeling_msv import MSVVerifier
    from hf_msv.testbed import TESTBED_VERIFIER_DIR, format_prompt
    from hf_msv.testbed.tasks import get_task
    from hf_msv.vllm import VLLMController

    lm = Path(hf_msv.testbed.__file__).parent / "lm-v2"
    shipped = verifier_dir is None
    verifier = MSVVerifier.from_pretrained(verifier_dir or TESTBED_VERIFIER_DIR).eval()
    lam = MSVEarlyStop.from_verifier(verifier).threshold
    task = get_task("v2")
    problems = task.generate_problems("evaluation", num_problems or (4 if quick else 32), seed=0)
    budget = 120 if quick else (task.sampling_cap() or 400)
    # Room for all 16 × 64 chains and their elicitations: a smaller cache preempts and evicts cached prefixes.
    llm = make_engine(lm, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=2 << 30)
    controller = VLLMController(llm, None, verifier, checker="symbolic")
    prompts = [format_prompt(p) for p in problems]
    ids = [controller.encode(p) for p in prompts]
    checker = get_checker("symbolic")
    controller.generate(prompts[:1], num_sequences=2, max_new_tokens=16)  # warm-up (first-use compilation)
    report = {
        "mode": "cpu",
        "verifier": "shipped" if shipped else verifier_dir,
        "elicitation": controller.settings.to_dict(),
        "lambda": lam,
        "problems": len(problems),
        "max_new_tokens": budget,
    }
    for n in (8,) if quick else (16, 64):
        plain = plain_vllm(llm, ids, n, budget)
        full, full_results = controller_run(controller, prompts, n, budget, None)
        stop, stop_results = controller_run(controller, prompts, n, budget, "certified")  # the default
        full_ok, stop_ok = correct(full_results, problems, checker), correct(stop_results, problems, checker)
        # A second full decoding: unseeded runs sample different chains, so two full runs differ by sampling alone.
        _, rerun_results = controller_run(controller, prompts, n, budget, None)
        rerun_ok = correct(rerun_results, problems, checker)
        report[f"n{n}"] = {
            "wall_s_plain": plain["seconds"],
            "wall_s_stop": stop["seconds"],
            "wall_ratio": stop["seconds"] / plain["seconds"],
            "accuracy_full": sum(full_ok) / len(problems),
            "accuracy_stop": sum(stop_ok) / len(problems),
            "accuracy_stop_minus_full": stop_vs_full(stop_ok, full_ok),
            "accuracy_full_rerun": sum(rerun_ok) / len(problems),
            "accuracy_full_rerun_minus_full": stop_vs_full(rerun_ok, full_ok),
            "tokens_saved": 1 - stop["tokens"] / full["tokens"],
            "plain_tokens_per_s": plain["tokens_per_s"],
            "controller_tokens_per_s": full["tokens_per_s"],
            "throughput_ratio": full["tokens_per_s"] / plain["tokens_per_s"],
            "elicitation_share": full["elicitation_share"],
            "verifier_share": full["verifier_share"],
            "elicitation_tokens_per_cot_token": full["elicitation_tokens_per_cot_token"],
            "elicitation_prefill_per_answer": full["elicitation_prefill_per_answer"],
            # the ratio if an elicitation token cost what a CoT token costs (CPU: cost scales with tokens)
            "token_bound_ratio": 1 / (1 + full["elicitation_tokens_per_cot_token"]),
            "answers": full["answers"],
            "tokens_full": full["tokens"],
            "tokens_early_stop": stop["tokens"],
            "chains_pruned": stop["chains_pruned"],
        }
        if shipped and demo:  # the demo runs the shipped verifier
            report[f"n{n}"] |= demo_parity(n, budget, problems, stop_results, full_results, checker)
    if not quick:
        # The same chains with sparser answers (every k tokens instead of at `Wait`): how the throughput ratio
        # follows the elicitation tokens per CoT token (the verifier is not trained for these answers; cost only).
        plain = report["n16"]["plain_tokens_per_s"]
        for k in (64, 128):
            sparse = VLLMController(llm, None, verifier, checker="symbolic", delimiters=(), every_k_tokens=k)
            run, _ = controller_run(sparse, prompts, 16, budget, None)
            report[f"n16_every_{k}"] = {
                "throughput_ratio": run["tokens_per_s"] / plain,
                "elicitation_tokens_per_cot_token": run["elicitation_tokens_per_cot_token"],
                "verifier_share": run["verifier_share"],
            }
    n_values = (8,) if quick else (16, 64)
    report["goals_met"] = {f"throughput_ge_0.7_n{n}": report[f"n{n}"]["throughput_ratio"] >= 0.7 for n in n_values}
    report["goals_met"] |= {
        f"wall_le_0.85_within_2pp_n{n}": report[f"n{n}"]["wall_ratio"] <= 0.85
        and report[f"n{n}"]["accuracy_stop"] >= report[f"n{n}"]["accuracy_full"] - 0.02
        for n in n_values
    }
    return report


def gpu_mode(smoke: bool) -> dict:
    import torch
    from transformers import AutoTokenizer, LlamaConfig

    import hf_msv.testbed
    from hf_msv.configuration_msv import ElicitationSettings, MSVConfig
    from hf_msv.modeling_msv import MSVVerifier
    from hf_msv.vllm import VLLMController

    tokenizer = AutoTokenizer.from_pretrained(Path(hf_msv.testbed.__file__).parent / "lm-v2")
    shape = (
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
        if smoke
        else dict(
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
        )
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=4608,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
        **shape,
    )
    directory = Path(tempfile.mkdtemp(prefix="msv-vllm-"))
    config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    device_options = (
        dict(dtype="float32", enforce_eager=True, kv_cache_memory_bytes=256 << 20)
        if smoke
        else dict(dtype="bfloat16", gpu_memory_utilization=0.85)
    )
    llm = make_engine(directory, load_format="dummy", **device_options)
    n_values, budget, problems = ((4,), 96, 2) if smoke else ((16, 64), 4096 - 128, 16)
    every_k = 32 if smoke else 256
    torch.manual_seed(0)
    elicitation = ElicitationSettings(delimiters=(), every_k_tokens=every_k)
    heads = {} if not smoke else dict(num_attention_heads=2, intermediate_size=128, gamma_hidden_size=8)
    verifier = MSVVerifier(
        MSVConfig(hidden_size=config.hidden_size, num_sequences=16, elicitation=elicitation, **heads)
    )
    verifier = verifier.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    controller = VLLMController(llm, tokenizer, verifier, checker="exact")
    prompts = [f"Q: {i}+{i}*3=?\nA:" for i in range(problems)]
    ids = [controller.encode(p) for p in prompts]
    controller.generate(prompts[:1], num_sequences=2, max_new_tokens=16)  # warm-up
    report = {
        "mode": "smoke" if smoke else "gpu",
        "model_shape": shape,
        "every_k_tokens": every_k,
        "max_new_tokens": budget,
        "problems": problems,
    }
    for n in n_values:
        plain = plain_vllm(llm, ids, n, budget)
        full, _ = controller_run(controller, prompts, n, budget, None)
        report[f"n{n}"] = {
            "plain_tokens_per_s": plain["tokens_per_s"],
            "controller_tokens_per_s": full["tokens_per_s"],
            "throughput_ratio": full["tokens_per_s"] / plain["tokens_per_s"],
            "elicitation_verifier_share": full["elicitation_share"] + full["verifier_share"],
            "answers": full["answers"],
        }
    last = report[f"n{n_values[-1]}"]
    report["goals_met"] = {
        "throughput_ge_0.85": last["throughput_ratio"] >= 0.85,
        "elicitation_verifier_le_5pct": last["elicitation_verifier_share"] <= 0.05,
    }
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="CPU mode, 4 problems, N = 8 (CI).")
    group.add_argument("--gpu", action="store_true", help="GPU mode: paper-shaped random LM.")
    group.add_argument("--smoke", action="store_true", help="GPU mode's code on CPU with a tiny config.")
    parser.add_argument("--verifier", default=None, help="CPU mode: a streaming MSV with its stopping rule.")
    parser.add_argument("--problems", type=int, default=None, help="CPU mode: problems (default 32; 4 with --quick).")
    parser.add_argument("--no-demo", action="store_true", help="CPU mode: leave out the `hf-msv demo` comparison.")
    args = parser.parse_args()
    if args.gpu or args.smoke:
        report = gpu_mode(args.smoke)
    else:
        report = cpu_mode(args.quick, args.verifier, args.problems, demo=not args.no_demo)

    print(json.dumps(rounded(report)))


if __name__ == "__main__":
    main()
