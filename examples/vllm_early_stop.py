"""Early stopping with vLLM: the shipped testbed LM sampled by a vLLM engine, 16 chains per problem, answers
elicited at "Wait", scored by the shipped MSV_16, every chain of a problem stopped once an answer reaches λ.

    bash scripts/setup_vllm.sh && .venv-vllm/bin/python examples/vllm_early_stop.py [--quick]
"""

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 problems, 4 chains each")
    args = parser.parse_args()
    from vllm import LLM

    import hf_msv.testbed
    from hf_msv import MSVVerifier
    from hf_msv.testbed import TESTBED_VERIFIER_DIR, format_prompt
    from hf_msv.testbed.tasks import get_task
    from hf_msv.vllm import VLLMController

    lm = Path(hf_msv.testbed.__file__).parent / "lm-v2"
    lam = json.loads((TESTBED_VERIFIER_DIR / "early_stopping.json").read_text())["lambda"]
    llm = LLM(
        model=str(lm),
        dtype="float32",
        enable_prefix_caching=True,
        block_size=32,
        seed=0,
        kv_cache_memory_bytes=256 << 20,
    )
    verifier = MSVVerifier.from_pretrained(TESTBED_VERIFIER_DIR).eval()
    controller = VLLMController(llm, verifier=verifier)  # delimiters, prompt, answer cap: the verifier's
    problems = get_task("v2").generate_problems("evaluation", 2 if args.quick else 4, seed=0)
    results = controller.generate(
        [format_prompt(p) for p in problems], num_sequences=4 if args.quick else 16, max_new_tokens=272, threshold=lam
    )
    for problem, result in zip(problems, results):
        chosen = result.chosen.text if result.chosen else None
        print(
            f"{problem.question!r}: chose {chosen!r} (gold {problem.gold!r}, score {result.confidence:.2f}), "
            f"stopped early: {result.stopped_early} at step {result.stop_step}, "
            f"{result.tokens_decoded} of {result.token_budget} tokens"
        )


if __name__ == "__main__":
    main()
