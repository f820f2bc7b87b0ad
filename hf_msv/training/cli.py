"""``hf-msv train``: flags built with `transformers.HfArgumentParser` from `TrainArguments` and `MSVTrainingConfig`
(each option declared once, with its help text).

    hf-msv train --train-dir data/train --val-dir data/val --output-dir verifiers/msv16 --num-sequences 16
    hf-msv train ... --recipe paper          # the paper's literal numbers
    hf-msv train ... --lr-sweep --strict     # sweep the learning rate; exit 1 if the verifier is worse than the vote
    hf-msv train ... --resume                # continue a fit that was interrupted in --output-dir

The last lines printed: the validation comparison with calibrated self-consistency and a linear probe, the warning
when the verifier is worse than the vote, and one JSON line (``output_dir``, ``best_step``, ``best_metrics``,
``guard``).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from .config import MSVTrainingConfig
from .trainer import TrainingResult, train_verifier

__all__ = ["TrainArguments", "build_train_parser", "run_training", "main"]


@dataclass
class TrainArguments:
    """Where the data is and what the command does besides training (the recipe is `MSVTrainingConfig`)."""

    train_dir: str = field(metadata={"help": "directory of training shards (from hf-msv collect)"})
    val_dir: str = field(metadata={"help": "directory of validation shards (checkpoint selection, the guard)"})
    output_dir: str = field(metadata={"help": "where the verifier, its model card and training_log.json go"})
    strict: bool = field(default=False, metadata={
        "help": "exit with status 1 when the verifier is worse than calibrated self-consistency on validation Brier"})
    resume: bool = field(default=False, metadata={
        "help": "continue a fit interrupted in --output-dir from its last saved cross-validation state (the same "
                "verifier as an uninterrupted fit); from the start when none was saved"})
    lr_sweep: bool = field(default=False, metadata={
        "help": "train once per learning rate (the recipe's ÷3, ×1, ×3, or --lr-sweep-values) and keep the run "
                "with the best validation Brier"})
    lr_sweep_values: list[float] | None = field(default=None, metadata={
        "help": "learning rates for --lr-sweep (MSV body, or the Probe's)"})


def build_train_parser() -> HfArgumentParser:
    return HfArgumentParser((TrainArguments, MSVTrainingConfig), prog="hf-msv train",
                            description="Train an MSV_N or a Probe on collected shards.")


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def run_training(args: TrainArguments, config: MSVTrainingConfig) -> TrainingResult:
    """Train (or sweep), print the closing lines, and exit 1 under ``--strict`` when the guard failed."""
    if args.lr_sweep and args.resume:
        raise ValueError("--resume continues one fit; --lr-sweep runs several: use one or the other")
    if args.lr_sweep:
        from .sweep import sweep_learning_rates

        result = sweep_learning_rates(args.train_dir, args.val_dir, args.output_dir, config, args.lr_sweep_values,
                                      log=lambda line: print(line, file=sys.stderr, flush=True))
    else:
        result = train_verifier(args.train_dir, args.val_dir, args.output_dir, config, resume=args.resume)
    guard = result.guard
    if _is_main():
        for line in guard.summary_lines() if guard else ["no checkpoint was saved (no training step ran)"]:
            print(line, flush=True)
        print(json.dumps({"output_dir": result.output_dir, "best_step": result.best_step,
                          "best_epoch": result.best_epoch, "best_metrics": result.best_metrics,
                          "guard_passed": bool(guard and guard.passed)}), flush=True)
    if args.strict and not (guard and guard.passed):
        raise SystemExit(1)
    return result


def main(argv: list[str] | None = None) -> TrainingResult:
    """``hf-msv train`` / ``python -m hf_msv.training``."""
    args, config = build_train_parser().parse_args_into_dataclasses(argv)
    return run_training(args, config)
