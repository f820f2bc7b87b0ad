"""Speed and robustness of answer equivalence checking (CPU, well under a minute).

    python benchmarks/equivalence.py [--timeout 2.0]
    python benchmarks/equivalence.py --quick    # 14 hostile inputs, one warm repeat, --timeout 0.5

Measures, with the ``symbolic`` checker (workers started beforehand):

* ``group64_ms``: assigning classes to 64 answers with at most 10 distinct strings (one group of one problem), warm:
  the answers were seen before, as at every delimiter of a streaming run (median of 5);
  ``group64_cold_ms``: the same with the pair-verdict cache cleared (a new group);
* ``group64_distinct_ms``: 64 distinct LaTeX answers (MATH-500 gold answers when the data is there), cold;
* hostile inputs (unbalanced braces, 10^6 characters, power towers, deep fractions, control characters, odd unicode,
  lone surrogates) against each other and against ordinary answers: ``crashes`` (exceptions out of the checker),
  ``false_equal`` (judged equal while not the same answer), ``max_check_cpu_s`` (most worker CPU time one check
  used; goal: at most ``timeout`` + the retry's 3 × ``timeout`` + 0.5 s), ``max_check_s`` (its wall-clock
  counterpart, which grows with the machine's load), and the checker's counters (``retries``, ``timeouts``,
  ``stalled``).

The last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from hf_msv.data.problems import load_benchmark
from hf_msv.equivalence import Verdict, assign_classes, get_checker

# Equal under Math-Verify's reading, so not counted as false: an assignment chain is its last value, 0^0 = 1.
EQUAL_READINGS = {frozenset(p) for p in [("x=" * 200 + "1", "1"), ("0^0", "1"), ("x=" * 200 + "1", "0^0")]}

GROUP_ANSWERS = [  # one problem's answers: several spellings of the same values, a few wrong ones, no answer
    "\\frac{1}{2}",
    "0.5",
    "\\dfrac{1}{2}",
    "\\frac{\\sqrt{2}}{2}",
    "\\frac{1}{\\sqrt{2}}",
    "1",
    "2\\sqrt{2}",
    "\\sqrt{8}",
    "(1, 2)",
    None,
]


def hostile_answers() -> list[str]:
    return [
        "{" * 500,
        "}" * 500,
        "\\frac{1}{2",
        "\\frac}{",
        "\\left( 1, 2",
        "\\boxed{\\boxed{",
        "9" * 10**6,
        "x+" * 300_000 + "1",
        "9^{9^{9^{9}}}",
        "9^{9^{9}}",
        "10^{10^{10}}",
        "2^{2^{2^{2^{2}}}}",
        "9^9^9^9",
        "100000!",
        "(10^{10})!",
        "\\frac{1}{" * 200 + "2" + "}" * 200,
        "(" * 400 + "1" + ")" * 400,
        "\\sqrt{" * 300 + "2" + "}" * 300,
        "1\x00",
        "\x1b[31m5",
        "\x7f\x08",
        "\u202e5",
        "５",
        "½",
        "\u200b1",
        "🙂",
        "\ud800",
        "1\udfff2",
        "\\begin{pmatrix}" + "1&" * 200 + "1\\end{pmatrix}",
        "\\int_0^\\infty e^{-x^{2}}\\,dx",
        "x=" * 200 + "1",
        "\\\\" * 500,
        "$" * 100,
        "",
        " ",
        "\\",
        "NaN",
        "\\infty-\\infty",
        "0^0",
        "1/0",
    ]


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="CPU seconds per check, the retry gets 3x (default 2.0; 0.5 with --quick)",
    )
    parser.add_argument("--quick", action="store_true", help="14 hostile inputs, one warm repeat, timeout 0.5 s")
    args = parser.parse_args()
    if args.timeout is None:
        args.timeout = 0.5 if args.quick else 2.0
    if not args.timeout > 0:
        parser.error(f"--timeout must be > 0, got {args.timeout}")

    checker = get_checker("symbolic", timeout=args.timeout)
    _, warmup_s = timed(checker.warmup)
    print(f"worker start: {warmup_s:.2f} s")

    rng = random.Random(0)
    group = rng.choices(GROUP_ANSWERS, weights=[20, 10, 5, 6, 4, 6, 4, 3, 3, 3], k=64)
    classes, cold = timed(assign_classes, group, checker)
    warm = statistics.median(timed(assign_classes, group, checker)[1] for _ in range(1 if args.quick else 5))
    print(
        f"group of 64 answers, {len(set(group))} distinct strings, {max(classes) + 1} classes: "
        f"cold {cold * 1e3:.1f} ms, warm {warm * 1e3:.2f} ms"
    )

    try:
        distinct = list(dict.fromkeys(p.gold for p in load_benchmark("math500")))[:64]
        source = "MATH-500 gold answers"
    except FileNotFoundError:
        distinct = [f"\\frac{{{i}\\sqrt{{{i + 1}}}}}{{{i + 2}}} + {i}x^{{2}}" for i in range(64)]
        source = "synthetic expressions"
    checker.clear_cache()
    distinct_classes, distinct_s = timed(assign_classes, distinct, checker)
    print(f"64 distinct answers ({source}): {distinct_s * 1e3:.0f} ms, {max(distinct_classes) + 1} classes")

    hostile = hostile_answers()[:: 3 if args.quick else 1]
    ordinary = ["1", "\\frac{1}{2}", "x+1", "(1,2)", None]
    crashes = false_equal = unverifiable = checks = 0
    max_check = max_check_cpu = 0.0
    checker.reset_stats()
    for i, h in enumerate(hostile):
        for other in [h, *hostile[i + 1 :], *ordinary]:
            for call in (checker.compare, checker.equivalent, checker.is_correct):
                cpu_before = checker.stats["worker_cpu_s"]
                try:
                    verdict, seconds = timed(call, h, other)
                except Exception as e:  # the checker promises never to raise
                    crashes += 1
                    print(f"crash on {h[:20]!r} vs {str(other)[:20]!r}: {e!r}")
                    continue
                checks += 1
                max_check = max(max_check, seconds)
                max_check_cpu = max(max_check_cpu, checker.stats["worker_cpu_s"] - cpu_before)
                if (verdict is Verdict.EQUAL or verdict is True) and other != h and {h, other} not in EQUAL_READINGS:
                    false_equal += 1
                    print(f"judged equal: {h[:20]!r} vs {str(other)[:20]!r} ({call.__name__})")
                unverifiable += verdict is Verdict.UNVERIFIABLE
    print(
        f"hostile: {len(hostile)} inputs, {checks} checks, {crashes} crashes, {false_equal} judged equal to "
        f"another answer, {unverifiable} unverifiable, slowest check {max_check_cpu:.2f} s CPU / {max_check:.2f} s "
        f"wall (timeout {args.timeout} s CPU)"
    )
    stats = checker.stats

    print(
        json.dumps(
            {
                "group64_ms": round(warm * 1e3, 3),
                "group64_cold_ms": round(cold * 1e3, 1),
                "group64_distinct_ms": round(distinct_s * 1e3, 1),
                "hostile_inputs": len(hostile),
                "crashes": crashes,
                "false_equal": false_equal,
                "max_check_cpu_s": round(max_check_cpu, 3),
                "max_check_s": round(max_check, 3),
                "retries": stats["retries"],
                "timeouts": stats["timeouts"],
                "stalled": stats["stalled"],
                "timeout_s": args.timeout,
                "quick": args.quick,
                "worker_start_s": round(warmup_s, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
