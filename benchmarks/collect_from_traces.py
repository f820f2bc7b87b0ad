"""Re-encoding sampled traces (`collect_from_traces`) against live collection (`collect`) on the default LM.

Live collection samples P problems × N chains of thought with the generation hook and writes shards; they are
exported to a trace file (`traces_from_shards`, the token ids sampled live) and re-encoded into a second set of
shards with the same elicitation settings. Reported:

* ``live_samples_per_s`` / ``reencode_samples_per_s``: sequences (chains of thought) per wall second of each, shard
  writing included; ``speedup`` = their ratio (goal ≥ 3);
* ``answers``, ``answer_mismatches``: answers in the live shards and how many differ after re-encoding (answer
  tokens, text, τ, end, class or label; goal 0), ``max_hidden_diff``: the largest difference of a stored (bf16) state;
* ``reencode_forwards``: LM forward calls of re-encoding (prefill chunks + elicitation steps), a machine-independent
  cost figure, next to the ``cot_tokens`` and ``answer_tokens`` both produce.

The LM is the default named LM (``testbed``) on its own problems, sampled up to its own budget by default. Both run
with one torch thread (the benchmark machine is shared); the best of ``--repeats`` runs of each is kept.

    python benchmarks/collect_from_traces.py                  # 4 problems × 16 samples
    python benchmarks/collect_from_traces.py --problems 8 -n 32
    python benchmarks/collect_from_traces.py --quick          # 2 problems × 8 samples, one run

Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hf_msv.collect import (
    CollectConfig,
    collect,
    collect_from_traces,
    load_lm,
    load_problems,
    traces_from_shards,
    write_traces,
)
from hf_msv.collect.reencode import TraceReencoder
from hf_msv.data import list_shards, read_shard

LM = "testbed"  # the default named LM


def problems_by_id(directory) -> dict:
    return {p.problem_id: p for f in list_shards(directory) for p in read_shard(f)[0]}


def mismatches(live: dict, mine: dict) -> tuple[int, float]:
    """Answers that differ (tokens, text, τ, end, class, label) and the largest stored hidden-state difference."""
    bad, diff = 0, 0.0
    for pid, a in live.items():
        b = mine[pid]
        if b.num_answers != a.num_answers:
            bad += a.num_answers
            continue
        for i in range(a.num_answers):
            sa, sb = a.answer_token_start[i], b.answer_token_start[i]
            same = (
                a.answer_text[i] == b.answer_text[i]
                and a.answer_tau[i] == b.answer_tau[i]
                and a.answer_end[i] == b.answer_end[i]
                and a.answer_class[i] == b.answer_class[i]
                and a.answer_correct[i] == b.answer_correct[i]
                and np.array_equal(
                    a.token_ids[sa : sa + a.answer_length[i]], b.token_ids[sb : sb + b.answer_length[i]]
                )
            )
            bad += not same
        if a.hidden_states.shape == b.hidden_states.shape:
            diff = max(diff, (a.hidden_states.float() - b.hidden_states.float()).abs().max().item())
    return bad, diff


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=4)
    parser.add_argument("-n", "--num-samples", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the LM's own budget")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2 problems x 8 samples, one run")
    args = parser.parse_args()
    if args.quick:
        args.problems, args.num_samples, args.repeats = 2, 8, 1
    torch.set_num_threads(1)
    model, tokenizer = load_lm(LM, device="cpu")
    problems = load_problems(f"{LM}:evaluation:{args.problems}:{args.seed}")
    config = CollectConfig(
        model=LM,
        num_samples=args.num_samples,
        max_new_tokens=args.max_new_tokens,
        delimiters=["Wait"],
        checker="exact",
        problems_per_shard=args.problems,
        seed=args.seed,
        progress=False,
        overwrite=True,
    ).resolved()
    work = Path(tempfile.mkdtemp(prefix="bench_traces_"))
    try:
        live_s, re_s = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            live = collect(model, tokenizer, problems, work / "live", config)
            live_s.append(time.perf_counter() - start)
            path = write_traces(work / "traces.jsonl", traces_from_shards(work / "live"))
            forwards = []
            original = TraceReencoder.answers

            def counted(self, traces, _original=original, _forwards=forwards):  # count this run's LM forwards
                out = _original(self, traces)
                _forwards.append(self.forwards)
                return out

            TraceReencoder.answers = counted
            try:
                start = time.perf_counter()
                mine = collect_from_traces(model, tokenizer, path, work / "re", config)
                re_s.append(time.perf_counter() - start)
            finally:
                TraceReencoder.answers = original
        bad, diff = mismatches(problems_by_id(work / "live"), problems_by_id(work / "re"))
        samples = args.problems * args.num_samples
        live_rate, re_rate = samples / min(live_s), samples / min(re_s)
        print(
            f"{LM} LM, {args.problems} problems x {args.num_samples} samples (up to {config.max_new_tokens} "
            "tokens), 1 thread"
        )
        print(
            f"live collection: {min(live_s):.2f} s ({live_rate:.1f} samples/s, {live.tokens} CoT tokens, "
            f"{live.answers} answers)"
        )
        print(f"re-encoding:     {min(re_s):.2f} s ({re_rate:.1f} samples/s, {forwards[-1]} LM forwards)")
        print(
            f"speedup {re_rate / live_rate:.2f}x; answer mismatches {bad} of {live.answers}; "
            f"max stored hidden-state difference {diff:.3g}"
        )
        print(
            json.dumps(
                {
                    "lm": LM,
                    "problems": args.problems,
                    "num_samples": args.num_samples,
                    "max_new_tokens": config.max_new_tokens,
                    "cut_sequences": live.cut_sequences,
                    "threads": 1,
                    "cot_tokens": live.tokens,
                    "answers": live.answers,
                    "answer_tokens": live.answer_tokens,
                    "live_s": min(live_s),
                    "reencode_s": min(re_s),
                    "live_samples_per_s": live_rate,
                    "reencode_samples_per_s": re_rate,
                    "speedup": re_rate / live_rate,
                    "answer_mismatches": bad,
                    "max_hidden_diff": diff,
                    "reencode_forwards": forwards[-1],
                    "reencode_answers": mine.answers,
                }
            )
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
