"""How long answers wait on a full vLLM engine, with and without the controller's elicitation reserve
(docs/vllm.md "Admission").

P testbed evaluation problems × N chains on a CPU engine of ``--max-num-seqs`` sequences (default 16 × 64 chains
in 1024), the shipped MSV_16 at its λ. Per ``elicitation_reserve`` (0: every prompt's chains sent at once; the
default 0.25), full decoding and early stopping: each answer's wait (engine steps from its delimiter to its
availability beyond the 1 + L its elicitation takes when scheduled at once; mean and 90th percentile), the tokens
early stopping saved against the full run, the engine steps and the wall time. Unseeded (the CPU engine's chunked
prefill), so the runs sample different chains. Last line: JSON.

    OMP_NUM_THREADS=2 .venv-vllm/bin/python research/vllm_admission.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from vllm_controller import make_engine


def waits(results) -> np.ndarray:
    """Engine steps each answer waited beyond the 1 + L of an elicitation scheduled at once."""
    return np.array([a.end - a.tau - 1 - len(a.token_ids) for r in results for a in r.answers], dtype=float)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("-n", "--num-sequences", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=1024)
    parser.add_argument("--reserves", type=float, nargs="+", default=[0.0, 0.25])
    args = parser.parse_args()

    import hf_msv.testbed
    from hf_msv.generation import MSVEarlyStop
    from hf_msv.modeling_msv import MSVVerifier
    from hf_msv.testbed import TESTBED_VERIFIER_DIR, format_prompt
    from hf_msv.testbed.tasks import get_task
    from hf_msv.vllm import VLLMController

    verifier = MSVVerifier.from_pretrained(TESTBED_VERIFIER_DIR).eval()
    lam = MSVEarlyStop.from_verifier(verifier).threshold
    task = get_task("v2")
    prompts = [format_prompt(p) for p in task.generate_problems("evaluation", args.problems, seed=0)]
    budget = task.sampling_cap() or 400
    lm = Path(hf_msv.testbed.__file__).parent / "lm-v2"
    llm = make_engine(
        lm, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=2 << 30, max_num_seqs=args.max_num_seqs
    )
    report = {"problems": args.problems, "n": args.num_sequences, "max_num_seqs": args.max_num_seqs, "lambda": lam}
    for reserve in args.reserves:
        controller = VLLMController(llm, None, verifier, checker="symbolic", elicitation_reserve=reserve)
        runs = {}
        for name, threshold in (("full", None), ("stop", lam)):
            start = time.perf_counter()
            results = controller.generate(
                prompts, num_sequences=args.num_sequences, max_new_tokens=budget, threshold=threshold
            )
            wait = waits(results)
            runs[name] = {
                "wait_mean": float(wait.mean()),
                "wait_p90": float(np.percentile(wait, 90)),
                "tokens": sum(r.tokens_decoded for r in results),
                "steps": results[0].compute["forward_calls"],
                "wall_s": time.perf_counter() - start,
            }
        runs["tokens_saved"] = 1 - runs["stop"]["tokens"] / runs["full"]["tokens"]
        report[f"reserve_{reserve}"] = runs
        print(f"reserve {reserve}: {json.dumps(runs)}", flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
