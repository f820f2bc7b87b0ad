"""The verifier shipped in ``hf_msv/testbed/verifier`` (the demo's): a streaming MSV_16 trained on the
reproduction's shards, saved with its model card and the early-stopping λ chosen on validation."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from .config import ReproduceConfig, training_config
from .stages import ShardReuse, collect_splits, train_or_reuse

__all__ = ["train_shipped_verifier", "shipped_lambda", "SHIPPED_LAMBDA_FILE"]


def train_shipped_verifier(work_dir=None, destination=None, threads: int | None = None,
                           config: ReproduceConfig | None = None, device=None,
                           reuse_shards: str = "matching", reuse_verifiers: str = "matching") -> Path:
    """The MSV shipped in ``hf_msv/testbed/verifier``: a streaming MSV_16 trained with `training_config` on the
    reproduction's train / validation shards (collected first when missing; shared with `reproduce`, whose
    ``msv16-streaming`` it is; MSV_8 on the quick configuration's 8 samples) in `work_dir` (default: the full
    reproduction's, ``ReproduceConfig.default_work_dir``). Saves weights, config, model card and the early-stopping λ
    chosen on validation (`shipped_lambda`, in `SHIPPED_LAMBDA_FILE`) to `destination` (default: the package's, for
    `TESTBED_VERIFIER_TASK` only). `reuse_shards` and `reuse_verifiers` as in `reproduce`."""
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
        raise ValueError(f"the package's verifier is paired with testbed {TESTBED_VERIFIER_TASK}'s LM "
                         f"(hf_msv.testbed.TESTBED_VERIFIER_TASK); a testbed {cfg.task} verifier needs a destination, "
                         f"or that constant set to {cfg.task!r} first")
    data, task = work / "data", get_task(cfg.task)
    model, tokenizer = load_lm(task.lm_name, device=device)
    collect_splits(model, tokenizer, data, cfg, cfg.num_samples, (cfg.train_problems, cfg.val_problems),
                   reuse=ShardReuse(policy=reuse_shards))
    n = min(16, cfg.num_samples)  # 16 at the paper's sizes; the quick collection has fewer samples
    path = train_or_reuse(data / "train", data / "val", work / "verifiers" / f"msv{n}-streaming",
                          training_config("msv", n, "streaming", cfg.quick), reuse=reuse_verifiers)
    log = json.loads((path / "training_log.json").read_text())
    best = log["history"][log["best_epoch"]]  # `best_epoch` indexes the validation history (0 = before training)
    metrics = {k.replace("val_", "validation "): v for k, v in best.items() if k.startswith("val_")}
    stopping = shipped_lambda(data / "val", path, n, cfg, work / "shipped-lambda")
    metrics["validation λ (early stopping)"] = stopping["lambda"]
    destination = Path(destination or TESTBED_VERIFIER_DIR)
    shutil.rmtree(destination, ignore_errors=True)
    verifier = MSVVerifier.from_pretrained(path)
    local = verifier.config.base_model_name_or_path  # this machine's path: the card names the package's LM instead
    lm = f"hf_msv/testbed/{task.lm_dir.name}"
    verifier.config.base_model_name_or_path = f"hf_msv-{task.lm_name} ({lm})"
    training_data = log["training_data"].replace(f"`{local}`", f"the hf_msv {task.lm_name} LM (`{lm}`)")
    save_verifier(verifier, destination, metrics=metrics | {"step": best.get("step", best["epoch"])},
                  training_data=training_data + " Reproduce with `scripts/train_shipped_verifier.sh`.",
                  repo_id="hf-msv/msv16-testbed")
    (destination / SHIPPED_LAMBDA_FILE).write_text(json.dumps(stopping, indent=2) + "\n")
    for stale in destination.glob("*.py"):  # remote-code copies: save_pretrained/push_to_hub regenerate them
        stale.unlink()
    return destination


SHIPPED_LAMBDA_FILE = "early_stopping.json"  # beside the shipped verifier: the λ the demo uses, and how it was chosen


def shipped_lambda(val_dir: Path, verifier_dir: Path, n: int, cfg: ReproduceConfig, output_dir: Path) -> dict:
    """The early-stopping λ of the streaming MSV_n in `verifier_dir`, chosen on the validation shards by the
    reproduction's validation rule (`hf_msv.evaluation.select_lambda_validation`: the cheapest λ whose validation
    accuracy reaches `evaluate_study`'s target fraction × the best full-decoding validation accuracy of any method at
    N = n). The evaluation split is the validation split itself: only the validation curves matter here."""
    from ..evaluation import evaluate_study
    from ..evaluation.early_stop import LatencyCosts

    name = f"MSV_{n}"
    # The rule is on tokens, so latency is not needed: zero LM costs, given explicitly (no "no costs" warning).
    res = evaluate_study(val_dir, {name: {"streaming": str(verifier_dir)}}, output_dir, [n], val_dir, bootstrap=0,
                         deepconf_window=cfg.deepconf_window, figures=False, progress=False,
                         report_name="lambda", lm_costs=LatencyCosts())
    rule = res["lambda_selection"][str(n)][name]["validation"]
    first = {k: v["values"][0] for k, v in rule.items()}  # one training seed: its values
    lam = round(first["lambda"], 6)  # the grid's value, without float noise
    return {"lambda": lam, "num_sequences": n, "target_accuracy": first["target"],
            "validation_accuracy": first["val_accuracy"], "validation_tokens": first["val_tokens"],
            "rule": f"cheapest λ whose validation accuracy reaches {res['config']['target_fraction']} × the best "
                    "full-decoding validation accuracy (hf_msv.evaluation.select_lambda_validation)",
            "validation_problems": cfg.val_problems}
