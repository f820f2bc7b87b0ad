#!/usr/bin/env bash
# Testbed v2 LMs trained side by side on one GPU, then benchmarked: does a larger LM, or another training seed,
# carry more per-chain signal? Backs docs/testbed.md ("Token-Probs stays near 0.63-0.69": the GPU seeds' spread and
# the larger LMs).
# VARIANTS: `ctl` (the shipped recipe), `big` (~6x its parameters), `xl` (~18x), `shipped` (trains nothing: the
# committed LM, collected on the GPU); SEEDS: training seeds (2,800 steps x 32, bf16). Each LM then runs
# `research/testbed_quality.py --quick --probe --probe-batch 32`; logs and each benchmark's JSON go to
# $OUT/sweep.tgz (default ./gpu-sweep), each LM and the files `--score-only` needs to $OUT/<name>.tgz.
#
#   bash research/gpu_lm_sweep.sh                                  # ctl, big, xl at seed 0 (~9 min on one H200)
#   VARIANTS="ctl big" SEEDS="1 2" bash research/gpu_lm_sweep.sh   # more seeds of two sizes
#   VARIANTS=ctl SEEDS="3 4 5 6 7 8 9 10" BENCH=0 bash research/gpu_lm_sweep.sh
#       # train only: each LM comes back as $OUT/<name>.tgz, to be screened on a CPU (testbed_quality.py --screen 96)
#
# TT / BT: time limits (s) of each training / benchmark process; eight ctl seeds train side by side in ~270 s on one
# H200, so keep TT >= 260. The benchmarks share the CPU threads evenly (no oversubscription in their evaluation).
set -u
OUT=${OUT:-gpu-sweep}; mkdir -p "$OUT"; S=$(mktemp -d); ROOT=$PWD
DEV=${DEV:-cuda}; STEPS=${STEPS:-2800}; TT=${TT:-260}; BT=${BT:-280}; EXTRA=${EXTRA:-}; PY=${PYTHON:-python3}
VARIANTS=${VARIANTS:-ctl big xl}; SEEDS=${SEEDS:-0}; BENCH=${BENCH:-1}
TRAIN_THREADS=${TRAIN_THREADS:-2}  # CPU threads per training process (the data stream): 8 side by side fit 16 cores
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if ls .whl/*.whl > /dev/null 2>&1; then  # local wheels (e.g. math-verify) for a GPU image that lacks them
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
(nvidia-smi -L; $PY -c "import torch, transformers; print(torch.__version__, transformers.__version__)") \
  > "$S/device.txt" 2>&1

shape() {  # the LM's width, depth, heads and peak learning rate
  case $1 in
    ctl) echo "--d-model 128 --n-layers 4 --n-heads 4 --lr 2e-3" ;;
    big) echo "--d-model 256 --n-layers 6 --n-heads 8 --lr 1e-3" ;;
    xl) echo "--d-model 384 --n-layers 8 --n-heads 12 --lr 7e-4" ;;
    shipped) echo "" ;;  # trains nothing: the committed LM
    *) echo "unknown variant $1" >&2; return 1 ;;
  esac
}
train() {  # a copy of the repository per LM: --probe collects from the task's LM directory, hf_msv/testbed/lm-v2
  local name=$1; shift
  rm -rf "/tmp/repo-$name" "/tmp/lm-$name" "/tmp/probe-$name"; mkdir -p "/tmp/repo-$name"
  tar -C "$ROOT" --exclude=./.venv --exclude=./outputs --exclude=./.git -cf - . | tar -C "/tmp/repo-$name" -xf -
  case $name in  # the committed (CPU-trained) LM, not retrained: the GPU collection's share of a difference
    shipped-*) cp -r "$ROOT/hf_msv/testbed/lm-v2" "/tmp/lm-$name"; echo "parameters: the committed LM" \
                 > "$S/train-$name.log"; return ;;
  esac
  (cd "/tmp/repo-$name" && PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/repo-$name" timeout "$TT" \
     $PY -m hf_msv.testbed.train_lm --task v2 --device "$DEV" --steps "$STEPS" --output-dir "/tmp/lm-$name" \
     --log-every 200 --threads "$TRAIN_THREADS" "$@" > "$S/train-$name.log" 2>&1)
}
bench() {
  local name=$1 threads=$2
  [ -f "/tmp/lm-$name/model.safetensors" ] || { echo "no LM for $name" > "$S/bench-$name.log"; return; }
  cp /tmp/lm-"$name"/*.json /tmp/lm-"$name"/model.safetensors "/tmp/repo-$name/hf_msv/testbed/lm-v2/"
  (cd "/tmp/repo-$name" && PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/repo-$name" timeout "$BT" \
     $PY research/testbed_quality.py --task v2 --quick --probe --probe-batch 32 --device "$DEV" \
     --threads "$threads" --probe-dir "/tmp/probe-$name" $EXTRA > "$S/bench-$name.log" 2>&1)
}
names=()
for v in $VARIANTS; do
  args=$(shape "$v") || exit 2
  [ "$v" = shipped ] && { names+=(shipped-lm); train shipped-lm & continue; }  # one LM, no seeds to train
  for seed in $SEEDS; do names+=("$v-s$seed"); train "$v-s$seed" $args --seed "$seed" & done
done
wait
if [ "$BENCH" = 0 ]; then  # the LMs alone
  for n in "${names[@]}"; do
    [ -f "/tmp/lm-$n/model.safetensors" ] && cp "$S/train-$n.log" "/tmp/lm-$n/" &&
      tar -C /tmp -czf "$OUT/$n.tgz" "lm-$n"
    echo "== $n: $(tail -n 1 "$S/train-$n.log" | cut -c1-300)"
  done
  exit 0
fi
threads=$(( $(nproc) / ${#names[@]} )); [ "$threads" -ge 1 ] || threads=1  # no oversubscription in evaluation
for n in "${names[@]}"; do bench "$n" "$threads" & done
wait
for n in "${names[@]}"; do cp "/tmp/lm-$n/training_log.json" "$S/training_log-$n.json" 2>/dev/null; done
tar -C "$S" -czf "$OUT/sweep.tgz" .
for n in "${names[@]}"; do  # the LM and what --score-only needs, so a benchmark cut by its limit can be scored here
  [ -d "/tmp/probe-$n" ] || continue
  tar -C / -czf "$OUT/$n.tgz" $(cd / && ls -d "tmp/lm-$n"/{*.json,model.safetensors} \
    "tmp/probe-$n"/{evaluation,validation,probe,report} 2>/dev/null)
done
cat "$S/device.txt"
for n in "${names[@]}"; do
  echo "== $n: $(grep -h parameters "$S/train-$n.log" | head -1)"
  grep -E "PASS|FAIL" "$S/bench-$n.log"; tail -n 1 "$S/bench-$n.log" | cut -c1-1500
done
