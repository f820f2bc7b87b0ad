#!/usr/bin/env bash
# Reproduces the MSV shipped in hf_msv/testbed/verifier/ from the shipped testbed LM (seeded; ~20 min on 2 CPU cores).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export HF_HUB_OFFLINE=1
OUT=${OUT:-outputs/shipped_verifier}
N=${N:-16}
hf-msv collect --model testbed --problems testbed:train:${TRAIN_PROBLEMS:-224}:0 --num-samples "$N" \
    --max-new-tokens 400 --delimiters Wait --output-dir "$OUT/train" --no-progress
hf-msv collect --model testbed --problems testbed:validation:${VAL_PROBLEMS:-64}:0 --num-samples "$N" \
    --max-new-tokens 400 --delimiters Wait --output-dir "$OUT/validation" --no-progress
hf-msv train --train-dir "$OUT/train" --val-dir "$OUT/validation" --output-dir "$OUT/msv" \
    --num-sequences "$N" --mode streaming ${TRAIN_ARGS:---groups-per-problem 16 --learning-rate 3e-4 --num-epochs 4}
rm -rf hf_msv/testbed/verifier && cp -r "$OUT/msv" hf_msv/testbed/verifier
