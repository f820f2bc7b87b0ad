#!/usr/bin/env bash
# Trains the MSV shipped in hf_msv/testbed/verifier/ from the shipped testbed LM (seeded): a streaming MSV_16
# trained with the library defaults (the shipped checkpoint used those of commit 02f9449, before the γ skip; this
# script now trains the anchored default) (as `hf-msv reproduce` trains its msv16-streaming, training seed 0) on the
# reproduction's train / validation shards (224 / 64 problems x 64 samples, shared with `hf-msv reproduce`; collected
# here first when missing, ~20 min on 2 CPU cores).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export HF_HUB_OFFLINE=1
# --task: hf_msv.testbed.TESTBED_VERIFIER_TASK, the testbed whose LM the demo pairs the shipped verifier with
python -m hf_msv.reproduction --shipped-verifier --task v1 --work-dir "${WORK_DIR:-outputs/reproduce}" "$@"  # e.g. --device cuda --problems-per-batch 32
