#!/usr/bin/env bash
# Trains the MSV shipped in hf_msv/testbed/verifier/ from the shipped testbed LM (seeded): a streaming MSV_16 trained
# with the library defaults (as `hf-msv reproduce` trains its msv16-streaming, training seed 0) on the reproduction's
# train / validation shards (224 / 64 problems x 64 samples, shared with `hf-msv reproduce`; collected here first when
# missing, in outputs/reproduce-v2 unless WORK_DIR says otherwise: ~50 min on 2 CPU cores, then ~20 min of training),
# then fits its stopping rule (stop head and λ, below) and records it beside it (early_stopping.json).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export HF_HUB_OFFLINE=1
# The testbed is hf_msv.testbed.TESTBED_VERIFIER_TASK (the default: v2), whose LM the demo pairs the verifier with
python -m hf_msv.reproduction --shipped-verifier ${WORK_DIR:+--work-dir "$WORK_DIR"} "$@"  # e.g. --device cuda --problems-per-batch 32
# Its stopping rule: the stop head fitted on 256 validation problems x 16, lambda certified by Learn-then-Test on
# 2,560 other validation problems x 16 (epsilon = 1 pp at delta = 0.1; collected with vLLM, ~25 min on 2 cores;
# docs/early_stopping.md "The shipped verifier"): both go into the verifier's config and early_stopping.json.
work="${WORK_DIR:-outputs/reproduce-v2}"
bash scripts/setup_vllm.sh  # .venv-vllm: the CPU build of vLLM
export VLLM_ENABLE_V1_MULTIPROCESSING=0
vllm=(--engine vllm --model testbed --num-samples 16 --model-dtype float32 --vllm-arg kv_cache_memory_bytes=2147483648)
.venv-vllm/bin/hf-msv collect "${vllm[@]}" --problems testbed:validation:256:9090 --problems-per-batch 16 --output-dir "$work/stop-val"
.venv-vllm/bin/hf-msv collect "${vllm[@]}" --problems testbed:validation:2560:4242 --problems-per-batch 64 --output-dir "$work/stop-cal"
python -c "import sys; from hf_msv.reproduction import fit_shipped_stopping; print(fit_shipped_stopping(sys.argv[1], calibration_dir=sys.argv[2])['rule'])" "$work/stop-val" "$work/stop-cal"
