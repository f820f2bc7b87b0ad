#!/usr/bin/env bash
# Issue #17's capacity question on one GPU in one ~9-min pass: does a larger testbed LM carry more per-chain signal?
# Trains v2 LMs side by side on the same data stream (2,800 steps x 32, bf16; VARIANTS: the shipped recipe `ctl`,
# `big` ~6x and `xl` ~18x its parameters; `check`: the shipped shape on traces with written inverse checks, task_v2's
# `check_prob` 1 and a 320-token cap; `say`: the shipped shape, the clause reading named, `say_reading_prob` 1;
# `bigsay`: the `big` shape on `say`'s traces;
# SEEDS: training seeds, to tell capacity from training noise), then runs `benchmarks/testbed_quality.py --quick
# --probe` on each (the Probe collection in batches of 32 problems). Logs and
# each benchmark's JSON go to $OUT/sweep.tgz (or ./gpu-sweep); the PASS / FAIL rows and JSON lines are printed.
#
#   bash scripts/gpu_lm_sweep.sh                              # ctl, big, xl at seed 0
#   VARIANTS="ctl big" SEEDS="1 2" bash scripts/gpu_lm_sweep.sh   # two more seeds of two sizes
#   VARIANTS="ctl check" SEEDS="0 1" bash scripts/gpu_lm_sweep.sh  # does a slip the LM can see carry the signal?
#   VARIANTS="ctl say" SEEDS="2 3 4 5" BENCH=0 bash scripts/gpu_lm_sweep.sh  # the named clause reading, more seeds
#   VARIANTS=bigsay SEEDS="0 1 2 3" BENCH=0 bash scripts/gpu_lm_sweep.sh  # issue #17's open route: capacity + naming
#   VARIANTS="shipped ctl" SEEDS="1 2" EXTRA="--probe-problems 96,32,96" bash scripts/gpu_lm_sweep.sh
#       # the committed LM collected on the GPU beside two GPU-trained seeds (`shipped` trains nothing)
#   VARIANTS=ctl SEEDS="3 4 5 6 7 8 9 10" BENCH=0 bash scripts/gpu_lm_sweep.sh
#       # train only: each LM comes back as $OUT/<name>.tgz, to be screened here (testbed_quality.py --screen)
#
# Measured on one H200 (2026-11-28, BENCH=0): eight ctl seeds side by side trained in 266 s.
# Measured on one H200 (2026-11-27, ctl / big / xl at seed 0): training 198 / 217 / 238 s side by side; the
# benchmarks outlasted a 220 s limit in their evaluation (three processes of 16 torch threads each on 16 cores),
# hence the thread share below. Their shards came back and were scored with `--score-only` (README, issue #17).
# Later that day two ctl seeds took 212 s side by side (a TT of 240 cut them: keep TT >= 260), and the benchmark's
# bootstrap of the within-problem AUROC, 3 of its minutes, was made ~16x faster (per_problem_auroc, once per problem).
# $OUT/<name>.tgz holds each LM and the files --score-only needs, in case a benchmark is cut all the same (the device
# tool returns at most 8 files from $OUT: sweep.tgz and seven LMs).
set -u
OUT=${OUT:-gpu-sweep}; mkdir -p "$OUT"; S=$(mktemp -d); ROOT=$PWD
DEV=${DEV:-cuda}; STEPS=${STEPS:-2800}; TT=${TT:-260}; BT=${BT:-280}; EXTRA=${EXTRA:-}; PY=${PYTHON:-python3}
VARIANTS=${VARIANTS:-ctl big xl}; SEEDS=${SEEDS:-0}; BENCH=${BENCH:-1}
TRAIN_THREADS=${TRAIN_THREADS:-2}  # CPU threads per training process (the data stream): 8 side by side fit 16 cores
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if ls .whl/*.whl > /dev/null 2>&1; then  # e.g. math-verify where the GPU image lacks it (README of the device tool)
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
(nvidia-smi -L; $PY -c "import torch, transformers; print(torch.__version__, transformers.__version__)") \
  > "$S/device.txt" 2>&1

shape() {  # the LM's width, depth, heads and peak learning rate
  case $1 in
    ctl) echo "--d-model 128 --n-layers 4 --n-heads 4 --lr 2e-3" ;;
    big) echo "--d-model 256 --n-layers 6 --n-heads 8 --lr 1e-3" ;;
    xl) echo "--d-model 384 --n-layers 8 --n-heads 12 --lr 7e-4" ;;
    check|say) shape ctl ;;
    bigsay) shape big ;;
    shipped) echo "" ;;  # trains nothing: the committed LM
    *) echo "unknown variant $1" >&2; return 1 ;;
  esac
}
knobs() {  # the task knobs a variant trains and is benchmarked on (TaskKnobsV2 overrides)
  case $1 in
    check-*) echo '{"check_prob": 1.0, "max_trace_tokens": 320}' ;;
    say-*|bigsay-*) echo '{"say_reading_prob": 1.0}' ;;
    *) echo '{}' ;;
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
     --log-every 200 --threads "$TRAIN_THREADS" --knobs "$(knobs "$name")" "$@" > "$S/train-$name.log" 2>&1)
}
bench() {
  local name=$1 threads=$2
  [ -f "/tmp/lm-$name/model.safetensors" ] || { echo "no LM for $name" > "$S/bench-$name.log"; return; }
  cp /tmp/lm-"$name"/*.json /tmp/lm-"$name"/model.safetensors "/tmp/repo-$name/hf_msv/testbed/lm-v2/"
  (cd "/tmp/repo-$name" && PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/repo-$name" timeout "$BT" \
     $PY benchmarks/testbed_quality.py --task v2 --quick --probe --probe-batch 32 --device "$DEV" \
     --threads "$threads" --probe-dir "/tmp/probe-$name" --knobs "$(knobs "$name")" $EXTRA > "$S/bench-$name.log" 2>&1)
}
names=()
for v in $VARIANTS; do
  args=$(shape "$v") || exit 2
  [ "$v" = shipped ] && { names+=(shipped-lm); train shipped-lm & continue; }  # one LM, no seeds to train
  for seed in $SEEDS; do names+=("$v-s$seed"); train "$v-s$seed" $args --seed "$seed" & done
done
wait
if [ "$BENCH" = 0 ]; then  # the LMs alone (up to 8 files come back from the device tool)
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
