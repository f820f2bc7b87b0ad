"""scripts/gpu_checks.sh and its JSON side (scripts/gpu_summary.py), on the CPU: the script's quick mode runs its
steps, and the summary reads what the steps printed (the GPU figures themselves need a GPU)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_summary", ROOT / "scripts" / "gpu_summary.py")
assert spec is not None and spec.loader is not None
gpu_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_summary)

HEADLINE = (
    "device",
    "msv_over_plain",
    "elicitation_time_ratio",
    "vllm_stop_wall_ratio_n16",
    "vllm_stop_wall_ratio_n64",
)


def test_records_read_the_last_json_line_and_pytests_counts(tmp_path):
    out = tmp_path / "stdout"
    out.write_text('warm-up\n{"steps": 8}\nplain_seconds: 1.0\n{"msv_over_plain": 1.2, "steps": 512}\ndone\n')
    assert gpu_summary.record("generation", 0, 7, out, False)["result"] == {"msv_over_plain": 1.2, "steps": 512}
    out.write_text("....s\nSKIPPED [1] tests/test_cuda.py: needs a CUDA GPU\n1 failed, 4 passed, 1 skipped in 3.1s\n")
    record = gpu_summary.record("cuda-tests", 1, 30, out, True)
    assert record["result"] == {"failed": 1, "passed": 4, "skipped": 1} and record["quick"] and record["rc"] == 1


def test_summary_takes_each_steps_latest_record_and_judges_only_measured_goals():
    versions = {"device": "NVIDIA H100", "torch": "2.11.0", "vllm": "unavailable", "vllm_why": "No module named"}
    records = [
        {"step": "versions", "rc": 0, "seconds": 2, "result": versions},
        {"step": "generation", "rc": 0, "seconds": 200, "result": {"msv_over_plain": 1.3, "steps": 512}},
        {
            "step": "generation",
            "rc": 0,
            "seconds": 210,
            "result": {"msv_over_plain": 1.08, "steps": 512, "elicitation_time_ratio": 0.07},
        },
        {"step": "vllm-testbed", "rc": None, "seconds": 0, "skipped": "vllm unavailable", "result": None},
    ]
    summary = gpu_summary.summarize(records)
    assert all(key in summary for key in HEADLINE)
    assert summary["device"] == "NVIDIA H100" and summary["mode"] == "gpu"
    assert summary["msv_over_plain"] == 1.08 and summary["generation_steps"] == 512  # the rerun wins
    assert summary["vllm"] == "unavailable" and summary["vllm_why"] == "No module named"
    assert summary["vllm_stop_wall_ratio_n16"] is None and summary["vllm_stop_wall_ratio_n64"] is None
    goals = summary["goals_met"]
    assert goals["msv_over_plain_le_1.10"] is True and goals["elicitation_time_ratio_le_0.05"] is False
    assert goals["vllm_stop_wall_ratio_le_0.85_n16"] is None  # not measured is not failed
    assert summary["steps"]["vllm-testbed"]["skipped"] == "vllm unavailable"


def test_summary_reads_the_vllm_benchmarks_per_n():
    testbed = {
        f"n{n}": {"wall_ratio": r, "accuracy_stop_minus_full": [0.0, -0.02, 0.02], "tokens_saved": 0.4}
        for n, r in ((16, 0.8), (64, 0.9))
    }
    records = [
        {"step": "vllm-testbed", "rc": 0, "seconds": 1, "quick": True, "result": testbed},
        {"step": "vllm-gpu", "rc": 0, "seconds": 1, "result": {"n64": {"throughput_ratio": 0.9}}},
    ]
    summary = gpu_summary.summarize(records)
    assert summary["mode"] == "quick"  # any step in its quick form: not a measurement
    assert (summary["vllm_stop_wall_ratio_n16"], summary["vllm_stop_wall_ratio_n64"]) == (0.8, 0.9)
    goals = summary["goals_met"]
    assert goals["vllm_stop_wall_ratio_le_0.85_n16"] and not goals["vllm_stop_wall_ratio_le_0.85_n64"]
    assert goals["vllm_throughput_ratio_ge_0.85_n64"] is True


@pytest.mark.timeout(300)
def test_quick_mode_runs_the_steps_and_writes_the_summary(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), GPU_CHECKS_QUICK="1", PYTHON=sys.executable, OMP_NUM_THREADS="1")
    steps = ["versions", "cuda-tests", "generation", "vllm-serving"]
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_checks.sh"), *steps], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "gpu-checks.json").read_text())
    assert summary["mode"] == "quick" and all(key in summary for key in HEADLINE)
    assert summary["generation_steps"] == 200 and summary["msv_over_plain"] > 0  # generation_gpu.py --smoke ran
    assert summary["steps"]["generation"]["rc"] == 0 and summary["steps"]["cuda-tests"]["rc"] == 0
    lines = (tmp_path / "gpu-checks.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == steps
    try:
        import vllm  # noqa: F401
    except ImportError:
        assert summary["vllm"] == "unavailable" and summary["steps"]["vllm-serving"]["skipped"].startswith("vllm")
    else:
        assert summary["steps"]["vllm-serving"]["rc"] == 0
    assert (tmp_path / "gpu-checks.log").stat().st_size > 0
    assert len(list(tmp_path.iterdir())) <= 8  # what comes back from the device machine
