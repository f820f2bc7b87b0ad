"""A tiny trained testbed v2 LM (the testbed v2 LM tests and research/tests): `tiny_v2_lm`, a module-scoped pytest
fixture; a test module, or a conftest.py for a whole directory, uses it by importing it
(``from helpers.testbed import tiny_v2_lm``)."""

import pytest
import torch

from hf_msv.testbed.train_lm import LMTrainingConfig, train_testbed_lm


@pytest.fixture(scope="module")
def tiny_v2_lm(tmp_path_factory):
    """A 2-step v2 LM (d_model 32, one layer) saved by `train_testbed_lm`, and its training stats."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("lm-v2")
    config = LMTrainingConfig(
        output_dir=str(out), task="v2", steps=2, batch_size=4, d_model=32, n_layers=1, n_heads=2, warmup=1, log_every=1
    )
    stats = train_testbed_lm(config, log=lambda *_: None)
    return out, stats
