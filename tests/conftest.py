"""Shared pytest fixtures."""

import pytest
import torch


@pytest.fixture(scope="module")
def single_thread():
    # Tiny matmuls on a shared 2-core machine are ~50x slower with two OpenMP threads fighting over the cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def no_debug_leak(monkeypatch):
    # `hf-msv --debug` sets HF_MSV_DEBUG in os.environ for the processes it starts; run in-process by a test, it
    # would turn every later test's user errors into tracebacks. monkeypatch restores the variable afterwards.
    monkeypatch.delenv("HF_MSV_DEBUG", raising=False)
