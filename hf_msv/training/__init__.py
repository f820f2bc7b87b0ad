"""Training MSV verifiers and Probes on collected shards."""

from .trainer import (
    MSVTrainingConfig,
    TrainingResult,
    train_verifier,
    evaluate_verifier,
    build_verifier,
    ProbeConfig,
    ProbeVerifier,
    add_train_arguments,
    train_from_args,
    main,
)

__all__ = [
    "MSVTrainingConfig",
    "TrainingResult",
    "train_verifier",
    "evaluate_verifier",
    "build_verifier",
    "ProbeConfig",
    "ProbeVerifier",
    "add_train_arguments",
    "train_from_args",
    "main",
]
