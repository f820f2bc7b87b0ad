"""The paper's experiments re-run on the testbed."""

from .pipeline import (
    ReproduceConfig,
    PAPER,
    reproduce,
    training_config,
    measure_lm_costs,
    checker_agreement,
    add_reproduce_arguments,
    reproduce_from_args,
    train_shipped_verifier,
    main,
)

__all__ = [
    "ReproduceConfig",
    "PAPER",
    "reproduce",
    "training_config",
    "measure_lm_costs",
    "checker_agreement",
    "add_reproduce_arguments",
    "reproduce_from_args",
    "train_shipped_verifier",
    "main",
]
