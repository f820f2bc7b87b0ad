"""MSV generation on a GPU: where wall time goes at the paper's shape (skips cleanly without CUDA).

A random-weight LM of DeepSeek-R1-Distill-Qwen-1.5B's shape (Qwen2, 28 layers, width 1536, 12 heads, 2 KV heads,
MLP 8960, the real 151,936-token vocabulary so the LM head costs what it costs), bf16, one prompt, N = 64
sequences, 4,096 decode steps (EOS banned, so every run decodes exactly that many). Each row's "Wait" is forced every
150–300 steps at independent offsets and every answer is scripted to 12 tokens (`generation_overhead.py`'s
schedule: a random LM neither says "Wait" nor closes a box). An MSV_64 of the same width scores answers online.

Measured, each after a warm-up run:

* ``plain_seconds``: plain ``model.generate`` under the same forced schedule (no hf_msv);
* ``hook_seconds``: the same call with ``prepare_generation`` attached but no delimiter (terminal mode, no verifier):
  the loop's own overhead; ``hook_overhead_ratio`` = CoT part of it ÷ plain;
* the full MSV run: CoT, elicitation, verifier and equivalence seconds (``MSVResult.timings``), LM forward calls,
  ``elicitation_time_ratio`` = elicitation ÷ CoT (the paper measured 2.9 % on an A6000), ``verifier_time_ratio``;
  ``msv_over_hook`` = the MSV run ÷ the hooked run: what delimiters, elicitation and the verifier add in wall time.
  Elicitation rides in the chain of thought's forward calls (`lockstep`), and ``timings["elicitation"]`` charges it
  the branch rows' share of each shared forward (by rows): the cost on a device whose forward time grows with rows
  (a CPU), an over-count where a forward of 64 + k rows takes as long as one of 64 (a GPU at decode sizes), so
  ``msv_over_hook`` is the figure to read there;
* ``elicit_only_seconds``: the MSV run's elicitation without the verifier; ``elicitation_wall_ratio`` = (it − the
  hooked run) ÷ the hooked run's CoT time and ``scoring_wall_ratio`` = (the MSV run − it) ÷ the same: elicitation's
  and scoring's cost in wall time, with no timer apportioning shared forwards;
* ``forward_*``: one decoding forward of N + 4 rows at half the steps' context, plain (``forward_plain_ms``) and ÷
  plain with a masked cache slot, with hidden states returned, with both (``step_work.forward_variants``);
* peak accelerator memory (``torch.cuda.max_memory_allocated``) of the plain and the MSV runs.

Six decodes of ``--steps`` steps in all (two plain, one hooked, two MSV, one without the verifier). Each figure is
printed as soon as it is measured, so a run stopped by a time limit still reports the phases it finished. On one
H200, 512 steps, with five decodes: plain 23.6 ms a step, ``msv_over_hook`` 1.195, 1.039 forwards per CoT step, the
whole script ~3 min (the 1.5B model's initialisation on the host and a 37 s first decode included); 1,024 steps
outlast 200 s.

Usage::

    python benchmarks/generation_gpu.py                  # N = 64, 4,096 steps
    python benchmarks/generation_gpu.py --steps 1024     # shorter
    python benchmarks/generation_gpu.py --smoke          # tiny shapes on the CPU: checks the script, measures nothing
    python benchmarks/generation_gpu.py --profile        # only the MSV run, under cProfile: where its time goes

Last line: JSON (``{"skipped": ...}`` without CUDA).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

import torch

# generation_overhead.py sits beside this file (benchmarks/ is sys.path[0] when run as a script).
from generation_overhead import (
    ForwardCounter,
    ScriptedAnswers,
    build_tokenizer,
    forced_runs,
    lm_config,
    random_lm,
)
from step_work import forward_variants

from hf_msv import MSVConfig, MSVVerifier

VOCAB = 151_936


def timed(fn, cuda: bool):
    """(fn(), seconds, peak accelerator bytes during the call; 0 on the CPU)."""
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return out, time.perf_counter() - start, torch.cuda.max_memory_allocated() if cuda else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-sequences", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4096)
    parser.add_argument(
        "--smoke", "--quick", dest="smoke", action="store_true", help="tiny shapes on the CPU (checks the script only)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run only the MSV decode (after a warm-up) under cProfile and print its hottest functions",
    )
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        print("no CUDA device: nothing to measure (--smoke runs tiny shapes on the CPU)")
        print(json.dumps({"skipped": "no CUDA device"}))
        return
    n, steps = (8, 200) if args.smoke else (args.num_sequences, args.steps)
    if args.smoke:
        torch.set_num_threads(1)  # tiny matmuls: more threads only contend
    device, dtype = (torch.device("cuda"), torch.bfloat16) if cuda else (torch.device("cpu"), torch.float32)
    shape = dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2
    )
    if args.smoke:
        shape = dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1
        )
    tokenizer = build_tokenizer(1000 if args.smoke else VOCAB, extra_words=("Wait",))
    model = random_lm(lm_config(len(tokenizer), **shape), dtype).to(device)
    torch.manual_seed(0)
    verifier = (
        MSVVerifier(
            MSVConfig(
                hidden_size=shape["hidden_size"],
                num_attention_heads=shape["num_attention_heads"],
                num_sequences=n,
                mode="streaming",
            )
        )
        .to(device, dtype)
        .eval()
    )
    inputs = tokenizer(["Question: find all real x with x^2 - 5x + 6 = 0."], return_tensors="pt").to(device)
    plain, hooked = forced_runs(model, tokenizer, inputs, n, steps)

    report = {
        "device": torch.cuda.get_device_name() if cuda else "cpu (smoke: tiny shapes, not a measurement)",
        "torch": torch.__version__,
        "num_sequences": n,
        "steps": steps,
        "answer_length": 12,
    }

    def record(**values):
        """Print each figure as soon as it is measured: a run cut short by a time limit still reports its phases."""
        for key, value in values.items():
            report[key] = value
            print(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}", flush=True)

    script = ScriptedAnswers(model, tokenizer, filler_tokens=10)
    if args.profile:
        profile_msv(hooked(verifier=verifier, delimiters=["Wait"], checker="exact"), cuda, record)
        script.handle.remove()
        print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in report.items()}))
        return
    try:
        _, warm_s, _ = timed(plain, cuda)  # warm-up (kernels, allocator)
        record(warmup_seconds=warm_s)
        _, plain_s, plain_peak = timed(plain, cuda)
        record(
            plain_seconds=plain_s, plain_ms_per_step=1000 * plain_s / steps, peak_memory_gib_plain=plain_peak / 2**30
        )
        hook, hook_s, _ = timed(hooked(mode="terminal", checker=None), cuda)
        record(hook_seconds=hook_s, hook_overhead_ratio=hook.timings["cot"] / plain_s)
        counter = ForwardCounter(model)
        msv_run = hooked(verifier=verifier, delimiters=["Wait"], checker="exact")
        msv_run()  # warm-up of the elicitation and verifier paths
        counter.calls = counter.rows = 0
        result, msv_s, msv_peak = timed(msv_run, cuda)
        counter.handle.remove()
        # The same elicitation without the verifier: what elicitation and scoring each add, in wall time.
        _, elicit_s, _ = timed(hooked(mode="streaming", delimiters=["Wait"], checker=None), cuda)
        record(elicit_only_seconds=elicit_s)
    finally:
        script.handle.remove()
    t = result.timings
    record(
        elicitation_wall_ratio=(elicit_s - hook_s) / hook.timings["cot"],
        scoring_wall_ratio=(msv_s - elicit_s) / hook.timings["cot"],
        answers=len(result.answers),
        msv_seconds=msv_s,
        cot_seconds=t["cot"],
        elicitation_seconds=t["elicitation"],
        verifier_seconds=t["verifier"],
        equivalence_seconds=t["equivalence"],
        elicitation_time_ratio=t["elicitation"] / t["cot"],
        verifier_time_ratio=t["verifier"] / t["cot"],
        msv_over_plain=msv_s / plain_s,
        msv_over_hook=msv_s / hook_s,
        forward_calls=counter.calls,
        forwards_per_cot_step=counter.calls / steps,
        peak_memory_gib_msv=msv_peak / 2**30,
    )
    # One decoding forward at this shape with what MSV steps ask of the LM (step_work.py's measurement).
    context = inputs["input_ids"].shape[1] + steps // 2
    record(
        **{f"forward_{k}": v for k, v in forward_variants(model, n + 4, context, 3, 10 if args.smoke else 30).items()}
    )
    print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in report.items()}))


def profile_msv(msv_run, cuda: bool, record):
    """Where the MSV decode's wall time goes: one warm-up, then one run under cProfile. On a GPU the device's work
    shows up as time in the calls that wait for it (``tolist``, ``item``, ``nonzero``), so the Python functions
    above those name the step that waited."""
    _, warm_s, _ = timed(msv_run, cuda)
    record(warmup_seconds=warm_s)
    profiler = cProfile.Profile()
    result, seconds, _ = timed(lambda: profiler.runcall(msv_run), cuda)
    record(profiled_seconds=seconds, **{f"{k}_seconds": v for k, v in result.timings.items()})
    for order in ("tottime", "cumulative"):
        pstats.Stats(profiler).strip_dirs().sort_stats(order).print_stats(30)


if __name__ == "__main__":
    main()
