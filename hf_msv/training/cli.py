"""``hf-msv train``: flags built with `transformers.HfArgumentParser` from `TrainArguments`, `MSVTrainingConfig` and
the MSV architecture fields of `MSVConfig` (`architecture_arguments`; each option declared once, with its help text).

    hf-msv train --train-dir data/train --val-dir data/val --output-dir verifiers/msv16 --num-sequences 16
    hf-msv train ... --recipe paper          # the paper's literal numbers
    hf-msv train ... --lr-sweep --strict     # sweep the learning rate; exit 1 if the verifier is worse than the vote
    hf-msv train ... --resume                # continue a fit that was interrupted in --output-dir
    hf-msv train ... --report-to tensorboard # per-step loss and validation metrics (output-dir/runs)
    hf-msv train ... --num-hidden-layers 2 --masks full equivalence   # MSVConfig fields: config.architecture

The last lines printed: the validation comparison with calibrated self-consistency and a linear probe, the warning
when the verifier is worse than the vote, and one JSON line (``output_dir``, ``best_step``, ``best_metrics``,
``guard``).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import sys
import types
import typing
from dataclasses import asdict, dataclass, field, make_dataclass, replace

from ..arguments import CommandParser, parse_command_args
from ..errors import UserError
from ..utils import json_safe
from .config import MSVTrainingConfig, architecture_fields
from .trainer import TRACKER_PACKAGES, TrainingResult, resolve_trackers, train_verifier

__all__ = [
    "TrainArguments",
    "architecture_arguments",
    "build_train_parser",
    "check_training_data",
    "parse_train_args",
    "run_training",
    "main",
]

# What an architecture flag left unset means when it is not MSVConfig's default.
_UNSET = {"num_attention_heads": "the base LM's, recorded at collection (the largest divisor of the width below it)"}


@dataclass
class TrainArguments:
    """Where the data is and what the command does besides training (the recipe is `MSVTrainingConfig`).

    Args:
        train_dir: directory of training shards (from ``hf-msv collect``).
        val_dir: directory of validation shards (checkpoint selection, the guard).
        output_dir: where the verifier, its model card and ``training_log.json`` go.
        strict: exit with status 1 when the verifier is worse than calibrated self-consistency on validation Brier.
        resume: continue a fit interrupted in `output_dir` from its last saved state (cross-validation, training).
        lr_sweep: train once per learning rate and keep the run with the best validation Brier.
        lr_sweep_values: the learning rates of the sweep; `None`: the recipe's ÷3, ×1, ×3.
        report_to: experiment trackers of accelerate (``none``, ``all``, or names: ``tensorboard``, ``wandb``, ...).
    """

    train_dir: str = field(metadata={"help": "directory of training shards (from hf-msv collect)"})
    val_dir: str = field(metadata={"help": "directory of validation shards (checkpoint selection, the guard)"})
    output_dir: str = field(metadata={"help": "where the verifier, its model card and training_log.json go"})
    strict: bool = field(
        default=False,
        metadata={
            "help": "exit with status 1 when the verifier is worse than calibrated self-consistency on validation "
            "Brier"
        },
    )
    resume: bool = field(
        default=False,
        metadata={
            "help": "continue a fit interrupted in --output-dir from its last saved state (of the vote "
            "cross-validation, or of training, saved at every validation): the same verifier as an uninterrupted "
            "fit; from the start when none was saved"
        },
    )
    lr_sweep: bool = field(
        default=False,
        metadata={
            "help": "train once per learning rate (the recipe's ÷3, ×1, ×3, or --lr-sweep-values) and keep the run "
            "with the best validation Brier"
        },
    )
    lr_sweep_values: list[float] | None = field(
        default=None, metadata={"help": "learning rates for --lr-sweep (MSV body, or the Probe's)"}
    )
    report_to: list[str] = field(
        default_factory=lambda: ["none"],
        metadata={
            "help": "experiment trackers (accelerate's) that receive the loss of every step and the validation "
            "metrics: none, all (every installed one), or names: "
            + ", ".join(TRACKER_PACKAGES)
            + "; file-based ones write under --output-dir/runs"
        },
    )


def _field_docs(cls) -> dict[str, str]:
    """``{name: text}`` of the ``Args:`` entries of a transformers-style docstring (``name (`type`, ...):``, then
    the text indented below it)."""
    docs, name = {}, None
    for line in inspect.cleandoc(cls.__doc__ or "").splitlines():
        entry = re.fullmatch(r" {4}(\w+) \(.*\):", line)
        if entry:
            name = entry.group(1)
            docs[name] = []
        elif name and line.startswith(" " * 8):
            docs[name].append(line.strip())
        elif line.strip():
            name = None  # the next section ("Example:")
    return {k: " ".join(v) for k, v in docs.items()}


def _flag_type(annotation) -> type:
    """The one type a flag parses for a field annotated `annotation`: without None, float for ``float | int``."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return float if float in args else args[0]


@functools.cache
def architecture_arguments() -> type:
    """A dataclass of one ``hf-msv train`` flag per `architecture_fields` entry (``--num-hidden-layers``,
    ``--masks``, ...), each `None` unless given, its help `MSVConfig`'s docstring; `parse_train_args` puts the
    given ones into `MSVTrainingConfig.architecture`. Made from `MSVConfig`: a field added there is a flag here."""
    from ..configuration_msv import MSVConfig

    docs, specs = _field_docs(MSVConfig), []
    for name, declared in architecture_fields().items():
        unset = _UNSET.get(name) or (None if declared.default is None else repr(declared.default))  # None: in docs
        text = (docs.get(name, name) + (f" Unset: {unset}." if unset else "")).replace("%", "%%")
        specs.append((name, _flag_type(declared.type) | None, field(default=None, metadata={"help": text})))
    arguments = make_dataclass("MSVArchitectureArguments", specs)
    arguments._argument_group_name = "MSV architecture (MSVConfig fields, into --architecture; a flag wins)"
    return arguments


def build_train_parser() -> CommandParser:
    """The ``hf-msv train`` parser: one flag per field of `TrainArguments`, `MSVTrainingConfig` and
    `architecture_arguments` (`parse_train_args` parses with it)."""
    return CommandParser(
        (TrainArguments, MSVTrainingConfig, architecture_arguments()),
        prog="hf-msv train",
        description="Train an MSV_N or a Probe on collected shards.",
    )


def parse_train_args(argv: list[str] | None = None) -> tuple[TrainArguments, MSVTrainingConfig]:
    """``hf-msv train``'s flags parsed into its `TrainArguments` and `MSVTrainingConfig`, the MSV architecture flags
    given put into ``config.architecture`` (over the same keys of ``--architecture``); ``--config FILE`` and
    ``--log-level`` as every command takes them (`hf_msv.arguments.parse_command_args`).

    Args:
        argv: the command-line arguments; `None`: ``sys.argv[1:]``.

    Returns:
        ``(args, config)``.
    """
    args, config, architecture = parse_command_args(build_train_parser(), argv)
    given = {k: v for k, v in asdict(architecture).items() if v is not None}
    return args, replace(config, architecture=config.architecture | given)


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def check_training_data(directory: str, flag: str) -> str | None:
    """Refuse shards a fit cannot use, before anything trains: bytes that differ from the checksums of the
    collection's ``index.json``, hidden states that are not finite (file and row named), or answers none of which is
    right (the LM solved nothing: no verifier can learn or be judged on that). Shards without a recorded checksum
    (written before checksums) are read.

    Returns:
        A warning naming the shards read unchecked, or `None`.

    Raises:
        UserError: what is wrong, with `flag` and the file.
    """
    from ..data.shards import ShardIndex, check_finite, list_shards, verify_checksums

    files = list_shards(directory)
    if not files:
        return None  # the trainer says there are no shards, as it always has
    unchecked = verify_checksums(files)
    for path in files:
        check_finite(path)
    answers = correct = 0
    for path in files:
        labels = ShardIndex(path).arrays["answer_correct"]
        answers, correct = answers + len(labels), correct + int(labels.sum())
    if answers and not correct:
        raise UserError(
            f"{flag} {directory}: none of its {answers} answers is right (the LM produced no right answers): a "
            "verifier has nothing to learn or be checked on; collect with a stronger LM, more samples or easier "
            "problems"
        )
    return f"{flag} {directory}: {len(unchecked)} shard(s) without a checksum read unchecked" if unchecked else None


def run_training(args: TrainArguments, config: MSVTrainingConfig) -> TrainingResult:
    """Train (or sweep), print the closing lines, and exit 1 under ``--strict`` when the guard failed.

    Args:
        args: the command's `TrainArguments`.
        config: the recipe.

    Returns:
        The `TrainingResult` (of the best run, when sweeping).

    Raises:
        UserError: shards `check_training_data` refuses; ``resume`` or trackers (``report_to``) together with
            ``lr_sweep``; a tracker that is unknown or not installed.
        SystemExit: under ``strict`` when the guard failed.
    """
    # The flags first (a tracker that is not installed, flags that exclude each other), then the shards.
    trackers = resolve_trackers(args.report_to)
    if args.lr_sweep and args.resume:
        raise UserError("--resume continues one fit; --lr-sweep runs several: use one or the other")
    if trackers and args.lr_sweep:
        raise UserError("--report-to follows one fit; --lr-sweep runs several: use one or the other")
    checked = [
        check_training_data(d, flag) for flag, d in (("--train-dir", args.train_dir), ("--val-dir", args.val_dir))
    ]
    for warning in filter(None, checked):  # after both checks passed: a refusal stays one line
        print(f"warning: {warning}", file=sys.stderr)
    if args.lr_sweep:
        from .sweep import sweep_learning_rates

        result = sweep_learning_rates(
            args.train_dir,
            args.val_dir,
            args.output_dir,
            config,
            args.lr_sweep_values,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    else:
        result = train_verifier(
            args.train_dir, args.val_dir, args.output_dir, config, resume=args.resume, report_to=args.report_to
        )
    guard = result.guard
    if _is_main():
        for line in guard.summary_lines() if guard else ["no checkpoint was saved (no training step ran)"]:
            print(line, flush=True)
        summary = {
            "output_dir": result.output_dir,
            "best_step": result.best_step,
            "best_epoch": result.best_epoch,
            "best_metrics": result.best_metrics,
            "guard_passed": bool(guard and guard.passed),
        }
        print(json.dumps(json_safe(summary), allow_nan=False), flush=True)  # strict JSON: an undefined metric is null
    if args.strict and not (guard and guard.passed):
        raise SystemExit(1)
    return result


def main(argv: list[str] | None = None) -> TrainingResult:
    """``hf-msv train`` / ``python -m hf_msv.training``.

    Args:
        argv: the command-line arguments; `None`: ``sys.argv[1:]``.

    Returns:
        The `TrainingResult`.
    """
    return run_training(*parse_train_args(argv))
