"""The JSON side of scripts/gpu_checks.sh: what the device has, one record per step, and the summary of the records.

    python scripts/gpu_summary.py --versions                        # device and package versions (a step's JSON)
    python scripts/gpu_summary.py --record NAME RC SECONDS FILE     # one .jsonl line for a step's stdout in FILE
    python scripts/gpu_summary.py --skip NAME REASON                # one .jsonl line for a step that cannot run
    python scripts/gpu_summary.py A.jsonl [B.jsonl ...]             # the summary (later records of a step win)

The summary's headline keys (docs/results/gpu-checks.json): ``device``, ``msv_over_plain``,
``elicitation_time_ratio``, ``vllm_stop_wall_ratio_n16``, ``vllm_stop_wall_ratio_n64``; a figure no step measured
is null, and ``vllm`` says ``"unavailable"`` (``vllm_why`` says why) where the device's Python has no vLLM.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
from pathlib import Path

# The goals of the GPU checks (docs/generation.md, docs/vllm.md): (summary key, bound, "le" or "ge").
GOALS = {
    "msv_over_plain_le_1.10": ("msv_over_plain", 1.10, "le"),
    "elicitation_time_ratio_le_0.05": ("elicitation_time_ratio", 0.05, "le"),
    "vllm_throughput_ratio_ge_0.85_n64": ("vllm_throughput_ratio_n64", 0.85, "ge"),
    "vllm_stop_wall_ratio_le_0.85_n16": ("vllm_stop_wall_ratio_n16", 0.85, "le"),
    "vllm_stop_wall_ratio_le_0.85_n64": ("vllm_stop_wall_ratio_n64", 0.85, "le"),
}
GENERATION_KEYS = (
    "plain_ms_per_step",
    "msv_over_plain",
    "msv_over_hook",
    "hook_overhead_ratio",
    "elicitation_time_ratio",
    "elicitation_wall_ratio",
    "scoring_wall_ratio",
    "verifier_time_ratio",
    "forwards_per_cot_step",
    "peak_memory_gib_plain",
    "peak_memory_gib_msv",
    "forward_plain_ms",
    "forward_masked_slots_ratio",
    "forward_hidden_states_ratio",
    "forward_both_ratio",
)


def versions() -> dict:
    """The device and the versions of what the checks import; vLLM as its version or ``"unavailable"`` and why."""
    import torch
    import transformers

    report = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "cuda": torch.version.cuda,
    }
    try:
        import vllm

        report["vllm"] = vllm.__version__
    except Exception as error:  # missing, or a build that does not load on this machine: the reason is the finding
        report |= {"vllm": "unavailable", "vllm_why": f"{type(error).__name__}: {error}"}
    return report


def last_json(text: str):
    """The last line of `text` that parses as a JSON object (`None` if none)."""
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def pytest_counts(text: str) -> dict | None:
    """``{"passed": 5, "skipped": 1, ...}`` from pytest's last summary line (`None` if there is none)."""
    lines = [line for line in text.splitlines() if re.search(r"\b(passed|failed|skipped|error|errors)\b.* in ", line)]
    if not lines:
        return None
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", lines[-1])}


def record(name: str, rc: int, seconds: int, path: Path, quick: bool) -> dict:
    text = path.read_text(errors="replace")
    result = last_json(text) if name != "cuda-tests" else pytest_counts(text)
    return {"step": name, "rc": rc, "seconds": seconds, "quick": quick, "result": result}


def summarize(records: list[dict]) -> dict:
    """The headline figures of the steps' records (a step recorded twice: its later record)."""
    steps = {r["step"]: r for r in records}
    result = {name: (r.get("result") or {}) for name, r in steps.items()}
    summary: dict = {"mode": "quick" if any(r.get("quick") for r in records) else "gpu"}
    summary |= {k: result.get("versions", {}).get(k) for k in ("device", "python", "torch", "transformers", "cuda")}
    summary["vllm"] = result.get("versions", {}).get("vllm")
    if "vllm_why" in result.get("versions", {}):
        summary["vllm_why"] = result["versions"]["vllm_why"]
    summary["cuda_tests"] = result.get("cuda-tests") or None
    generation = result.get("generation", {})
    summary |= {"generation_steps": generation.get("steps")} | {k: generation.get(k) for k in GENERATION_KEYS}
    for n in (16, 64):
        summary[f"vllm_throughput_ratio_n{n}"] = result.get("vllm-gpu", {}).get(f"n{n}", {}).get("throughput_ratio")
        testbed = result.get("vllm-testbed", {}).get(f"n{n}", {})
        summary[f"vllm_stop_wall_ratio_n{n}"] = testbed.get("wall_ratio")
        summary[f"vllm_stop_accuracy_minus_full_n{n}"] = testbed.get("accuracy_stop_minus_full")
        summary[f"vllm_stop_tokens_saved_n{n}"] = testbed.get("tokens_saved")
    summary["vllm_serving_problems_per_s_ratio"] = result.get("vllm-serving", {}).get("problems_per_s_ratio_median")
    summary["goals_met"] = {
        goal: None if summary[key] is None else (summary[key] <= bound if how == "le" else summary[key] >= bound)
        for goal, (key, bound, how) in GOALS.items()
    }
    summary["steps"] = {name: {k: r[k] for k in ("rc", "seconds", "skipped") if k in r} for name, r in steps.items()}
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jsonl", nargs="*", type=Path, help="records of gpu_checks.sh calls, summarized in order")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--versions", action="store_true")
    mode.add_argument("--record", nargs=4, metavar=("NAME", "RC", "SECONDS", "FILE"))
    mode.add_argument("--skip", nargs=2, metavar=("NAME", "REASON"))
    parser.add_argument("--quick", action="store_true", help="with --record: the step ran its tiny CPU form")
    args = parser.parse_args(argv)
    if args.versions:
        out = versions()
    elif args.record:
        name, rc, seconds, path = args.record
        out = record(name, int(rc), int(seconds), Path(path), args.quick)
    elif args.skip:
        out = {"step": args.skip[0], "rc": None, "seconds": 0, "skipped": args.skip[1], "result": None}
    elif args.jsonl:
        records = [json.loads(line) for path in args.jsonl for line in path.read_text().splitlines() if line.strip()]
        out = summarize(records)
    else:
        parser.error("name .jsonl files to summarize, or one of --versions / --record / --skip")
    json.dump(out, sys.stdout, indent=None if (args.record or args.skip or args.versions) else 2)
    print()


if __name__ == "__main__":
    main()
