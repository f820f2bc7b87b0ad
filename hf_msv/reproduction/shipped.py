"""The verifier shipped in ``hf_msv/testbed/verifier`` (the demo's): a streaming MSV_16 trained on the
reproduction's shards, saved with its model card and the early-stopping λ chosen on validation."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..lambda_rule import DELTA
from .config import ReproduceConfig, training_config
from .stages import ShardReuse, collect_splits, train_or_reuse

__all__ = ["train_shipped_verifier", "fit_shipped_stopping", "SHIPPED_EPSILON", "SHIPPED_LAMBDA_FILE"]

SHIPPED_EPSILON = 0.01  # the shipped verifier's tolerance: lose at most 1 pp of full-decoding accuracy (δ = 0.1)
SHIPPED_LAMBDA_FILE = "early_stopping.json"  # beside the shipped verifier: the λ the demo uses, and how it was chosen


def train_shipped_verifier(
    work_dir=None,
    destination=None,
    threads: int | None = None,
    config: ReproduceConfig | None = None,
    device=None,
    reuse_shards: str = "matching",
    reuse_verifiers: str = "matching",
    epsilon: float = SHIPPED_EPSILON,
) -> Path:
    """The MSV shipped in ``hf_msv/testbed/verifier``: a streaming MSV_16 trained with `training_config` on the
    reproduction's train / validation shards (collected first when missing; shared with `reproduce`, whose
    ``msv16-streaming`` it is; MSV_8 on the quick configuration's 8 samples) in `work_dir` (default: the full
    reproduction's, ``ReproduceConfig.default_work_dir``). Saves weights, config, model card and the stopping rule
    fitted on validation (`fit_shipped_stopping`, also in `SHIPPED_LAMBDA_FILE`) to `destination` (default: the
    package's, for `TESTBED_VERIFIER_TASK` only). `reuse_shards` and `reuse_verifiers` as in `reproduce`."""
    import torch

    from ..collect import load_lm
    from ..hub import save_verifier
    from ..modeling_msv import MSVVerifier
    from ..testbed import TESTBED_VERIFIER_DIR, TESTBED_VERIFIER_TASK, get_task

    if threads:
        torch.set_num_threads(threads)
    # The demo pairs the package's verifier with TESTBED_VERIFIER_TASK's LM: another task's verifier goes elsewhere
    # until that constant moves with it.
    cfg = config or ReproduceConfig(task=TESTBED_VERIFIER_TASK)
    work = Path(work_dir or replace(cfg, quick=False).default_work_dir)  # the full run's shards, even quick
    if destination is None and cfg.task != TESTBED_VERIFIER_TASK:
        raise UserError(
            f"the package's verifier is paired with testbed {TESTBED_VERIFIER_TASK}'s LM "
            f"(hf_msv.testbed.TESTBED_VERIFIER_TASK); a testbed {cfg.task} verifier needs a destination, "
            f"or that constant set to {cfg.task!r} first"
        )
    data, task = work / "data", get_task(cfg.task)
    model, tokenizer = load_lm(task.lm_name, device=device)
    collect_splits(
        model,
        tokenizer,
        data,
        cfg,
        cfg.num_samples,
        (cfg.train_problems, cfg.val_problems),
        reuse=ShardReuse(policy=reuse_shards),
    )
    n = min(16, cfg.num_samples)  # 16 at the paper's sizes; the quick collection has fewer samples
    path = train_or_reuse(
        data / "train",
        data / "val",
        work / "verifiers" / f"msv{n}-streaming",
        training_config("msv", n, "streaming", cfg.quick),
        reuse=reuse_verifiers,
    )
    log = json.loads((path / "training_log.json").read_text())
    best = log["history"][log["best_epoch"]]  # `best_epoch` indexes the validation history (0 = before training)
    metrics = {k.replace("val_", "validation "): v for k, v in best.items() if k.startswith("val_")}
    destination = Path(destination or TESTBED_VERIFIER_DIR)
    shutil.rmtree(destination, ignore_errors=True)
    verifier = MSVVerifier.from_pretrained(path)
    local = verifier.config.base_model_name_or_path  # this machine's path: the card names the package's LM instead
    lm = f"hf_msv/testbed/{task.lm_dir.name}"
    verifier.config.base_model_name_or_path = f"hf_msv-{task.lm_name} ({lm})"
    training_data = log["training_data"].replace(f"`{local}`", f"the hf_msv {task.lm_name} LM (`{lm}`)")
    save_verifier(
        verifier,
        destination,
        metrics=metrics | {"step": best.get("step", best["epoch"])},
        training_data=training_data + " Reproduce with `scripts/train_shipped_verifier.sh`.",
        repo_id="hf-msv/msv16-testbed",
    )
    fit_shipped_stopping(data / "val", destination, epsilon)
    return destination


def fit_shipped_stopping(
    val_dir,
    destination=None,
    epsilon: float = SHIPPED_EPSILON,
    delta: float = DELTA,
    calibration_dir=None,
    num_chains: int | None = None,
) -> dict[str, Any]:
    """Fit the stopping rule of the verifier saved in `destination` (default: the package's): the stop head on the
    validation shards `val_dir`, λ on the calibration shards `calibration_dir` (other problems; `None`: a held-out
    half of `val_dir`'s), by `hf_msv.training.fit_stopping_rule` (the guarantee's λ when it certifies `epsilon` at
    `delta`, else λ = ∞: full decoding), at N = `num_chains` (default: the verifier's). Stores it in its config
    and in `SHIPPED_LAMBDA_FILE`, and adds the λ to its card. Returns what the file holds."""
    from ..hub import PRUNING_CARD_PREFIX
    from ..modeling_msv import MSVVerifier
    from ..testbed import TESTBED_VERIFIER_DIR
    from ..training import fit_stopping_rule

    destination = Path(destination or TESTBED_VERIFIER_DIR)
    verifier = MSVVerifier.from_pretrained(destination)
    fit = fit_stopping_rule(
        verifier, val_dir, epsilon=epsilon, delta=delta, calibration_dir=calibration_dir, num_chains=num_chains
    )
    verifier.config.save_pretrained(destination)
    for stale in destination.glob("*.py"):  # remote-code copies: save_pretrained/push_to_hub regenerate them
        stale.unlink()
    choice = fit.choice
    stopping = {
        "lambda": None if math.isinf(choice.lam) else round(choice.lam, 6),
        "num_sequences": fit.head.num_chains,
        "rule": choice.describe(),
        "head_problems": len(fit.split.head),
        "calibration_problems": len(fit.split.calibration),
        "choice": choice.to_dict(),
        "guarantee": fit.guarantee.to_dict(),
        "target": fit.target.to_dict(),
        "at_stop": fit.replay.at_stop(choice.lam),
        "stop_head": fit.head.to_dict(),
    }
    (destination / SHIPPED_LAMBDA_FILE).write_text(json.dumps(stopping, indent=2) + "\n")
    card = (destination / "README.md").read_text()
    line = f"- Early stopping (calibration problems held out from the stop head's): {choice.describe()}."
    # The config's early stopping is replaced whole (a pruning pair certified with the old λ is gone), so its lines go.
    stale = ("- Early stopping (", PRUNING_CARD_PREFIX)
    card = "\n".join(x for x in card.splitlines() if not x.startswith(stale))
    (destination / "README.md").write_text(card.rstrip() + "\n\n" + line + "\n")
    return stopping
