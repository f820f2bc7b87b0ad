#!/usr/bin/env bash
# The checks only a GPU can run, as named steps that each keep their JSON, so that a short GPU loan is spent in
# several calls of under 10 min rather than one long one (docs/generation.md, "Cost").
#
#   bash scripts/gpu_checks.sh                                   # every step, in this order
#   bash scripts/gpu_checks.sh versions cuda-tests generation    # call 1 (~9 min at most)
#   bash scripts/gpu_checks.sh versions profile                  # call 2 (~3 min at most)
#   bash scripts/gpu_checks.sh versions vllm-gpu vllm-testbed vllm-serving   # call 3 (skipped without vLLM)
#   GPU_CHECKS_QUICK=1 bash scripts/gpu_checks.sh                # every step's tiny form on the CPU: checks the
#                                                                # script, measures nothing ("mode": "quick")
#
# Steps (each under its own time limit, so one slow step cannot starve the others):
#   versions      the device, Python, torch, transformers and whether vLLM imports (and why not)
#   cuda-tests    tests/test_cuda.py: generation, early stopping, collection and training on cuda against the CPU
#   generation    benchmarks/generation_gpu.py --steps GPU_STEPS (default 512): the MSV run ÷ plain generate, the
#                 elicitation ÷ CoT time, forwards per step, at the paper's shape (random 1.5B Qwen2, bf16, N = 64)
#   profile       the same MSV decode under cProfile (--profile): where its wall time goes
#   vllm-gpu      benchmarks/vllm_controller.py --gpu: the controller without stopping ÷ plain vLLM tokens/s, 1.5B
#                 shape with random weights (load_format="dummy")
#   vllm-testbed  benchmarks/vllm_controller.py: the testbed LM and the shipped verifier at its default, N = 16 and
#                 64: wall time with early stopping ÷ plain vLLM full decoding, accuracy, tokens saved
#   vllm-serving  benchmarks/vllm_serving.py: a queue of testbed problems, plain against the default
#   summary       scripts/gpu_summary.py: the headline figures of every step so far (also run after each call)
#
# Output (at most 8 files come back from the device): $OUT/gpu-checks.log (everything printed),
# $OUT/gpu-checks.jsonl (one line a step: {"step", "rc", "seconds", "result"}: the step's last JSON line) and
# $OUT/gpu-checks.json (the summary; the committed docs/results/gpu-checks.json is that of all calls' .jsonl files:
# `python scripts/gpu_summary.py call1.jsonl call2.jsonl ...`). $OUT defaults to ./gpu-checks.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-checks}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
PY=${PYTHON:-python3}
QUICK=${GPU_CHECKS_QUICK:-}
LOG=$OUT/gpu-checks.log
JSONL=$OUT/gpu-checks.jsonl
[ $# -gt 0 ] || set -- versions cuda-tests generation profile vllm-gpu vllm-testbed vllm-serving

has_vllm() { $PY -c "import vllm" > /dev/null 2>&1; }

# run_step NAME LIMIT CMD...: runs CMD under LIMIT seconds, its output appended to the log, and records the last
# stdout line that parses as JSON (null if none) with the exit status and seconds.
run_step() {
    local name=$1 limit=$2; shift 2
    local start rc tmp
    tmp=$(mktemp)
    echo "== $name (limit ${limit}s): $*" | tee -a "$LOG"
    start=$(date +%s)
    timeout "$limit" "$@" > "$tmp" 2> >(tee -a "$LOG" >&2)
    rc=$?
    tee -a "$LOG" < "$tmp" | tail -n 5
    $PY scripts/gpu_summary.py --record "$name" "$rc" "$(( $(date +%s) - start ))" "$tmp" ${QUICK:+--quick} \
        >> "$JSONL"
    rm -f "$tmp"
}

skip_step() {  # a step that cannot run here, with the reason
    echo "== $1: skipped ($2)" | tee -a "$LOG"
    $PY scripts/gpu_summary.py --skip "$1" "$2" >> "$JSONL"
}

for step in "$@"; do
    case $step in
    versions)
        run_step versions 60 $PY scripts/gpu_summary.py --versions ;;
    cuda-tests)
        # -rs lists the skips: on a machine without CUDA every test skips, and the summary says so.
        run_step cuda-tests 180 $PY -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py ;;
    generation)
        run_step generation 300 $PY benchmarks/generation_gpu.py --steps "${GPU_STEPS:-512}" ${QUICK:+--smoke} ;;
    profile)
        run_step profile 150 $PY benchmarks/generation_gpu.py --steps "${GPU_STEPS:-512}" --profile ${QUICK:+--smoke}
        ;;
    vllm-gpu | vllm-testbed | vllm-serving)
        if ! has_vllm; then
            skip_step "$step" "vllm unavailable: $($PY -c 'import vllm' 2>&1 | tail -n 1)"
            continue
        fi
        case $step in
        vllm-gpu) run_step vllm-gpu 300 $PY benchmarks/vllm_controller.py $([ -n "$QUICK" ] && echo --smoke || echo --gpu) ;;
        vllm-testbed) run_step vllm-testbed 360 $PY benchmarks/vllm_controller.py ${QUICK:+--quick} --no-demo ;;
        vllm-serving) run_step vllm-serving 300 $PY benchmarks/vllm_serving.py ${QUICK:+--quick} ;;
        esac ;;
    summary) ;;
    *) echo "unknown step: $step (see the steps in scripts/gpu_checks.sh)" >&2; exit 2 ;;
    esac
done
$PY scripts/gpu_summary.py "$JSONL" > "$OUT/gpu-checks.json"
cat "$OUT/gpu-checks.json"
