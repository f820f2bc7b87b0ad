#!/usr/bin/env bash
# Runs the tests that touch transformers internals against the oldest transformers that pyproject.toml allows
# (the floor: the first release with the custom_generate trust_remote_code fix, transformers PR 46483).
# The floor and the libraries whose ranges it requires (huggingface-hub < 2, tokenizers <= 0.23.0, and the `kernels`
# range of its extras: newer transformers require a kernels whose layer repositories the floor cannot build) go into
# .floor/ and shadow .venv's copies through PYTHONPATH; everything else (torch, numpy, ...) comes from .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
FLOOR=$(sed -n 's/.*"transformers>=\([0-9.]*\)[",].*/\1/p' pyproject.toml)
if [ -z "$FLOOR" ]; then echo "test_floor.sh: no \"transformers>=X\" found in pyproject.toml" >&2; exit 1; fi
target=.floor
stamp=$target/.transformers-$FLOOR
if [ ! -f "$stamp" ]; then
    rm -rf "$target"
    .venv/bin/python -m pip install -q --target "$target" "transformers==$FLOOR" "huggingface-hub<2" \
        "tokenizers<=0.23.0" 2>&1 | grep -v "is ignored" || true
    kernels=$(sed -n 's/^Requires-Dist: \(kernels[^;]*\); extra == "kernels"$/\1/p' \
        "$target/transformers-$FLOOR.dist-info/METADATA")
    if [ -n "$kernels" ]; then
        .venv/bin/python -m pip install -q --no-deps --target "$target" "$kernels" 2>&1 | grep -v "is ignored" || true
    fi
    # Keep only what .venv lacks (or must be shadowed): the four libraries and the new dependencies they bring.
    site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    for entry in "$target"/*; do
        name=$(basename "$entry")
        case "$name" in transformers*|huggingface_hub*|tokenizers*|kernels*|bin) continue ;; esac
        if [ -e "$site/$name" ]; then rm -rf "$entry"; fi
    done
    touch "$stamp"
fi
PYTHONPATH=$target .venv/bin/python -c "import transformers; assert transformers.__version__ == '$FLOOR', transformers.__version__"
PYTHONPATH=$target .venv/bin/python -m pytest -q -x --timeout=600 tests/test_generation.py tests/test_stopping.py \
    tests/test_modeling.py tests/test_hub.py tests/test_collect.py tests/test_traces.py "$@"
