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
