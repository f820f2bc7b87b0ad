"""Peak memory of one streaming MSV forward+backward at the paper's largest setting.

N=64 sequences × 20 answers × 40 tokens ≈ 51k answer tokens at d=1536 (bf16). A dense (T×T) mask alone would be
~10 GiB per mask per head; the chunked attention never materialises one.
Last line: JSON with tokens, hidden_size, peak_rss_gib, seconds. ``--quick``: 4 sequences x 4 answers x 8 tokens at
d=64 (checks the script, not a measurement).
"""

import argparse
import json
import resource
import time

import torch
from _streams import synthetic_stream

from hf_msv import MSVConfig, MSVVerifier


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--answers-per-sequence", type=int, default=20)
    parser.add_argument("--answer-tokens", type=int, default=40)
    parser.add_argument("--hidden-size", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (checks the script, not a measurement)")
    args = parser.parse_args()
    if args.quick:
        args.sequences, args.answers_per_sequence, args.answer_tokens, args.hidden_size, args.heads = 4, 4, 8, 64, 4
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    verifier = (
        MSVVerifier(
            MSVConfig(
                hidden_size=args.hidden_size,
                num_attention_heads=args.heads,
                num_sequences=args.sequences,
                mode="streaming",
            )
        )
        .to(dtype)
        .train()
    )
    stream = synthetic_stream(
        args.sequences, args.answers_per_sequence, args.answer_tokens, args.hidden_size, dtype=dtype
    )
    labels = torch.randint(0, 2, (len(stream["answer_end"]),)).float()
    tokens = len(stream["token_answer"])
    dense_gib = args.heads * tokens**2 * 4 / 2**30

    t0 = time.perf_counter()
    loss = verifier(**stream, labels=labels).loss
    loss.backward()
    seconds = time.perf_counter() - t0
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in verifier.parameters())
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux
    print(
        f"{tokens} answer tokens, d={args.hidden_size}, {args.dtype}: forward+backward {seconds:.0f} s, "
        f"peak RSS {peak_gib:.2f} GiB (one dense fp32 score tensor would need {dense_gib:.0f} GiB)"
    )
    print(
        json.dumps(
            {
                "tokens": tokens,
                "hidden_size": args.hidden_size,
                "dtype": args.dtype,
                "peak_rss_gib": round(peak_gib, 2),
                "seconds": round(seconds, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
