# Each target sets itself up (venv, CPU torch where no CUDA, the package) on first use.
SHELL := /bin/bash
VENV := .venv/bin
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test test-slow test-floor bench reproduce

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/hf-msv demo

test: setup
	$(VENV)/python -m pytest -q -x --timeout=600

test-slow: setup
	$(VENV)/python -m pytest -q -m slow --timeout=1800 || [ $$? -eq 5 ]

# The tests that touch transformers internals, against the oldest transformers pyproject.toml allows.
test-floor: setup
	bash scripts/test_floor.sh

reproduce: setup
	$(VENV)/hf-msv reproduce
