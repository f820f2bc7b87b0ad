"""Collection on vLLM at the engine size `hf-msv collect --engine vllm` picks, against vLLM's own default
``max_num_seqs`` (docs/vllm.md "Admission"), and against the same collection with vLLM's own top-k log-probs
returned for every chain token (the route to DeepConf's confidence the controller does not take). Last stdout line:
JSON.

The controller sends a prompt's N chains only while they fit in its chain slots, (1 − the elicitation reserve) ×
``max_num_seqs``; on the CPU backend vLLM's default of 256 sequences leaves 192, so a batch of 8 prompts × 64 chains
runs three prompts at a time and a prompt waits for a whole prompt to end. The command line sizes the engine to the
batch (`hf_msv.vllm.collect.batch_sequences`). Per setting, in a process of its own (one in-process engine per
process), the testbed LM's collection of the same problems (float32, DeepConf confidences and hidden states
recorded, as the studies collect): wall seconds, engine steps (machine-independent: a step's cost grows with its
rows, so fewer, fuller steps are the saving), CoT tokens per step; ``steps_ratio`` and ``wall_ratio`` = sized ÷
vLLM's default; ``logprobs_wall_ratio`` = sized ÷ sized with ``logprobs=k`` in the chains' sampling parameters
(vLLM then builds k + 1 log-prob objects per token; the confidences are computed in the engine either way).
Unseeded (the CPU build), so the runs may sample different chains.

    OMP_NUM_THREADS=2 .venv-vllm/bin/python benchmarks/vllm_collection.py            # 16 problems x 64, 8 per batch
    .venv-vllm/bin/python benchmarks/vllm_collection.py --quick    # 4 x 8, 4 per batch, against an engine of 16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _report import rounded  # benchmarks/ is the script's directory

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def child(args) -> dict:
    """One collection at ``args.max_num_seqs`` (0: what the command line picks) in this process; with
    ``args.vllm_logprobs``, vLLM also returns each chain token's top-k log-probs."""
    import vllm

    import hf_msv.testbed
    from hf_msv.data.sources import load_problems
    from hf_msv.vllm import VLLMController, collect_with_vllm
    from hf_msv.vllm.cli import engine_arguments

    if args.vllm_logprobs:
        chain_params = VLLMController.chain_params

        def with_logprobs(self, *a, **kw):
            params = chain_params(self, *a, **kw)
            params.logprobs = self.confidence_top_k
            return params

        VLLMController.chain_params = with_logprobs

    kwargs = engine_arguments([], args.per_batch * args.num_samples)
    if args.max_num_seqs:
        kwargs["max_num_seqs"] = args.max_num_seqs
    lm = Path(hf_msv.testbed.__file__).parent / "lm-v2"
    llm = vllm.LLM(model=str(lm), dtype="float32", seed=0, kv_cache_memory_bytes=2 << 30, **kwargs)
    engine, steps = llm.llm_engine, [0]
    step = engine.step

    def counted_step():  # the controller drives LLMEngine.step itself: count its calls
        steps[0] += 1
        return step()

    engine.step = counted_step
    problems = load_problems(f"testbed:evaluation:{args.problems}:{args.seed}")
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        result = collect_with_vllm(
            llm,
            problems,
            out,
            num_samples=args.num_samples,
            problems_per_batch=args.per_batch,
            max_new_tokens=args.max_new_tokens,
            prompt_template="testbed",
            checker="symbolic",
            progress=False,
        )
        seconds = time.perf_counter() - start
    return {
        "max_num_seqs": llm.llm_engine.vllm_config.scheduler_config.max_num_seqs,
        "seconds": seconds,
        "engine_steps": steps[0],
        "cot_tokens": result.tokens,
        "cot_tokens_per_step": result.tokens / max(1, steps[0]),
    }


def run(args, max_num_seqs: int, vllm_logprobs: bool = False) -> dict:
    """`child` in a subprocess; its last stdout line."""
    command = [sys.executable, __file__, "--child", "--max-num-seqs", str(max_num_seqs)]
    command += ["--vllm-logprobs"] if vllm_logprobs else []
    for name in ("problems", "num_samples", "per_batch", "max_new_tokens", "seed"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--max-num-seqs", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--vllm-logprobs", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--num-samples", type=int, default=64)
    parser.add_argument("--per-batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=272)
    parser.add_argument("--seed", type=int, default=2024)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    # vLLM's CPU default, or (quick) an engine too small for 4 × 8 chains, against the command line's size.
    default = 16 if args.quick else 256
    if args.quick:
        args.problems, args.num_samples, args.per_batch, args.max_new_tokens = 4, 8, 4, 120
    small, sized, logprobs = run(args, default), run(args, 0), run(args, 0, vllm_logprobs=True)
    report = {
        "problems": args.problems,
        "num_samples": args.num_samples,
        "problems_per_batch": args.per_batch,
        "default": small,
        "sized": sized,
        "sized_vllm_logprobs": logprobs,
        "steps_ratio": sized["engine_steps"] / small["engine_steps"],
        "wall_ratio": sized["seconds"] / small["seconds"],
        "logprobs_wall_ratio": sized["seconds"] / logprobs["seconds"],
    }
    print(json.dumps(rounded(report, 3)))


if __name__ == "__main__":
    main()
