"""Online (KV-cached) vs offline streaming MSV scoring at the paper's width.

N=64 sequences, d=1536, 12 heads; the cache grows to >= 20k answer tokens. For each new answer, the offline
algorithm recomputes the forward over every answer so far; the online one queries only the new tokens.
Last line: JSON with online_ms_per_answer, offline_ms_per_answer, speedup, max_abs_diff. ``--quick``: 8 sequences x
4 answers x 8 tokens at d=64 (checks the script and the online/offline agreement, not the speed-up).
"""

import argparse
import json
import time

import torch
from _streams import arrival_batches, select_answers, synthetic_stream

from hf_msv import MSVCache, MSVConfig, MSVVerifier


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--answers-per-sequence", type=int, default=16)
    parser.add_argument("--answer-tokens", type=int, default=20)
    parser.add_argument("--hidden-size", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--timed-answers", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="tiny shapes (checks the script, not a measurement)")
    args = parser.parse_args()
    if args.quick:
        args.sequences, args.answers_per_sequence, args.answer_tokens, args.hidden_size, args.heads = 8, 4, 8, 64, 4
        args.timed_answers = 4
    torch.manual_seed(0)
    verifier = MSVVerifier(
        MSVConfig(
            hidden_size=args.hidden_size,
            num_attention_heads=args.heads,
            num_sequences=args.sequences,
            mode="streaming",
        )
    ).eval()
    stream = synthetic_stream(args.sequences, args.answers_per_sequence, args.answer_tokens, args.hidden_size)
    num_answers = len(stream["answer_end"])
    batches = list(arrival_batches(stream, 64))
    units = list(arrival_batches(stream, 1))  # one answer at a time, unless several end at the same step
    timed = units[-args.timed_answers :]
    warm = timed[0][0]

    with torch.no_grad():
        cache, online = MSVCache(), []
        for start, stop in batches:  # fill the cache in arrival order, ~64 answers at a time
            stop = min(stop, warm)
            if start < stop:
                online.append(
                    verifier(**select_answers(stream, start, stop), past_key_values=cache, use_cache=True).logits
                )
        times = []
        for start, stop in timed:  # then time single arrivals against the full cache
            t0 = time.perf_counter()
            online.append(
                verifier(**select_answers(stream, start, stop), past_key_values=cache, use_cache=True).logits
            )
            times.append((time.perf_counter() - t0) / (stop - start))
        online = torch.cat(online)
        t0 = time.perf_counter()
        offline = verifier(**stream).logits  # what the offline algorithm pays for each new answer
        offline_s = time.perf_counter() - t0

    online_ms = 1000 * sorted(times)[len(times) // 2]
    result = {
        "sequences": args.sequences,
        "hidden_size": args.hidden_size,
        "cached_tokens": cache.num_tokens,
        "online_ms_per_answer": round(online_ms, 2),
        "offline_ms_per_answer": round(1000 * offline_s, 1),
        "speedup": round(1000 * offline_s / online_ms, 1),
        "max_abs_diff": float((online - offline).abs().max()),
    }
    print(
        f"cache of {cache.num_tokens} answer tokens ({num_answers} answers, N={args.sequences}, "
        f"d={args.hidden_size}): online {online_ms:.1f} ms/answer (median of {len(times)}), "
        f"offline recompute {offline_s * 1000:.0f} ms/answer"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
