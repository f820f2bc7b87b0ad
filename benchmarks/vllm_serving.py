"""Serving a queue of problems on vLLM: plain full decoding against the serving controller with early stopping
(docs/vllm.md). Last stdout line: JSON.

The shipped testbed LM and MSV_16 at its default (the λ and pruning rule it certified), P evaluation problems
with N = 16 chains each, arriving all at once and at a fixed rate (default: 0.75 × plain vLLM's all-at-once
problems/s, so the queue is loaded but not saturated).
Three systems, each stepping the engine with continuous batching:

* ``plain`` — plain vLLM full decoding, majority vote over the chains' final boxed answers;
* ``full_wv`` — `AsyncVLLMController` without stopping (every answer elicited and scored), weighted vote of the
  terminal answers by the verifier's scores (`hf_msv.baselines.weighted_voting`);
* ``stop`` — `AsyncVLLMController` at its default: the certified early stop and pruning (its chosen answer).

Per system and arrival pattern: problems/s (P over the time from the first arrival to the last answer),
time-to-answer p50 / p90 (from a problem's arrival), chain-of-thought tokens, accuracy. All at once, plain and the
default then run again back to back (``--repeats`` pairs in all): each pair's problems/s ratio and their median.
``--quick``: 4 problems, N = 4, short chains (CI). ``--verifier DIR``: a streaming MSV saved with its stopping
rule instead of the shipped one (its λ and the elicitation schedule it was trained on).

    OMP_NUM_THREADS=2 .venv-vllm/bin/python benchmarks/vllm_serving.py [--quick] [--problems P] [--rate R] \
        [--verifier DIR] [--repeats R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

from _report import rounded  # benchmarks/ is the script's directory
from vllm_controller import correct, make_engine


def percentiles(values) -> dict:
    import numpy as np

    return {"p50": float(np.percentile(values, 50)), "p90": float(np.percentile(values, 90))}


def majority_answer(texts, checker):
    """The most frequent final boxed answer among a problem's chains (ties: the first class); `None` if none."""
    from collections import Counter

    from hf_msv.answers import extract_last_boxed
    from hf_msv.equivalence import EquivalenceClasses

    classes, answers = EquivalenceClasses(checker), [extract_last_boxed(t) for t in texts]
    voted = [(classes.add(a), a) for a in answers if a is not None]
    if not voted:
        return None
    best = Counter(k for k, _ in voted).most_common(1)[0][0]
    return next(a for k, a in voted if k == best)


def plain_serving(llm, prompt_ids, n, budget, arrivals) -> tuple[dict, list[list[list[int]]]]:
    """Plain vLLM: each problem's request (``n`` chains) added at its arrival, the engine stepped until all end."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    # Unseeded, like the controller: per-request seeds crash the CPU backend with chunked prefill (docs/vllm.md).
    params = SamplingParams(
        n=n, max_tokens=budget, temperature=1.0, top_k=-1, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY
    )
    engine, chains, answered = llm.llm_engine, {}, {}
    start, admitted = time.perf_counter(), 0
    while len(answered) < len(prompt_ids):
        now = time.perf_counter() - start
        while admitted < len(prompt_ids) and arrivals[admitted] <= now:
            engine.add_request(f"plain-{admitted}", {"prompt_token_ids": prompt_ids[admitted]}, params)
            admitted += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, arrivals[admitted] - now))
            continue
        for output in engine.step():
            if output.finished:
                i = int(output.request_id.split("-")[1])
                answered[i] = time.perf_counter() - start - arrivals[i]
                chains[i] = [list(c.token_ids) for c in output.outputs]
    seconds = time.perf_counter() - start
    ordered = [chains[i] for i in range(len(prompt_ids))]
    return summary(seconds, [answered[i] for i in range(len(prompt_ids))], sum(len(c) for x in ordered for c in x)), (
        ordered
    )


def controller_serving(server, prompts, arrivals) -> tuple[dict, list]:
    """The serving controller: problem i submitted at ``arrivals[i]``; its result once its rule decides."""

    async def main():
        start = time.perf_counter()

        async def one(i):
            await asyncio.sleep(max(0.0, arrivals[i] - (time.perf_counter() - start)))
            result = await server.answer(prompts[i])
            return result, time.perf_counter() - start - arrivals[i]

        out = await asyncio.gather(*(one(i) for i in range(len(prompts))))
        await server.aclose()
        return out, time.perf_counter() - start

    out, seconds = asyncio.run(main())
    results = [r for r, _ in out]
    return summary(seconds, [t for _, t in out], sum(r.tokens_decoded for r in results)), results


def summary(seconds, times_to_answer, tokens) -> dict:
    tta = percentiles(times_to_answer)
    return {
        "problems_per_s": len(times_to_answer) / seconds,
        "seconds": seconds,
        "time_to_answer_p50": tta["p50"],
        "time_to_answer_p90": tta["p90"],
        "tokens": tokens,
    }


def weighted_vote_answer(result):
    """The terminal answer whose class has the largest summed verifier score (`weighted_voting`)."""
    from hf_msv.baselines import best_of_n, weighted_voting

    answers = [a for a in result.answers if a.score is not None]
    if not answers:
        return None
    terminal = [a.terminal for a in answers]
    wv = weighted_voting([a.score for a in answers], [a.class_id for a in answers], mask=terminal)
    return answers[best_of_n(wv, mask=terminal)].text


def run(
    quick: bool, num_problems: int | None, rate: float | None, verifier_dir: str | None = None, repeats: int = 1
) -> dict:
    import hf_msv.testbed
    from hf_msv.equivalence import get_checker
    from hf_msv.generation import MSVEarlyStop
    from hf_msv.modeling_msv import MSVVerifier
    from hf_msv.testbed import TESTBED_VERIFIER_DIR, format_prompt
    from hf_msv.testbed.tasks import get_task
    from hf_msv.vllm import AsyncVLLMController, VLLMController

    lm = Path(hf_msv.testbed.__file__).parent / "lm-v2"
    verifier = MSVVerifier.from_pretrained(verifier_dir or TESTBED_VERIFIER_DIR).eval()
    lam = MSVEarlyStop.from_verifier(verifier).threshold
    task = get_task("v2")
    P = num_problems or (4 if quick else 64)
    n, budget = (4, 120) if quick else (16, task.sampling_cap() or 400)
    problems = task.generate_problems("evaluation", P, seed=0)
    # Room for every chain and elicitation in flight: a smaller cache preempts and evicts cached prefixes.
    llm = make_engine(lm, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=(256 << 20) if quick else 4 << 30)
    controller = VLLMController(llm, None, verifier, checker="symbolic")
    checker = get_checker("symbolic")
    prompts = [format_prompt(p) for p in problems]
    ids = [controller.encode(p) for p in prompts]
    # Warm-up, as a server is warm: two other problems decoded, elicited, scored, pruned and stopped as the systems do.
    warm = task.generate_problems("evaluation", 2, seed=1)
    controller.generate([format_prompt(p) for p in warm], num_sequences=n, max_new_tokens=budget)

    def systems(arrivals) -> dict:
        llm.reset_prefix_cache()  # each system starts from an empty prefix cache
        plain, chains = plain_serving(llm, ids, n, budget, arrivals)
        votes = [majority_answer([controller.tokenizer.decode(c) for c in x], checker) for x in chains]
        plain["accuracy"] = sum(v is not None and checker.is_correct(v, p.gold) for v, p in zip(votes, problems)) / P
        settings = dict(num_sequences=n, max_new_tokens=budget)
        llm.reset_prefix_cache()
        full, results = controller_serving(
            AsyncVLLMController(controller, threshold=None, **settings), prompts, arrivals
        )
        votes = [weighted_vote_answer(r) for r in results]
        full["accuracy"] = sum(v is not None and checker.is_correct(v, p.gold) for v, p in zip(votes, problems)) / P
        llm.reset_prefix_cache()
        stop, results = controller_serving(AsyncVLLMController(controller, **settings), prompts, arrivals)  # default
        stop["accuracy"] = sum(correct(results, problems, checker)) / P
        stop["stopped_early"] = sum(r.stopped_early for r in results) / P
        stop["chains_pruned"] = sum(len(r.pruned) for r in results)
        return {"plain": plain, "full_wv": full, "stop": stop}

    def repeated(first: dict, more: int) -> dict:
        """All at once, plain and the default again, alternating, `more` times: the ratio of each pair (the two
        run back to back) and their median. Plain vLLM's time moved by a third between runs of one command."""
        seconds = {"plain": [first["plain"]["seconds"]], "stop": [first["stop"]["seconds"]]}
        for _ in range(more):
            llm.reset_prefix_cache()
            seconds["plain"].append(plain_serving(llm, ids, n, budget, [0.0] * P)[0]["seconds"])
            llm.reset_prefix_cache()
            server = AsyncVLLMController(controller, num_sequences=n, max_new_tokens=budget)
            seconds["stop"].append(controller_serving(server, prompts, [0.0] * P)[0]["seconds"])
        ratios = [p / s for p, s in zip(seconds["plain"], seconds["stop"])]  # problems/s of the default ÷ plain
        return {"seconds": seconds, "ratios": ratios, "median_ratio": statistics.median(ratios)}

    report = {
        "verifier": verifier_dir or "shipped",
        "elicitation": controller.settings.to_dict(),
        "lambda": lam,
        "problems": P,
        "num_sequences": n,
        "max_new_tokens": budget,
    }
    # Other processes on a shared CPU move every figure: the 1-minute load average before and after each pattern.
    load = [os.getloadavg()[0]]
    report["at_once"] = systems([0.0] * P)
    report["at_once_repeats"] = repeated(report["at_once"], repeats - 1)
    load.append(os.getloadavg()[0])
    rate = rate or 0.75 * report["at_once"]["plain"]["problems_per_s"]
    report["rate"] = {"problems_per_s_offered": rate, **systems([i / rate for i in range(P)])}
    report["load_average"] = load + [os.getloadavg()[0]]
    at_once = report["at_once"]
    report.update(
        problems_per_s_plain=at_once["plain"]["problems_per_s"],
        problems_per_s_stop=at_once["stop"]["problems_per_s"],
        accuracy_plain=at_once["plain"]["accuracy"],
        accuracy_stop=at_once["stop"]["accuracy"],
        tokens_saved=1 - at_once["stop"]["tokens"] / at_once["plain"]["tokens"],
        problems_per_s_ratio_median=report["at_once_repeats"]["median_ratio"],
    )
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 problems, N = 4, short chains (CI).")
    parser.add_argument("--problems", type=int, default=None, help="P (default 64; 4 with --quick).")
    parser.add_argument("--rate", type=float, default=None, help="arrivals per second of the fixed-rate pattern.")
    parser.add_argument("--verifier", default=None, help="a streaming MSV with its stopping rule (default: shipped)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="all-at-once runs of plain and the default, alternating (default 5; 2 with --quick)",
    )
    args = parser.parse_args()
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 5)
    if repeats < 1:
        parser.error(f"--repeats must be at least 1, got {repeats}")
    report = run(args.quick, args.problems, args.rate, args.verifier, repeats)

    print(json.dumps(rounded(report)))


if __name__ == "__main__":
    main()
