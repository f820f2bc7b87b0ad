#!/usr/bin/env bash
# Runs the quick mode of every benchmark (benchmarks/*.py but the _helpers) and every example (examples/*.py) on the
# default LM, one after another, and fails on any error: a benchmark must exit 0 and end its stdout with one JSON
# line, an example must exit 0. Scripts whose quick mode needs vLLM run only where it imports (the main venv, else
# .venv-vllm); they are reported as skipped otherwise. Each script's output goes to $LOG_DIR (default: a temporary
# directory); a table of seconds per script and the total is printed at the end.
#
# benchmarks/checker_under_load.py starts its own load (2 busy processes) for its few seconds; its JSON line says
# whether every checked pair stayed within 2.5 x the checker's timeout (within_bound).
#
#   bash scripts/bench_smoke.sh                      # everything (make bench-smoke)
#   bash scripts/bench_smoke.sh benchmarks/msv_online.py examples/best_of_n.py   # only these
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg PYTHONUNBUFFERED=1
# Quick modes run tiny models, whose matmuls only contend with more threads (scripts with --threads set their own).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PY=${PYTHON:-.venv/bin/python}
LIMIT=${LIMIT:-600}  # seconds one script may take before it counts as a failure
LOG_DIR=${LOG_DIR:-$(mktemp -d -t bench-smoke-XXXXXX)}
mkdir -p "$LOG_DIR"
NEEDS_VLLM="benchmarks/vllm_collection.py benchmarks/vllm_controller.py benchmarks/vllm_serving.py examples/vllm_early_stop.py"

VLLM_PY=""
for candidate in "$PY" .venv-vllm/bin/python; do
  if [ -x "$candidate" ] && "$candidate" -c "import vllm" > /dev/null 2>&1; then VLLM_PY=$candidate; break; fi
done

if [ $# -gt 0 ]; then scripts=("$@"); else
  scripts=()
  for f in benchmarks/*.py examples/*.py; do
    case $(basename "$f") in _*) continue ;; esac
    scripts+=("$f")
  done
fi

failed=0; total_start=$(date +%s); rows=()
for f in "${scripts[@]}"; do
  python=$PY
  if [[ " $NEEDS_VLLM " == *" $f "* ]]; then
    if [ -z "$VLLM_PY" ]; then rows+=("$(printf '%-40s %8s  %s' "$f" "-" "skipped (vllm not importable)")"); continue; fi
    python=$VLLM_PY
  fi
  log="$LOG_DIR/$(echo "$f" | tr / _).log"
  start=$(date +%s)
  timeout "$LIMIT" "$python" "$f" --quick > "$log" 2> "$log.err"
  rc=$?; seconds=$(( $(date +%s) - start ))
  verdict=ok
  if [ $rc -ne 0 ]; then
    verdict="FAILED (exit $rc; $log.err)"
  elif [[ $f == benchmarks/* ]] && ! tail -n 1 "$log" | "$PY" -c "import json, sys; json.loads(sys.stdin.read())" \
      2> /dev/null; then
    verdict="FAILED (last stdout line is not JSON; $log)"
  fi
  [ "$verdict" = ok ] || { failed=$((failed + 1)); tail -n 20 "$log.err" >&2; }
  rows+=("$(printf '%-40s %8s  %s' "$f" "${seconds}s" "$verdict")")
  echo "${rows[-1]}"
done

echo
printf '%-40s %8s  %s\n' "script" "time" "verdict"
printf '%s\n' "${rows[@]}"
echo "total $(( $(date +%s) - total_start ))s, $failed failed; logs in $LOG_DIR"
[ $failed -eq 0 ]
