"""Training MSV verifiers and Probes on collected shards: the recipe (`MSVTrainingConfig`), the training loop
(`train_verifier`), the guard against a verifier worse than the vote, the learning-rate sweep and ``hf-msv train``.
See ``docs/training.md``."""

from ..modeling_probe import ProbeConfig, ProbeVerifier
from .cli import TrainArguments, architecture_arguments, build_train_parser, main, parse_train_args, run_training
from .config import RECIPES, MSVTrainingConfig, TrainingPlan, architecture_fields, resolve_plan
from .guard import GuardReport, calibrated_self_consistency, linear_probe_scores
from .stopping_curve import EarlyStoppingFit, fit_early_stopping
from .sweep import sweep_learning_rates
from .trainer import (
    TRACKER_PACKAGES,
    TrainingResult,
    build_verifier,
    evaluate_verifier,
    fit_stopping_rule,
    load_training_data,
    resolve_trackers,
    train_verifier,
)

__all__ = [
    "MSVTrainingConfig",
    "TrainingPlan",
    "RECIPES",
    "resolve_plan",
    "TrainingResult",
    "train_verifier",
    "resolve_trackers",
    "TRACKER_PACKAGES",
    "evaluate_verifier",
    "fit_stopping_rule",
    "fit_early_stopping",
    "EarlyStoppingFit",
    "build_verifier",
    "load_training_data",
    "GuardReport",
    "calibrated_self_consistency",
    "linear_probe_scores",
    "sweep_learning_rates",
    "ProbeConfig",
    "ProbeVerifier",
    "TrainArguments",
    "architecture_arguments",
    "architecture_fields",
    "build_train_parser",
    "parse_train_args",
    "run_training",
    "main",
]
