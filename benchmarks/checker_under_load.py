"""Wall time per pair of the symbolic checker on hostile pairs while the machine is busy (CPU, about a minute).

    python benchmarks/checker_under_load.py                 # every pair, timeout 2.0 (the default)
    python benchmarks/checker_under_load.py --quick         # 4 pairs
    python benchmarks/checker_under_load.py --load 0        # no load, for comparison

The load is started by the benchmark itself: ``--load`` processes (default 2), each multiplying matrices with as many
BLAS threads as the machine has cores, so each is busy on every core it can take. Each pair is checked by a fresh
`SymbolicChecker` (workers warmed up first, no cached verdict) with its default settings; its wall time is measured
in this process, so parsing, normalisation and caching on the parent side count too. The goal: no pair takes more
than ``2.5 × timeout`` (5 s at the default 2 s).

The last line printed is the JSON summary: ``max_pair_s``, ``bound_s``, ``within_bound``, per-pair seconds and
verdicts, the load and the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PAIRS = [
    ("\\binom{100000}{50000}", "\\binom{100000}{50001}"),
    ("9^{9^{9^{9}}}", "9^{9^{9^{8}}}"),
    ("(1+x)^{2000}", "(x+1)^{2000}"),
    ("100000!", "99999!"),
    ("\\frac{" * 30 + "1" + "}{2}" * 30, "\\frac{1}{2}"),
    ("x+" * 3000 + "1", "1+" + "x+" * 3000),
    ("\\sum_{k=1}^{100000} k", "5000050000"),
    ("\\sqrt{2}^{\\sqrt{2}^{\\sqrt{2}^{\\sqrt{2}}}}", "2"),
]
QUICK_PAIRS = PAIRS[:4]
LOAD_CODE = (
    "import numpy as np\na = np.random.default_rng(0).random((1500, 1500))\nwhile True:\n    a = (a @ a) % 1.0\n"
)


def start_load(processes: int) -> list[subprocess.Popen]:
    """`processes` busy processes, each with one BLAS thread per core."""
    cores = str(os.cpu_count() or 1)
    env = dict(os.environ, OMP_NUM_THREADS=cores, OPENBLAS_NUM_THREADS=cores, MKL_NUM_THREADS=cores)
    return [subprocess.Popen([sys.executable, "-c", LOAD_CODE], env=env) for _ in range(processes)]


def time_pairs(pairs, timeout: float) -> list[dict]:
    """Each pair checked by a fresh checker (nothing cached): its wall seconds and verdict."""
    from hf_msv.equivalence.symbolic import SymbolicChecker

    rows = []
    for a, b in pairs:
        checker = SymbolicChecker(timeout=timeout)
        checker.warmup()
        start = time.perf_counter()
        verdict = checker.compare(a, b)
        rows.append(
            {"pair": [a[:40], b[:40]], "seconds": round(time.perf_counter() - start, 3), "verdict": verdict.name}
        )
        print(f"{rows[-1]['seconds']:7.2f} s  {verdict.name:13s} {a[:40]!r} vs {b[:40]!r}", file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 pairs")
    parser.add_argument("--timeout", type=float, default=2.0, help="the checker's timeout (CPU seconds)")
    parser.add_argument("--load", type=int, default=2, help="busy processes started during the measurement")
    args = parser.parse_args()
    load = start_load(args.load)
    try:
        time.sleep(1.0 if args.load else 0.0)  # let the load reach every core
        rows = time_pairs(QUICK_PAIRS if args.quick else PAIRS, args.timeout)
    finally:
        for process in load:
            process.kill()
            process.wait()
    worst = max(row["seconds"] for row in rows)
    bound = 2.5 * args.timeout
    summary = {
        "max_pair_s": worst,
        "bound_s": bound,
        "within_bound": worst <= bound,
        "timeout": args.timeout,
        "load_processes": args.load,
        "cores": os.cpu_count(),
        "pairs": rows,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
