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
# Its stopping rule, refitted on a validation split large enough to certify ε = 1 pp at δ = 0.1 (256 problems × 16,
# ~9 min; docs/early_stopping.md): the stop head and λ go into the verifier's config and early_stopping.json.
stop_val="${WORK_DIR:-outputs/reproduce-v2}/stop-val"
hf-msv collect --model testbed --problems testbed:validation:256:9090 --num-samples 16 --output-dir "$stop_val"
python -c "import sys; from hf_msv.reproduction import fit_shipped_stopping; print(fit_shipped_stopping(sys.argv[1])['rule'])" "$stop_val"
