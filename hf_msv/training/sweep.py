"""A learning-rate sweep selected by validation Brier (the paper swept the learning rate on validation too).

    result = sweep_learning_rates("data/train", "data/val", "verifiers/msv16", MSVTrainingConfig(num_sequences=16))

Each learning rate trains a full run (its own budget and early stopping) in ``output_dir/lr-sweep/lr-<value>``; the
run with the lowest validation Brier of its kept checkpoint is copied to `output_dir`, and the whole sweep is recorded
in its ``training_log.json`` (``lr_sweep``, ``chosen_learning_rate``).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from ..utils import atomic_write_json
from .config import MSVTrainingConfig, default_learning_rate
from .trainer import TrainingResult, load_training_data, train_verifier

__all__ = ["sweep_learning_rates", "SWEEP_FACTORS"]

SWEEP_FACTORS = (1 / 3, 1.0, 3.0)
"""Default sweep: the recipe's learning rate (width-scaled) divided and multiplied by 3."""


def _is_main() -> bool:
    import os

    return int(os.environ.get("RANK", "0")) == 0


def sweep_learning_rates(
    train_dir,
    val_dir,
    output_dir,
    config: MSVTrainingConfig | None = None,
    learning_rates: Sequence[float] | None = None,
    log: Callable[[str], None] = print,
) -> TrainingResult:
    """Train one run per learning rate (body lr for MSV, `probe_learning_rate` for the Probe), keep the one with the
    lowest validation Brier in `output_dir`, and return its `TrainingResult` (``verifier`` loaded from there).

    Args:
        train_dir, val_dir, output_dir, config: as `train_verifier`.
        learning_rates: the rates to try; default the recipe's rate × `SWEEP_FACTORS`.
        log: progress lines (one before and one after each run).

    Returns:
        The best run's `TrainingResult`.
    """
    config = config or MSVTrainingConfig()
    train_set, _ = load_training_data(train_dir, val_dir, config)  # input errors before the first run
    base = default_learning_rate(config, train_set.hidden_size)
    rates = list(learning_rates) if learning_rates else [base * f for f in SWEEP_FACTORS]
    output_dir = Path(output_dir)
    field = "probe_learning_rate" if config.kind == "probe" else "learning_rate"
    rows, results = [], {}
    for i, lr in enumerate(rates, 1):
        if _is_main():
            log(f"[lr-sweep {i}/{len(rates)}] training with learning rate {lr:.2e} ...")
        run_dir = output_dir / "lr-sweep" / f"lr-{lr:.2e}"
        result = train_verifier(train_dir, val_dir, run_dir, replace(config, **{field: lr}))
        brier = result.guard.verifier["brier"] if result.guard else math.nan
        rows.append(
            {
                "learning_rate": lr,
                "val_brier": brier,
                "val_bce": result.best_metrics.get("bce", math.nan),
                "val_auroc": result.best_metrics.get("auroc", math.nan),
                "best_step": result.best_step,
                "output_dir": str(run_dir),
            }
        )
        results[lr] = result
        if _is_main():
            log(
                f"[lr-sweep {i}/{len(rates)}] learning rate {lr:.2e}: validation Brier {brier:.4f}, "
                f"BCE {rows[-1]['val_bce']:.4f}, AUROC {rows[-1]['val_auroc']:.3f} (best step {result.best_step})"
            )
    scored = [r for r in rows if not math.isnan(r["val_brier"])]
    if not scored:
        raise RuntimeError("no run of the learning-rate sweep produced a checkpoint")
    chosen = min(scored, key=lambda r: r["val_brier"])
    best = results[chosen["learning_rate"]]
    if _is_main():
        for item in Path(chosen["output_dir"]).iterdir():
            if item.is_file():
                shutil.copy2(item, output_dir / item.name)
        log_path = output_dir / "training_log.json"
        atomic_write_json(
            log_path,
            json.loads(log_path.read_text()) | {"lr_sweep": rows, "chosen_learning_rate": chosen["learning_rate"]},
        )
        log(
            f"[lr-sweep] chose learning rate {chosen['learning_rate']:.2e} (validation Brier "
            f"{chosen['val_brier']:.4f}); checkpoint in {output_dir}"
        )
    return replace(best, output_dir=str(output_dir))  # its verifier holds the same weights as the copy
