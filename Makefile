# Each target sets itself up (venv, CPU torch where no CUDA, the package) on first use.
SHELL := /bin/bash
VENV := .venv/bin
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup lint demo test test-slow test-research test-floor test-vllm lint-imports bench-smoke reproduce

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/hf-msv demo

test: setup lint
	$(VENV)/lint-imports
	$(VENV)/python -m pytest -q -x --timeout=600

test-slow: setup
	$(VENV)/python -m pytest -q -m slow --timeout=1800 || [ $$? -eq 5 ]

# The tests of the research scripts (research/tests: tiny LMs and shards, a few minutes), which the default suite
# does not collect (its testpaths are tests/).
test-research: setup
	OMP_NUM_THREADS=1 $(VENV)/python -m pytest -q -x --timeout=900 research/tests

# The tests that touch transformers internals, against the oldest transformers pyproject.toml allows.
test-floor: setup
	bash scripts/test_floor.sh

# The vLLM controller's tests, in their own environment (.venv-vllm: the CPU build of vLLM, pinned).
test-vllm: setup
	bash scripts/setup_vllm.sh
	OMP_NUM_THREADS=1 .venv-vllm/bin/python -m pytest -q -x --timeout=1200 tests/test_vllm.py tests/test_vllm_serving.py

# Code style (ruff: lint and format, pyproject.toml's [tool.ruff]) and types of the core ([tool.basedpyright]).
lint: setup
	$(VENV)/ruff check
	$(VENV)/ruff format --check
	$(VENV)/basedpyright --project pyproject.toml

# The layer contracts of pyproject.toml's [tool.importlinter].
lint-imports: setup
	$(VENV)/lint-imports

# Every benchmark's and example's quick mode on the default LM: none may rot.
bench-smoke: setup
	bash scripts/bench_smoke.sh

reproduce: setup
	$(VENV)/hf-msv reproduce
