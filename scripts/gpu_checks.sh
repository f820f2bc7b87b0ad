#!/usr/bin/env bash
# The checks only a GPU can run, in one pass of at most ~10 min (each step has its own time limit): the CUDA
# correctness tests, the paper-shape generation benchmark and the testbed collection's throughput at two batch sizes.
# Logs go to $OUT (or ./gpu-checks). On one H200: tests/test_cuda.py in ~30 s; collection of v2 problems x 64 samples
# 2.0 s a problem one at a time, 0.24 s in batches of 32 (collect's own seconds); generation_gpu at 512 steps: the MSV
# run 1.195x the hooked loop.
#
#   bash scripts/gpu_checks.sh                 # on a machine with a CUDA GPU and hf_msv's dependencies installed
#
# Each step has its own time limit so that one slow step cannot starve the others; the last line of each benchmark
# log is its JSON.
set -u
OUT=${OUT:-gpu-checks}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
PY=${PYTHON:-python3}

{ nvidia-smi -L; $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee "$OUT/device.log"

# CUDA correctness: generation, early stopping, collection and training on cuda against the CPU computation.
timeout 180 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.log"

# Where wall time goes at the paper's shape (random 1.5B Qwen2, bf16, N = 64): five decodes of GPU_STEPS steps, which
# at 1,024 steps outlasted 200 s on an H200, so 512 by default; figures print as they are measured.
timeout 240 $PY benchmarks/generation_gpu.py --steps "${GPU_STEPS:-512}" 2>&1 | tee "$OUT/generation_gpu.log"

# Collection of the testbed (v2, 64 samples a problem): one problem per batch (the CPU default) vs 32.
for ppb_problems in "1 4" "32 64"; do
    set -- $ppb_problems
    start=$(date +%s.%N)
    timeout 150 $PY -m hf_msv.cli collect --model testbed --problems "testbed:evaluation:$2" --num_samples 64 \
        --problems_per_batch "$1" --output_dir "/tmp/collect-ppb$1" --no_progress > "$OUT/collect_ppb$1.log" 2>&1
    rc=$?
    seconds=$($PY -c "import time; print(round(time.time() - $start, 1))")
    echo "{\"problems_per_batch\": $1, \"problems\": $2, \"num_samples\": 64, \"rc\": $rc, \"seconds\": $seconds," \
         "\"seconds_per_problem\": $($PY -c "print(round($seconds / $2, 3))")}" | tee -a "$OUT/collect_throughput.log"
done
